package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// serverTimeouts adapts a committed Caddyfile with the real binary and
// returns the timeouts of each of its HTTP servers.
func serverTimeouts(t *testing.T, path string) map[string]map[string]any {
	t.Helper()
	cmd := exec.Command(caddyBinary(t), "adapt", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("adapt %s: %v", path, err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]map[string]any `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]any{}
	for name, srv := range cfg.Apps.HTTP.Servers {
		got[name] = map[string]any{}
		for _, k := range []string{"read_header_timeout", "read_timeout", "write_timeout", "idle_timeout"} {
			got[name][k] = srv[k]
		}
	}
	if len(got) == 0 {
		t.Fatalf("%s adapts to no HTTP server", path)
	}
	return got
}

// TestExampleTimeouts: Caddyfile.example's servers have the production
// example's timeouts, and the running example drops a client that never
// finishes its request headers (slowloris) instead of keeping its
// connection for Caddy's default minute.
func TestExampleTimeouts(t *testing.T) {
	prod := serverTimeouts(t, examplePath(t, "production", "Caddyfile"))
	want := prod["srv0"]
	if want == nil || want["read_header_timeout"] == nil || want["write_timeout"] == nil {
		t.Fatalf("production example has no server timeouts: %v", prod)
	}
	for name, got := range serverTimeouts(t, filepath.Join(repoRoot(t), "Caddyfile.example")) {
		for k, v := range want {
			if got[k] != v {
				t.Errorf("Caddyfile.example server %s: %s is %v, the production example's is %v", name, k, got[k], v)
			}
		}
	}

	db, _ := seedOne(t, "tenant-timeouts", "0000000000000000000000000000000000000000000000000000000000000000", []byte("x"))
	segKey, _ := exampleKey(t)
	audKey, _ := exampleKey(t)
	port, addr := loopback(t)
	_, admin := loopback(t)
	startConfig(t, filepath.Join(repoRoot(t), "Caddyfile.example"), "caddyfile", []string{
		"SYNCULAR_SEGMENT_KEY=" + segKey, "SYNCULAR_AUDIENCE_KEY=" + audKey,
		"SYNCULAR_DB=" + db, fmt.Sprintf("SYNCULAR_SITE_ADDRESS=:%d", port), "SYNCULAR_ADMIN=" + admin,
		"SYNCULAR_UPSTREAM=" + deadAddr(t), "SYNCULAR_ACCESS_LOG=" + filepath.Join(t.TempDir(), "access.log"),
	}, addr)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	// A request line and half a header, then nothing.
	if _, err := conn.Write([]byte("GET /sync/segments/x HTTP/1.1\r\nHost: edge\r\nX-Slow: a")); err != nil {
		t.Fatal(err)
	}
	// read_header 10s: the server gives up on the headers and closes. A
	// generous bound, well under Caddy's default of one minute.
	_ = conn.SetReadDeadline(time.Now().Add(40 * time.Second))
	buf := make([]byte, 512)
	for {
		_, err := conn.Read(buf)
		if err == nil {
			continue // a 408 or 400 answer before the close is fine
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("a client stalled in its headers still holds its connection after %v", time.Since(start).Round(time.Second))
		}
		break // closed by the server
	}
	if d := time.Since(start); d < 5*time.Second {
		t.Fatalf("connection closed after %v, before read_header could have expired: not the timeout", d)
	}
}
