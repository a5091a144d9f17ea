package disk_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store/disk"
)

// compressible is a segment of text-like rows that shrinks well.
func compressible(n int, seed int) segment {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "row %d seed %d: the quick brown fox %d\n", i, seed, i*7%13)
	}
	return segmentOf(b.Bytes()[:n])
}

func decode(t *testing.T, c compress.Coding, b []byte) []byte {
	t.Helper()
	var r io.Reader
	switch c {
	case compress.Gzip:
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case compress.Zstd:
		zr, err := zstd.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("decode %s: %v", c, err)
	}
	return out
}

// readyVariant fills s, waits for its coding variant to be ready and
// returns its bytes, checked to decode to the segment.
func readyVariant(t *testing.T, c *disk.Cache, s segment, coding compress.Coding) []byte {
	t.Helper()
	fillNow(t, c, s)
	h, st := waitVariant(t, c, s, coding)
	if st != disk.VariantReady {
		t.Fatalf("%s variant: state %d, want ready", coding, st)
	}
	got, _ := readRange(t, h, 0, -1)
	if !bytes.Equal(decode(t, coding, got), s.b) {
		t.Fatalf("%s variant does not decode to the segment", coding)
	}
	return got
}

// waitVariant polls Variant until it is no longer building (bounded).
func waitVariant(t *testing.T, c *disk.Cache, s segment, coding compress.Coding) (*disk.Handle, disk.VariantState) {
	t.Helper()
	for range 1000 {
		h, st := c.Variant(idOf(s.id), int64(len(s.b)), coding)
		if st != disk.VariantBuilding {
			if h != nil {
				t.Cleanup(func() { h.Close() })
			}
			return h, st
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("variant still building after 10 s")
	return nil, 0
}

func TestVariantBuiltOnceUnderConcurrency(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, disk.Options{Dir: dir})
	s := compressible(600_000, 1)
	if _, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip); st != disk.VariantUnavailable {
		t.Fatalf("before the identity file exists: state %d, want unavailable", st)
	}
	fillNow(t, c, s)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip)
			if h != nil {
				h.Close()
			}
			if st == disk.VariantNotWorth {
				t.Errorf("state not worth for a compressible segment")
			}
		}()
	}
	wg.Wait()
	h, st := waitVariant(t, c, s, compress.Gzip)
	if st != disk.VariantReady {
		t.Fatalf("state %d, want ready", st)
	}
	got, err := readRange(t, h, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != h.Size() || h.Size() >= int64(len(s.b)) {
		t.Fatalf("variant %d bytes, handle size %d, identity %d", len(got), h.Size(), len(s.b))
	}
	if !bytes.Equal(decode(t, compress.Gzip, got), s.b) {
		t.Fatal("variant does not decode to the segment")
	}
	if h.File() == nil {
		t.Fatal("a ready variant is not a complete file")
	}
	for range 5 { // later calls are hits, not builds
		h, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip)
		if st != disk.VariantReady {
			t.Fatalf("state %d on a later call", st)
		}
		h.Close()
	}
	st2 := c.Stats()
	if st2.VariantsMade != 1 {
		t.Fatalf("VariantsMade = %d, want 1", st2.VariantsMade)
	}
	if want := int64(len(s.b)) + h.Size(); st2.Bytes != want || st2.Files != 2 || st2.Reserved != 0 {
		t.Fatalf("budget: bytes %d files %d reserved %d, want %d, 2, 0", st2.Bytes, st2.Files, st2.Reserved, want)
	}
	if !exists(disk.PathForTest(c, s.key+"+gzip")) {
		t.Fatal("variant file not at <hex>+gzip")
	}
	if n := len(tmpFiles(t, dir)); n != 0 {
		t.Fatalf("tmp files: %d", n)
	}
}

func TestVariantZstd(t *testing.T) {
	s := compressible(400_000, 2)
	c := newCache(t, disk.Options{})
	readyVariant(t, c, s, compress.Zstd)
	if !exists(disk.PathForTest(c, s.key+"+zstd")) {
		t.Fatal("variant file not at <hex>+zstd")
	}
}

func TestVariantNeedsRoomInTheBudget(t *testing.T) {
	s, other := compressible(400_000, 8), compressible(300_000, 9)
	// Room for the identity file and a build's reservation (its size)
	// only once the other file is evicted; never by evicting the
	// identity file itself.
	c := newCache(t, disk.Options{MaxBytes: 900_000})
	fillNow(t, c, other)
	fillNow(t, c, s)
	h, st := waitVariant(t, c, s, compress.Gzip)
	if st != disk.VariantReady {
		t.Fatalf("state %d, want ready", st)
	}
	h.Close()
	if exists(disk.PathForTest(c, other.key)) || !exists(disk.PathForTest(c, s.key)) {
		t.Fatal("the build evicted the wrong file")
	}
	if st := c.Stats(); st.Bytes > 900_000 || st.Reserved != 0 || st.Evictions != 1 {
		t.Fatalf("budget: %+v", st)
	}

	small := newCache(t, disk.Options{MaxBytes: 500_000})
	fillNow(t, small, s)
	for range 3 {
		if h, st := small.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip); st != disk.VariantUnavailable || h != nil {
			t.Fatalf("no room beside the identity file: state %d, want unavailable", st)
		}
	}
	if st := small.Stats(); st.Evictions != 0 || st.Files != 1 || st.Reserved != 0 || st.VariantsMade != 0 {
		t.Fatalf("a build that did not fit changed the cache: %+v", st)
	}
}

