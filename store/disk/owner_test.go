package disk_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/store/disk"
)

// tree is a directory's regular files (relative path → content), and its
// directories as "path/".
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			out[rel+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for rel, body := range files {
		p := filepath.Join(dir, rel)
		if strings.HasSuffix(rel, "/") {
			if err := os.MkdirAll(p, 0o750); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

func sameTree(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A directory that holds anything the cache does not write, and no
// marker, is refused with a clear error and left exactly as it was.
func TestNewRefusesForeignDirectory(t *testing.T) {
	seg := newSegment(1000, 70)
	for name, files := range map[string]map[string]string{
		"a file":                 {"photo.jpg": "jpeg"},
		"a dotfile":              {".bashrc": "alias"},
		"a foreign subdirectory": {"projects/": ""},
		// The cache's own layout, but one shard holds a foreign file.
		"a foreign file in a shard":    {seg.key[:2] + "/" + seg.key: string(seg.b), seg.key[:2] + "/readme.txt": "mine"},
		"a foreign file in tmp":        {"tmp/fill-1": "partial", "tmp/notes": "mine"},
		"a shard name that is not hex": {"zz/" + seg.key: string(seg.b)},
		"a marker that is not ours":    {disk.MarkerName: "something else\n"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, files)
			old := time.Now().Add(-24 * time.Hour)
			os.Chtimes(filepath.Join(dir, "tmp", "fill-1"), old, old) // stale if it were ours
			before := tree(t, dir)
			c, err := disk.New(disk.Options{Dir: dir})
			if err == nil {
				c.Close()
				t.Fatal("a foreign directory was accepted")
			}
			if !errors.Is(err, disk.ErrForeignDir) {
				t.Fatalf("err %v, want ErrForeignDir", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, dir) || !strings.Contains(msg, "not empty") || !strings.Contains(msg, disk.MarkerName) {
				t.Errorf("unclear message: %s", msg)
			}
			if after := tree(t, dir); !sameTree(before, after) {
				t.Fatalf("the directory changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// A directory laid out by an earlier version (no marker, only the cache's
// own names), or empty, or the root of a fresh volume, is adopted and
// marked; its files keep serving after their first verification.
func TestNewAdoptsOwnLayout(t *testing.T) {
	seg := newSegment(70_000, 71)
	gz := seg.key + "+gzip"
	for name, files := range map[string]map[string]string{
		"empty":                                 {},
		"volume root":                           {"lost+found/": ""},
		"earlier version":                       {"tmp/": "", seg.key[:2] + "/" + seg.key: string(seg.b), seg.key[:2] + "/" + gz: "not a gzip stream"},
		"earlier version with a crash leftover": {"tmp/fill-99": "partial", seg.key[:2] + "/" + seg.key: string(seg.b)},
		"marker cut short by a crash":           {disk.MarkerName: "", seg.key[:2] + "/" + seg.key: string(seg.b)},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, files)
			clk := newClock()
			leftover := filepath.Join(dir, "tmp", "fill-99")
			old := clk.Now().Add(-24 * time.Hour)
			os.Chtimes(leftover, old, old)
			c := newCache(t, disk.Options{Dir: dir, Now: clk.Now})
			b, err := os.ReadFile(filepath.Join(dir, disk.MarkerName))
			if err != nil || !strings.HasPrefix(string(b), "caddy-syncular disk tier\n") {
				t.Fatalf("marker %q, %v", b, err)
			}
			if exists(leftover) {
				t.Error("the crash leftover (the cache's own name) was kept")
			}
			if _, ok := files["lost+found/"]; ok && !exists(filepath.Join(dir, "lost+found")) {
				t.Error("lost+found was removed")
			}
			if _, ok := files[seg.key[:2]+"/"+seg.key]; ok {
				h := get(t, c, seg, noSource(t))
				mustRead(t, h, seg.b)
			} else {
				fillNow(t, c, seg)
			}
		})
	}
}

// In its own (marked) directory the cache removes only names it writes:
// a restart's sweep of stale temporary files, a smaller budget's
// evictions and a failed verification leave every other file alone.
func TestMarkedDirectoryKeepsForeignFiles(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	opts := disk.Options{Dir: dir, Now: clk.Now, FillTimeout: time.Minute}
	c, err := disk.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	segs := []segment{newSegment(10_000, 72), newSegment(10_000, 73), newSegment(10_000, 74)}
	for _, s := range segs {
		fillNow(t, c, s)
		clk.Add(2 * time.Minute)
	}
	c.Close()
	shard := segs[0].key[:2]
	foreign := map[string]string{
		"notes.txt":                        "keep",
		"tmp/upload-1":                     "keep",
		"tmp/fill-dir/":                    "",
		shard + "/readme":                  "keep",
		shard + "/" + segs[0].key + ".bak": "keep",
		"zz/" + segs[1].key:                "keep",
		"sub/" + segs[2].key:               "keep",
	}
	writeFiles(t, dir, foreign)
	old := clk.Now().Add(-time.Hour)
	for rel := range foreign {
		os.Chtimes(filepath.Join(dir, rel), old, old)
	}
	// Damage one of ours so that its verification fails and removes it.
	if err := os.WriteFile(disk.PathForTest(c, segs[2].key), make([]byte, 10_000), 0o640); err != nil {
		t.Fatal(err)
	}
	c2 := newCache(t, disk.Options{Dir: dir, Now: clk.Now, FillTimeout: time.Minute, MaxBytes: 20_000})
	if st := c2.Stats(); st.Evictions != 1 || st.Files != 2 {
		t.Fatalf("stats %+v", st)
	}
	s := segs[2]
	mustRead(t, get(t, c2, s, bytesSource(s.b, nil)), s.b) // discarded, filled again
	after := tree(t, dir)
	for rel, body := range foreign {
		if got, ok := after[rel]; !ok || got != body {
			t.Errorf("%s: removed or changed", rel)
		}
	}
	if st := c2.Stats(); st.Discarded != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A directory that becomes a foreign one while the cache waits to retry
// it is not used: the cache bypasses and writes nothing there.
func TestForeignDirectoryAtRetryIsNotUsed(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "cache")
	if err := os.WriteFile(dir, []byte("a file where the directory should be"), 0o640); err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	c := newCache(t, disk.Options{Dir: dir, Now: clk.Now, RetryInterval: time.Minute})
	os.Remove(dir)
	writeFiles(t, dir, map[string]string{"someone/else.txt": "keep"})
	before := tree(t, dir)
	clk.Add(time.Minute)
	s := newSegment(1000, 75)
	_, err := c.Get(context.Background(), idOf(s.id), 1000, noSource(t))
	if !errors.Is(err, disk.ErrUnavailable) || !errors.Is(err, disk.ErrForeignDir) {
		t.Fatalf("err %v, want a bypass matching ErrForeignDir", err)
	}
	if after := tree(t, dir); !sameTree(before, after) {
		t.Fatalf("the directory changed: %v", after)
	}
}

// System directories are refused even when empty, by name or through a
// symbolic link; a directory below one is fine.
func TestNewRefusesSystemDirectories(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	link := filepath.Join(t.TempDir(), "root")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"/", "/etc", "/usr", "/var", "/var/lib", "/home", "/root", "/tmp", "/tmp/", "/usr/../etc", os.TempDir(), home, link} {
		if !disk.SystemDir(dir) {
			t.Errorf("SystemDir(%q) = false", dir)
			continue // never let New write there
		}
		c, err := disk.New(disk.Options{Dir: dir})
		if err == nil {
			c.Close()
			t.Errorf("%s: accepted", dir)
			continue
		}
		if !errors.Is(err, disk.ErrForeignDir) || !strings.Contains(err.Error(), "system directory") {
			t.Errorf("%s: err %v", dir, err)
		}
	}
	extra := filepath.Join(t.TempDir(), "caddy-data")
	if !disk.SystemDir(extra, extra) {
		t.Error("an extra refused directory was not refused")
	}
	for _, dir := range []string{"/var/cache/caddy-syncular", filepath.Join(home, "segments"), t.TempDir()} {
		if disk.SystemDir(dir) {
			t.Errorf("SystemDir(%q) = true", dir)
		}
	}
}
