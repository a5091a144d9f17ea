package integration

import (
	"os/exec"
	"regexp"
	"testing"
)

// TestDemo runs `make demo`'s program in check mode: it seeds a store,
// starts the real binary on Caddyfile.example, and verifies that the
// printed good URL downloads the segment and the bad one is refused.
func TestDemo(t *testing.T) {
	root := repoRoot(t)
	cmd := exec.Command("go", "run", "./cmd/syncular-demo", "-check", "-caddy", caddyBinary(t), "-dir", t.TempDir())
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	url := regexp.MustCompile(`(?m)^http://127\.0\.0\.1:\d+/sync/segments/sha256:[0-9a-f]{64}\?st=[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)
	if n := len(url.FindAll(out, -1)); n != 2 {
		t.Fatalf("demo printed %d signed URLs on lines of their own, want 2:\n%s", n, out)
	}
}