func TestVariantCorruptedNeverKept(t *testing.T) {
	c := newCache(t, disk.Options{})
	disk.SetVariantHookForTest(c, func(f *os.File) error {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		b := make([]byte, 1)
		off := fi.Size() / 2
		if _, err := f.ReadAt(b, off); err != nil {
			return err
		}
		b[0] ^= 0x55
		_, err = f.WriteAt(b, off)
		return err
	})
	s := compressible(300_000, 4)
	fillNow(t, c, s)
	for _, coding := range []compress.Coding{compress.Gzip, compress.Zstd} {
		if h, st := waitVariant(t, c, s, coding); st != disk.VariantNotWorth || h != nil {
			t.Fatalf("%s: state %d, want not worth (rejected)", coding, st)
		}
		if exists(disk.PathForTest(c, s.key+"+"+coding.String())) {
			t.Fatalf("%s: a corrupted variant was kept", coding)
		}
	}
	st := c.Stats()
	if st.VariantsRejected != 2 || st.VariantsMade != 0 || st.Files != 1 || st.Reserved != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestVariantIncompressibleRemembered(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(300_000, 5) // random bytes
	fillNow(t, c, s)
	if _, st := waitVariant(t, c, s, compress.Gzip); st != disk.VariantNotWorth {
		t.Fatalf("state %d, want not worth", st)
	}
	for range 3 {
		if _, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip); st != disk.VariantNotWorth {
			t.Fatalf("state %d on a later call, want not worth", st)
		}
	}
	st := c.Stats()
	if st.VariantsIncompressible != 1 || st.VariantsMade != 0 || st.Files != 1 || st.Reserved != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestVariantRestartReverifies(t *testing.T) {
	dir := t.TempDir()
	good, bad := compressible(300_000, 6), compressible(300_000, 7)
	c, err := disk.New(disk.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []segment{good, bad} {
		fillNow(t, c, s)
		if _, st := waitVariant(t, c, s, compress.Gzip); st != disk.VariantReady {
			t.Fatalf("state %d, want ready", st)
		}
	}
	c.Close()
	// Bit rot in one variant file, same size.
	p := disk.PathForTest(c, bad.key+"+gzip")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o640); err != nil {
		t.Fatal(err)
	}

	c2 := newCache(t, disk.Options{Dir: dir})
	if st := c2.Stats(); st.Files != 4 {
		t.Fatalf("restart indexed %d files, want 4", st.Files)
	}
	// Identity files are verified on their first Get.
	for _, s := range []segment{good, bad} {
		h := get(t, c2, s, noSource(t))
		mustRead(t, h, s.b)
		h.Close()
	}
	if _, st := c2.Variant(idOf(good.id), int64(len(good.b)), compress.Gzip); st != disk.VariantBuilding {
		t.Fatalf("first use after restart: state %d, want building (verifying)", st)
	}
	h, st := waitVariant(t, c2, good, compress.Gzip)
	if st != disk.VariantReady {
		t.Fatalf("good variant after restart: state %d", st)
	}
	got, _ := readRange(t, h, 0, -1)
	if !bytes.Equal(decode(t, compress.Gzip, got), good.b) {
		t.Fatal("good variant does not decode after restart")
	}
	// The rotten one is discarded, then rebuilt from the identity file.
	h, st = waitVariant(t, c2, bad, compress.Gzip)
	if st == disk.VariantReady {
		got, _ := readRange(t, h, 0, -1)
		if !bytes.Equal(decode(t, compress.Gzip, got), bad.b) {
			t.Fatal("a rotten variant was served")
		}
	}
	h, st = waitVariant(t, c2, bad, compress.Gzip)
	if st != disk.VariantReady {
		t.Fatalf("rebuilt variant: state %d", st)
	}
	got, _ = readRange(t, h, 0, -1)
	if !bytes.Equal(decode(t, compress.Gzip, got), bad.b) {
		t.Fatal("rebuilt variant does not decode")
	}
	s := c2.Stats()
	if s.Discarded != 1 || s.VariantsRejected != 1 || s.VariantsMade != 1 {
		t.Fatalf("after restart: discarded %d rejected %d made %d, want 1, 1, 1", s.Discarded, s.VariantsRejected, s.VariantsMade)
	}
}
