package version

import "testing"

func TestGetPrefersStampedVersion(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v1.2.3"
	if got := Get(); got != "v1.2.3" {
		t.Fatalf("Get() = %q with Version stamped v1.2.3", got)
	}
	Version = ""
	if got := Get(); got == "" {
		t.Fatal("Get() is empty without a stamp; want the build information's version or (devel)")
	}
}
