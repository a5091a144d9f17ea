// Package integration drives the real Caddy binary built from xcaddy.json
// (make caddy) against real stores on loopback: a SQLite file written the
// way the sync server writes it, and a real S3-compatible server.
package integration

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/testkit"
)

// repoRoot is the module root (this package lives one level below it).

// siteGlobals is the global options block most test Caddyfiles share:
// the admin endpoint and every listener on loopback, and the server log
// at INFO in the test's directory (where the tests read it). Templates
// append their sites to it; {{ADMIN}} and {{DIR}} are filled in as in the
// rest of the template.
const siteGlobals = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log {
		level INFO
		output file {{DIR}}/server.log
	}
}

`

func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

// vectorsDir is testkit.VectorsDir: the protocol vectors, or a failed test.
func vectorsDir(t testing.TB) string { return testkit.VectorsDir(t) }

// caddyBinary is the binary `make caddy` wrote. Its absence fails the
// suite: these tests exist to exercise the real build.
func caddyBinary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("SYNCULAR_CADDY")
	if bin == "" {
		bin = filepath.Join(repoRoot(t), "bin", "caddy")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("caddy binary %s missing: run `make caddy` first (%v)", bin, err)
	}
	return bin
}

// freePort is testkit.FreePort.
func freePort(t testing.TB) int { return testkit.FreePort(t) }

// caddyProc is one running Caddy process.
type caddyProc struct {
	t         testing.TB
	dir       string
	bin       string
	cmd       *exec.Cmd
	Port      int // site port
	AdminPort int
	Base      string // http://127.0.0.1:Port
	Env       []string
	stderr    *lockedBuffer
	waitOnce  sync.Once
	waitErr   error
}

// lockedBuffer collects a process's output safely.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// s3SegmentsStore is the store block of the S3 tests' sites: bucket
// "segments" at the endpoint and with the credentials of the environment
// (S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY). Templates write it as
// {{S3_SEGMENTS}}.
const s3SegmentsStore = `store s3 {
			bucket segments
			region auto
			endpoint {env.S3_ENDPOINT}
			access_key_id {env.S3_ACCESS_KEY}
			secret_access_key {env.S3_SECRET_KEY}
		}`

// render fills {{PORT}}, {{ADMIN}}, {{DIR}} and {{S3_SEGMENTS}} in a
// Caddyfile template.
func (c *caddyProc) render(tmpl string) string {
	r := strings.NewReplacer("{{PORT}}", fmt.Sprint(c.Port), "{{ADMIN}}", fmt.Sprint(c.AdminPort), "{{DIR}}", c.dir,
		"{{S3_SEGMENTS}}", s3SegmentsStore)
	return r.Replace(tmpl)
}

// startCaddy runs `caddy run` on a Caddyfile template and waits until the
// site port answers. env adds variables (secrets go in here, never in the
// Caddyfile; {{PORT}}, {{ADMIN}} and {{DIR}} are filled in there too).
// The process is stopped when the test ends.
func startCaddy(t testing.TB, tmpl string, env ...string) *caddyProc {
	t.Helper()
	return startCaddyBin(t, caddyBinary(t), tmpl, env...)
}

// startCaddyBin is startCaddy with another binary (stock Caddy, for
// side-by-side comparisons).
func startCaddyBin(t testing.TB, bin, tmpl string, env ...string) *caddyProc {
	t.Helper()
	c := &caddyProc{t: t, dir: t.TempDir(), bin: bin, Env: env, stderr: &lockedBuffer{}}
	c.Port, c.AdminPort = freePort(t), freePort(t)
	c.Base = fmt.Sprintf("http://127.0.0.1:%d", c.Port)
	cfg := filepath.Join(c.dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(c.render(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(c.bin, "run", "--config", cfg, "--adapter", "caddyfile")
	c.cmd.Env = append(os.Environ(),
		"XDG_CONFIG_HOME="+filepath.Join(c.dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(c.dir, "data"),
		"HOME="+c.dir,
	)
	c.Env = make([]string, len(env)) // {{PORT}} etc. work in variables too
	for i, e := range env {
		c.Env[i] = c.render(e)
	}
	c.cmd.Env = append(c.cmd.Env, c.Env...)
	c.cmd.Stdout = c.stderr
	c.cmd.Stderr = c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c.exited() {
			t.Fatalf("caddy exited during start-up: %v\n%s", c.waitErr, c.stderr.String())
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", c.Port), 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %d within 30s:\n%s", bin, c.Port, c.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *caddyProc) exited() bool {
	return c.cmd.ProcessState != nil
}

// Stop ends the process (SIGTERM, then SIGKILL after 10s).
func (c *caddyProc) Stop() {
	c.waitOnce.Do(func() {
		if c.cmd.Process == nil {
			return
		}
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case c.waitErr = <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			c.waitErr = <-done
		}
	})
}

// Output is everything the process wrote to stdout and stderr so far.
func (c *caddyProc) Output() string { return c.stderr.String() }

// Dir is the process's private temp directory (logs, config).
func (c *caddyProc) Dir() string { return c.dir }

// Reload applies a new Caddyfile template through `caddy reload`.
func (c *caddyProc) Reload(tmpl string) error {
	cfg := filepath.Join(c.dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(c.render(tmpl)), 0o600); err != nil {
		return err
	}
	cmd := exec.Command(c.bin, "reload", "--config", cfg, "--adapter", "caddyfile", "--address", fmt.Sprintf("127.0.0.1:%d", c.AdminPort))
	cmd.Env = append(os.Environ(), c.Env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("caddy reload: %v: %s", err, out)
	}
	return nil
}

// client is a plain HTTP client that never follows redirects.
var client = &http.Client{
	Timeout: 30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

// response is a fully read HTTP answer.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// do sends one request and reads the whole answer; failures end the test.
func do(t testing.TB, method, url string, hdr map[string]string) response {
	t.Helper()
	r, err := try(method, url, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// try is do for goroutines other than the test's: it returns the error.
func try(method, url string, hdr map[string]string) (response, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return response{}, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s: %v", method, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, fmt.Errorf("%s: reading body: %v", method, err)
	}
	return response{res.StatusCode, res.Header, body}, nil
}

// upstream is a stand-in sync server: it answers every request with the
// path it got, so a test can tell the request reached the next handler.
func upstream(t testing.TB) (addr string, hits func() int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		w.Header().Set("X-Upstream", "sync-server")
		fmt.Fprintf(w, "upstream %s %s", r.Method, r.URL.RequestURI())
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
}
