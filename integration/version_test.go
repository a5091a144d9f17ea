package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestVersionStamped: the binary make caddy builds names this module's
// version in `caddy list-modules --versions` (scripts/version.sh's
// answer, recorded in bin/.version), not xcaddy's placeholder v0.0.0,
// and the same version is linked into internal/version for build_info.
func TestVersionStamped(t *testing.T) {
	bin := caddyBinary(t)
	out, err := exec.Command(bin, "list-modules", "--versions").CombinedOutput()
	if err != nil {
		t.Fatalf("list-modules: %v\n%s", err, out)
	}
	var got string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "http.handlers.syncular_segments" {
			got = f[1]
		}
	}
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(got) || got == "v0.0.0" {
		t.Fatalf("list-modules shows version %q for the module, want a stamped semantic version:\n%s", got, out)
	}
	if want, err := os.ReadFile(filepath.Join(filepath.Dir(bin), ".version")); err == nil && strings.TrimSpace(string(want)) != got {
		t.Errorf("list-modules shows %q, bin/.version says %q (rebuild with make caddy)", got, strings.TrimSpace(string(want)))
	}
	// The handler logs the version internal/version holds when it is
	// provisioned (debug level): stamped by -ldflags -X, it is the same.
	dir := t.TempDir()
	db, _ := seedOne(t, "tenant-version", strings.Repeat("0", 64), []byte("x"))
	cfg := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(`{
	admin off
	debug
}

http://127.0.0.1:18080 {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite `+db+`
		disable_metrics
		cache {
			disk off
		}
	}
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "validate", "--config", cfg, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "SEG_KEY="+randKey(t), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	vout, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("validate: %v\n%s", err, vout)
	}
	if !strings.Contains(string(vout), `"version":"`+got+`","version_stamped":true`) {
		t.Errorf("the provisioned handler does not log version %q (internal/version.Version not stamped):\n%s", got, vout)
	}
}
