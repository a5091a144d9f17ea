package disk_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store/disk"
)

// changeInPlace rewrites the file at p with b, keeping its inode.
func changeInPlace(t *testing.T, p string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// A complete, verified file whose size, inode or modification time
// changed is never served: it is discarded and filled again, and the
// reader gets the segment's bytes.
func TestChangedFileIsRefilled(t *testing.T) {
	for name, change := range map[string]func(t *testing.T, p string, s segment){
		"grown": func(t *testing.T, p string, s segment) {
			changeInPlace(t, p, append(bytes.Clone(s.b), 'x'))
		},
		"truncated": func(t *testing.T, p string, s segment) {
			if err := os.Truncate(p, int64(len(s.b))/2); err != nil {
				t.Fatal(err)
			}
		},
		"same size, new mtime": func(t *testing.T, p string, s segment) {
			fi, _ := os.Stat(p)
			b := bytes.Clone(s.b)
			b[7] ^= 0xff
			changeInPlace(t, p, b)
			later := fi.ModTime().Add(3 * time.Second)
			os.Chtimes(p, later, later)
		},
		"only the mtime": func(t *testing.T, p string, s segment) {
			fi, _ := os.Stat(p)
			later := fi.ModTime().Add(time.Second)
			os.Chtimes(p, later, later)
		},
		// What only the change time shows: st_ctim, which user space
		// cannot set back (Linux; elsewhere a restart's re-hash sees it).
		"written in place, mtime set back": func(t *testing.T, p string, s segment) {
			if runtime.GOOS != "linux" {
				t.Skip("the change time is read on Linux only")
			}
			fi, _ := os.Stat(p)
			b := bytes.Clone(s.b)
			b[99] ^= 0xff
			changeInPlace(t, p, b)
			if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
		},
		"replaced, same size and mtime": func(t *testing.T, p string, s segment) {
			fi, _ := os.Stat(p)
			b := bytes.Clone(s.b)
			b[len(b)-1] ^= 0xff
			repl := p + ".new"
			if err := os.WriteFile(repl, b, 0o640); err != nil {
				t.Fatal(err)
			}
			os.Chtimes(repl, fi.ModTime(), fi.ModTime())
			if err := os.Rename(repl, p); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			var warned atomic.Value
			c := newCache(t, disk.Options{Warn: func(msg string, err error) { warned.Store(msg + ": " + err.Error()) }})
			s := newSegment(100_000, 80)
			fillNow(t, c, s)
			p := disk.PathForTest(c, s.key)
			change(t, p, s)
			var calls atomic.Int32
			h := get(t, c, s, bytesSource(s.b, &calls))
			if h.Hit() || calls.Load() != 1 {
				t.Fatalf("the changed file was served (hit %v, fills %d)", h.Hit(), calls.Load())
			}
			mustRead(t, h, s.b)
			st := c.Stats()
			if st.Discarded != 1 || st.Fills != 2 {
				t.Fatalf("stats %+v", st)
			}
			if w, _ := warned.Load().(string); !strings.Contains(w, "changed since it was verified") {
				t.Errorf("warning %q", w)
			}
			// The refilled file is served again.
			h = get(t, c, s, noSource(t))
			if !h.Hit() {
				t.Fatal("the refilled file is not a hit")
			}
			mustRead(t, h, s.b)
		})
	}
}

