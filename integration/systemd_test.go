package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnit: examples/production/caddy-syncular.service passes
// `systemd-analyze verify` with nothing to say. verify exits 0 on an
// unknown key or a bad value (it only prints "…, ignoring"), so any
// output fails the test. ExecStart must name an executable, so the unit
// is checked with /usr/bin/caddy replaced by the binary under test.
// Skipped, saying so, where systemd-analyze is not installed (Debian's
// systemd package has it).
func TestSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: apt-get install systemd); the unit was not verified")
	}
	raw, err := os.ReadFile(examplePath(t, "production", "caddy-syncular.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.ReplaceAll(string(raw), "/usr/bin/caddy ", caddyBinary(t)+" ")
	for _, want := range []string{"LimitNOFILE=", "ProtectSystem=strict", "StateDirectory=caddy", "EnvironmentFile=", "User=caddy"} {
		if !strings.Contains(unit, "\n"+want) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	p := filepath.Join(t.TempDir(), "caddy-syncular.service")
	if err := os.WriteFile(p, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", "--man=no", p)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
