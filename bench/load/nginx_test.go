package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The nginx peer serves a file only behind its own valid secure link,
// runs as this process's child with its files in the run's directory, and
// is gone after cleanup. Needs Debian's nginx (make unit and make bench install it).
func TestNginxPeer(t *testing.T) {
	if _, err := nginxBinary(); err != nil {
		t.Skipf("%v: the peer is measured only where nginx is installed", err)
	}
	dir := t.TempDir()
	www := filepath.Join(dir, "www")
	id := "sha256:" + "ab12"
	body := make([]byte, 300<<10)
	rand.Read(body)
	if err := os.MkdirAll(filepath.Join(www, "sync", "segments"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(www, "sync", "segments", id), body, 0o644); err != nil {
		t.Fatal(err)
	}
	e := &env{dir: dir}
	p, err := e.startNginx("nginx-test", www)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	exp := time.Now().Add(time.Hour)
	if err := waitHTTP(p.proc, p.url(id, exp)); err != nil {
		t.Fatal(err)
	}
	get := func(u string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	if code, b := get(p.url(id, exp)); code != 200 || !bytes.Equal(b, body) {
		t.Fatalf("valid link: %d, %d bytes", code, len(b))
	}
	if code, _ := get(p.badURL(id, exp)); code != 403 {
		t.Fatalf("wrong link: %d, want 403", code)
	}
	if code, _ := get(p.url(id, time.Now().Add(-time.Minute))); code != 410 {
		t.Fatalf("expired link: %d, want 410", code)
	}
	if code, _ := get(p.url("sha256:other", exp)); code != 404 {
		t.Fatalf("link for a missing file: %d, want 404", code)
	}
	// A link is for one URL: id's link on another path is refused.
	u, other := p.url(id, exp), p.url("sha256:other", exp)
	if code, _ := get(other[:strings.Index(other, "?")] + u[strings.Index(u, "?"):]); code != 403 {
		t.Fatalf("another URL's link: %d, want 403", code)
	}
	// Its CPU time counts the workers, which do the serving.
	master, err := procCPU(p.pid())
	if err != nil {
		t.Fatal(err)
	}
	if cpu, err := p.cpu(); err != nil || cpu < master {
		t.Fatalf("nginx CPU (master and workers) %v s, master alone %v s: %v", cpu, master, err)
	}
	pid := strconv.Itoa(p.pid())
	children, err := os.ReadFile(filepath.Join("/proc", pid, "task", pid, "children"))
	if err != nil || len(bytes.Fields(children)) == 0 {
		t.Fatalf("no nginx workers under the master: %q %v", children, err)
	}
	cleanup()
	if err := syscall.Kill(p.pid(), 0); err == nil {
		t.Fatalf("nginx master %d still running after cleanup", p.pid())
	}
	for _, w := range bytes.Fields(children) {
		wpid, _ := strconv.Atoi(string(w))
		for i := 0; syscall.Kill(wpid, 0) == nil; i++ {
			if i == 100 {
				t.Fatalf("nginx worker %d still running 5 s after cleanup", wpid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