// A file that fails its re-hash is unlinked after the index lock is
// released, and by then a new fill of the same segment may have renamed
// its verified file into the same name. The unlink must take the old file
// only: here it is held back until the refill has committed, and the
// refilled file must then still be served from disk.
func TestDiscardNeverUnlinksTheRefill(t *testing.T) {
	dir := t.TempDir()
	c, err := disk.New(disk.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	s := newSegment(100_000, 85)
	fillNow(t, c, s)
	p := disk.PathForTest(c, s.key)
	b := bytes.Clone(s.b)
	b[5] ^= 0xff
	changeInPlace(t, p, b)
	c.Close()

	c2 := newCache(t, disk.Options{Dir: dir})
	release := make(chan struct{})
	var freed sync.Once
	free := func() { freed.Do(func() { close(release) }) }
	t.Cleanup(free) // before c2's Close, which waits for the held unlink
	held := make(chan string, 1)
	var once sync.Once
	disk.SetRemoveHookForTest(c2, func(path string) {
		once.Do(func() {
			held <- path
			<-release
		})
	})
	var calls atomic.Int32
	h := get(t, c2, s, bytesSource(s.b, &calls))
	mustRead(t, h, s.b) // the refill is committed: its last byte was served
	h.Close()
	if calls.Load() != 1 {
		t.Fatalf("fills: %d", calls.Load())
	}
	var unlinked string
	select {
	case unlinked = <-held: // the verification's unlink, after the refill committed
	case <-time.After(10 * time.Second):
		t.Fatal("the corrupted file was not removed")
	}
	free()
	c2.Close() // waits for the verification's removal
	if unlinked == p {
		t.Errorf("the discarded file is unlinked by its served name %s", p)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, s.b) {
		t.Fatalf("after the discard's unlink the refill is gone or wrong (err %v)", err)
	}
	c3 := newCache(t, disk.Options{Dir: dir})
	h = get(t, c3, s, noSource(t))
	mustRead(t, h, s.b)
	if left, _ := os.ReadDir(dir + "/tmp"); len(left) != 0 {
		t.Errorf("tmp/ holds %d files after the restart", len(left))
	}
}

// The cache's own touch (the recency it writes into the mtime) never
// makes a concurrent hit discard the file, and a change after a touch is
// still seen.
func TestTouchIsNotAChange(t *testing.T) {
	clk := newClock()
	c := newCache(t, disk.Options{Now: clk.Now})
	s := newSegment(50_000, 82)
	fillNow(t, c, s)
	for range 5 {
		clk.Add(2 * time.Minute) // every round's first hit touches the file
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), noSource(t))
				if err != nil {
					t.Error(err)
					return
				}
				defer h.Close()
				if !h.Hit() {
					t.Error("not a hit")
				}
				b, err := io.ReadAll(must(h.Reader(context.Background(), 0, -1)))
				if err != nil || !bytes.Equal(b, s.b) {
					t.Errorf("read: %v", err)
				}
			}()
		}
		wg.Wait()
	}
	if st := c.Stats(); st.Discarded != 0 || st.Hits != 40 {
		t.Fatalf("stats %+v", st)
	}
	fi, _ := os.Stat(disk.PathForTest(c, s.key))
	if !fi.ModTime().Equal(clk.Now()) {
		t.Fatalf("mtime %v, want the last touch %v", fi.ModTime(), clk.Now())
	}
	later := fi.ModTime().Add(time.Second)
	os.Chtimes(disk.PathForTest(c, s.key), later, later)
	var calls atomic.Int32
	mustRead(t, get(t, c, s, bytesSource(s.b, &calls)), s.b)
	if calls.Load() != 1 {
		t.Fatal("a change after a touch was served")
	}
}

// A file verified after a restart is stamped as it was hashed: a later
// change is seen.
func TestChangeAfterRestartVerification(t *testing.T) {
	dir := t.TempDir()
	c, _ := disk.New(disk.Options{Dir: dir})
	s := newSegment(60_000, 83)
	fillNow(t, c, s)
	c.Close()
	c2 := newCache(t, disk.Options{Dir: dir})
	mustRead(t, get(t, c2, s, noSource(t)), s.b) // hashed, then served
	if err := os.Truncate(disk.PathForTest(c2, s.key), 10); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	mustRead(t, get(t, c2, s, bytesSource(s.b, &calls)), s.b)
	if calls.Load() != 1 || c2.Stats().Discarded != 1 {
		t.Fatalf("fills %d, stats %+v", calls.Load(), c2.Stats())
	}
}

// A verified variant file that changed is discarded like an identity file.
func TestChangedVariantIsDiscarded(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := compressible(300_000, 84)
	fillNow(t, c, s)
	c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip) // starts the build
	if _, st := waitVariant(t, c, s, compress.Gzip); st != disk.VariantReady {
		t.Fatalf("state %d, want ready", st)
	}
	p := disk.PathForTest(c, s.key) + "+gzip"
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	later := fi.ModTime().Add(time.Hour)
	os.Chtimes(p, later, later)
	if h, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip); st == disk.VariantReady {
		h.Close()
		t.Fatal("a changed variant file was served")
	}
	if c.Stats().Discarded != 1 || exists(p) {
		t.Fatalf("stats %+v, file kept %v", c.Stats(), exists(p))
	}
}
