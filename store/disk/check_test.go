package disk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckCreatesNothing: Check answers for a missing, a marked, a
// foreign and an uncreatable directory without creating or changing
// anything in any of them.
func TestCheckCreatesNothing(t *testing.T) {
	root := t.TempDir()
	missing := filepath.Join(root, "a", "segments")
	if err := Check(missing); err != nil {
		t.Fatalf("missing directory under a writable one: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Check created %s: %v", filepath.Join(root, "a"), err)
	}

	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Check(filepath.Join(file, "segments"))
	if err == nil || !strings.Contains(err.Error(), "cannot be created") || !strings.Contains(err.Error(), file+" is a file") {
		t.Fatalf("directory under a file: %v", err)
	}
	if err := Check(file); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Fatalf("a file as the directory: %v", err)
	}

	foreign := filepath.Join(root, "foreign")
	if err := os.MkdirAll(foreign, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(foreign); !errors.Is(err, ErrForeignDir) {
		t.Fatalf("foreign directory: %v, want ErrForeignDir", err)
	}
	if _, err := os.Stat(filepath.Join(foreign, MarkerName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("Check marked a foreign directory")
	}

	empty := filepath.Join(root, "empty")
	if err := os.MkdirAll(empty, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := Check(empty); err != nil {
		t.Fatalf("empty directory: %v", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Fatalf("Check wrote into an empty directory: %v", entries)
	}
	if err := Check("/etc"); !errors.Is(err, ErrForeignDir) {
		t.Fatalf("/etc: %v", err)
	}
}

// TestCheckUnwritable: a directory this process may not write fails,
// naming it (not meaningful as root, whom access(2) lets write anyway).
func TestCheckUnwritable(t *testing.T) {
	if os.Getuid() == 0 {
		t.Skip("root may write a 0500 directory; TestCheckCreatesNothing covers the uncreatable case")
	}
	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.MkdirAll(ro, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(ro, 0o700) })
	if err := Check(ro); err == nil || !strings.Contains(err.Error(), ro+" is not writable") {
		t.Fatalf("read-only directory: %v", err)
	}
	if err := Check(filepath.Join(ro, "segments")); err == nil || !strings.Contains(err.Error(), "cannot be created") {
		t.Fatalf("directory under a read-only one: %v", err)
	}
}
