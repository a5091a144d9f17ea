package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// TestExamplesBareEnvAndTimeouts: every committed example config adapts
// with no SYNCULAR_* variable set (its {$VAR:default}s and runtime
// {env.*} placeholders are enough to adapt), every HTTP server it
// defines has the four server timeouts (each example faces clients, or
// sits behind a front that does), and every S3 store uses the prefix of
// the docs and the demo (syncular/).
func TestExamplesBareEnvAndTimeouts(t *testing.T) {
	bin := caddyBinary(t)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SYNCULAR_") {
			env = append(env, kv)
		}
	}
	env = append(env, "HOME="+t.TempDir())
	n := 0
	for _, ex := range exampleConfigs(t) {
		if ex.lang != "caddyfile" {
			continue // caddy.json is the production Caddyfile adapted (TestProductionJSONMatchesCaddyfile)
		}
		n++
		t.Run(ex.where, func(t *testing.T) {
			cmd := exec.Command(bin, "adapt", "--config", filepath.Join(repoRoot(t), ex.where), "--adapter", "caddyfile")
			cmd.Env = env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("adapt with no SYNCULAR_* set: %v\n%s", err, stderr.String())
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
			if len(cfg.Apps.HTTP.Servers) == 0 {
				t.Fatal("no HTTP server")
			}
			for name, srv := range cfg.Apps.HTTP.Servers {
				for _, k := range []string{"read_header_timeout", "read_timeout", "write_timeout", "idle_timeout"} {
					if srv[k] == nil {
						t.Errorf("server %s has no %s: set servers { timeouts { ... } } as Caddyfile.example does", name, k)
					}
				}
			}
			var raw any
			if err := json.Unmarshal(out, &raw); err != nil {
				t.Fatal(err)
			}
			for _, s3 := range s3Stores(raw) {
				if s3["prefix"] != examplePrefix {
					t.Errorf("S3 store of bucket %v has prefix %q, want %q (the docs' and demo's)", s3["bucket"], s3["prefix"], examplePrefix)
				}
			}
		})
	}
	if n < 7 {
		t.Fatalf("only %d example Caddyfiles found", n)
	}
}

// s3Stores finds the "s3" objects of syncular_segments stores in an
// adapted config.
func s3Stores(v any) []map[string]any {
	var out []map[string]any
	switch v := v.(type) {
	case map[string]any:
		if v["backend"] == "s3" {
			if s3, ok := v["s3"].(map[string]any); ok {
				out = append(out, s3)
			}
		}
		for _, c := range v {
			out = append(out, s3Stores(c)...)
		}
	case []any:
		for _, c := range v {
			out = append(out, s3Stores(c)...)
		}
	}
	return out
}
