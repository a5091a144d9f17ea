package disk_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncular/caddy-syncular/store/disk"
)

// A fill's file exists ahead of its data in whole aligned 2 MiB steps
// (written as zeros, so the page cache is built of large pages; prefill.go
// says why), never past the segment's size, while a follower reads only
// the bytes the source wrote: never a zero of the prefill.
func TestFillPrefillsAlignedChunks(t *testing.T) {
	const step = 2 << 20
	dir := t.TempDir()
	c := newCache(t, disk.Options{Dir: dir})
	s := newSegment(600_001, 11)  // not a multiple of the step
	src := newStepSource(s.b, 15) // 40,001-byte writes
	get(t, c, s, src.Source)
	follower := get(t, c, s, noSource(t))
	r, err := follower.Reader(context.Background(), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	var written int64
	for i, ch := range src.chunks {
		if i > 0 {
			src.step <- struct{}{}
		}
		<-src.wrote
		written += int64(len(ch))
		if i == len(src.chunks)-1 {
			break // the fill may have committed: the file is checked below
		}
		tmp := tmpFiles(t, dir)
		if len(tmp) != 1 {
			t.Fatalf("chunk %d: %d files in tmp, want the fill's one", i, len(tmp))
		}
		fi, err := os.Stat(filepath.Join(dir, "tmp", tmp[0]))
		if err != nil {
			t.Fatal(err)
		}
		want := min((written+step-1)/step*step, int64(len(s.b)))
		if fi.Size() != want {
			t.Fatalf("after %d bytes the fill's file is %d bytes, want %d (the next 2 MiB boundary, at most the segment)", written, fi.Size(), want)
		}
		// The follower gets exactly the bytes written so far.
		got := make([]byte, len(ch))
		if _, err := io.ReadFull(r, got); err != nil || string(got) != string(ch) {
			t.Fatalf("chunk %d: the follower read %v, not the source's bytes", i, err)
		}
	}
	rest, err := io.ReadAll(r)
	last := src.chunks[len(src.chunks)-1]
	if err != nil || string(rest) != string(last) {
		t.Fatalf("after the last chunk: %d bytes (%v), want its %d", len(rest), err, len(last))
	}
	fi, err := os.Stat(disk.PathForTest(c, s.key))
	if err != nil || fi.Size() != int64(len(s.b)) {
		t.Fatalf("the committed file: %v, %v; want %d bytes", fi, err, len(s.b))
	}
	mustRead(t, get(t, c, s, noSource(t)), s.b)
}
