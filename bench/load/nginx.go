package main

// nginx as a peer of the edge in (a) and (e): Debian's nginx serving the
// same bytes from a file under the same URL path, with `sendfile on` and
// an MD5 secure link checked on every request (a token per URL, as the
// edge checks its own), run as a foreground child of this process on
// 127.0.0.1 with its prefix, configuration, logs and temporary
// directories in the run's temporary directory (never the system
// service), stopped with the scenario.

import (
	"crypto/md5"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

var flagNginx = flag.String("nginx", "", "nginx binary, the peer of (a) and (e) (default: nginx on PATH, else /usr/sbin/nginx)")

// nginxBinary is -nginx, or nginx where Debian puts it.
func nginxBinary() (string, error) {
	if *flagNginx != "" {
		return *flagNginx, nil
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("nginx not found (run `make bench`, which installs it, or pass -nginx)")
}

// needsNginx reports whether the selected scenarios run nginx.
func needsNginx(todo []scenario) bool {
	for _, s := range todo {
		if s.id == "a" || s.id == "e" {
			return true
		}
	}
	return false
}

// nginxPeer is a running nginx.
type nginxPeer struct {
	*proc
	port   int
	secret string
}

// nginxConf is the whole configuration: foreground, workers as many as
// the CPUs it may use (nginxWorkers), no access log (the edge sites keep none either), keep-alive
// connections not cut after 1,000 requests (Caddy does not cut them),
// sendfile as Debian's default configuration has it, and the segments
// path answered only with a valid, unexpired secure link.
const nginxConf = `daemon off;
master_process on;
worker_processes %[6]s;
%[1]s
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events {
	worker_connections 4096;
}
http {
	access_log off;
	sendfile on;
	tcp_nopush on;
	keepalive_requests 1000000;
	default_type application/octet-stream;
	types {}
	client_body_temp_path %[2]s/tmp/body;
	proxy_temp_path %[2]s/tmp/proxy;
	fastcgi_temp_path %[2]s/tmp/fastcgi;
	uwsgi_temp_path %[2]s/tmp/uwsgi;
	scgi_temp_path %[2]s/tmp/scgi;
	server {
		listen 127.0.0.1:%[3]d;
		root %[4]s;
		location /sync/segments/ {
			secure_link $arg_md5,$arg_expires;
			secure_link_md5 "$secure_link_expires$uri %[5]s";
			if ($secure_link = "") {
				return 403;
			}
			if ($secure_link = "0") {
				return 410;
			}
		}
		location / {
			return 404;
		}
	}
}
`

// startNginx runs nginx serving root (whose sync/segments/<id> files the
// edge also serves) on a free port.
func (e *env) startNginx(name, root string) (*nginxPeer, error) {
	bin, err := nginxBinary()
	if err != nil {
		return nil, err
	}
	prefix := filepath.Join(e.dir, name)
	for _, d := range []string{"tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi", "logs"} {
		if err := os.MkdirAll(filepath.Join(prefix, d), 0o700); err != nil {
			return nil, err
		}
	}
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	// A master started as root runs its workers as `nobody`, who cannot
	// enter the run's private temporary directory: they run as this
	// user instead.
	userLine := ""
	if os.Geteuid() == 0 {
		u, err := user.Current()
		if err != nil {
			return nil, err
		}
		g, err := user.LookupGroupId(u.Gid)
		if err != nil {
			return nil, err
		}
		userLine = fmt.Sprintf("user %s %s;", u.Username, g.Name)
	}
	port := freePort()
	p := &nginxPeer{port: port, secret: hex.EncodeToString(secret)}
	conf := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, userLine, prefix, port, root, p.secret, nginxWorkers())), 0o600); err != nil {
		return nil, err
	}
	// -e: the error log before the configuration is read (Debian's
	// build would otherwise open stderr, which is fine, or a system path).
	p.proc, err = start(name, bin, []string{"-p", prefix + "/", "-c", conf, "-e", filepath.Join(prefix, "error.log")}, nil, e.dir)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// url is id's URL on p with a secure link valid until exp: the MD5 of
// "<expires><uri> <secret>", base64url without padding.
func (p *nginxPeer) url(id string, exp time.Time) string {
	uri := "/sync/segments/" + id
	expires := strconv.FormatInt(exp.Unix(), 10)
	sum := md5.Sum([]byte(expires + uri + " " + p.secret))
	return fmt.Sprintf("http://127.0.0.1:%d%s?md5=%s&expires=%s", p.port, uri,
		base64.RawURLEncoding.EncodeToString(sum[:]), url.QueryEscape(expires))
}

// badURL is id's URL with a wrong link: nginx must refuse it.
func (p *nginxPeer) badURL(id string, exp time.Time) string {
	u := p.url(id, exp)
	i := strings.Index(u, "md5=") + len("md5=")
	c := byte('A')
	if u[i] == 'A' {
		c = 'B'
	}
	return u[:i] + string(c) + u[i+1:]
}

// cpu is the CPU time of nginx: the master and its workers.
func (p *nginxPeer) cpu() (float64, error) {
	return treeCPU(p.pid())
}

// treeCPU is the user+system CPU time of pid and its children, in
// seconds (the children that are running: nginx's workers live as long
// as the master).
func treeCPU(pid int) (float64, error) {
	total, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, err
	}
	for _, f := range strings.Fields(string(b)) {
		child, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		c, err := procCPU(child)
		if err != nil {
			continue // exited meanwhile
		}
		total += c
	}
	return total, nil
}

// checkNginx checks that p answers the right link with the bytes of the
// edge's URL and refuses a wrong one.
func checkNginx(p *nginxPeer, id, edgeURL string) error {
	exp := time.Now().Add(time.Hour)
	if err := waitHTTP(p.proc, p.url(id, exp)); err != nil {
		return err
	}
	if err := sameBody(edgeURL, p.url(id, exp)); err != nil {
		return fmt.Errorf("nginx: %w", err)
	}
	resp, err := http.Get(p.badURL(id, exp))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		return fmt.Errorf("nginx answered %d to a wrong secure link, want 403", resp.StatusCode)
	}
	return nil
}

// nginxWorkers is worker_processes: with -pin, as many as the server
// CPUs (nginx's "auto" counts the host's CPUs, not the ones taskset
// allows it, and 16 workers on 2 CPUs measure their contention); without,
// "auto".
func nginxWorkers() string {
	if n := cpuCount(serverCPUs()); n > 0 {
		return strconv.Itoa(n)
	}
	return "auto"
}
