package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/s3test"
)

// TestDemo runs `make demo`'s program in check mode: it seeds a store,
// starts the real binary on Caddyfile.example, and verifies that the
// printed good URL downloads the segment and the bad one is refused, that
// the admin /metrics carries caddy_syncular_* series for those requests,
// and that the printed inspect command accepts the good token and
// refuses the other (both run through bash with keys.env).
func TestDemo(t *testing.T) {
	runDemo(t, 2)
}

// TestDemoS3 is `make demo-s3` in check mode: a real versitygw bucket
// written as the reference writes it, a redirect site (302 to a presigned
// GET, followed to the bytes) and a proxy site, metrics with two server
// labels, and the inspect command against examples/demo-s3.Caddyfile.
func TestDemoS3(t *testing.T) {
	runDemo(t, 3, "-s3", "-versitygw", s3test.Binary(t))
}

func runDemo(t *testing.T, signedURLs int, args ...string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", append([]string{"run", "./cmd/syncular-demo", "-check", "-caddy", caddyBinary(t), "-dir", dir}, args...)...)
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	url := regexp.MustCompile(`(?m)^http://127\.0\.0\.1:\d+/sync/segments/sha256:[0-9a-f]{64}\?st=[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)
	if n := len(url.FindAll(out, -1)); n != signedURLs {
		t.Fatalf("demo printed %d signed URLs on lines of their own, want %d:\n%s", n, signedURLs, out)
	}
	if !regexp.MustCompile(`(?m)^Cache-Status of a second download: caddy-syncular; hit; detail=memory$`).Match(out) {
		t.Errorf("demo printed no Cache-Status line of a memory hit:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^http://127\.0\.0\.1:\d+/metrics$`).Match(out) {
		t.Errorf("demo printed no metrics URL on a line of its own:\n%s", out)
	}
	keys := filepath.Join(dir, "keys.env")
	inspect := regexp.MustCompile(`(?m)^\(set -a; \. ` + regexp.QuoteMeta(keys) + `; \S+ syncular-token inspect --config \S+ --partition \S+ 'http://\S+'\)$`)
	if !inspect.Match(out) {
		t.Errorf("demo printed no inspect command line:\n%s", out)
	}
	fi, err := os.Stat(keys)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("keys.env mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"SYNCULAR_SEGMENT_KEY", "SYNCULAR_AUDIENCE_KEY"} {
		// 32 random bytes, hex: 64 characters.
		if !regexp.MustCompile(`(?m)^export ` + name + `='[0-9a-f]{64}'$`).Match(b) {
			t.Errorf("keys.env has no 32-byte %s", name)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "export SYNCULAR_") {
			t.Errorf("keys.env line %q is not an export of a SYNCULAR_ variable", line)
		}
	}
	// The keys never reach the demo's output.
	for _, m := range regexp.MustCompile(`(?m)^export SYNCULAR_\w*KEY\w*='([^']+)'$`).FindAllSubmatch(b, -1) {
		if strings.Contains(string(out), string(m[1])) {
			t.Errorf("demo output contains a key from keys.env")
		}
	}
}
