package disk_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store/disk"
)

// countingWriter counts bytes and keeps them.
type countingWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *countingWriter) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Len()
}

// waitFor polls cond every 5 ms for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

// A variant asked for during the fill is encoded while the fill lands:
// its followers get bytes before the fill is complete, and every one of
// them ends with bytes that decode to the segment; the variant is then
// kept. One source call serves identity and both codings.
func TestGrowingVariantFollowedDuringFill(t *testing.T) {
	for _, coding := range []compress.Coding{compress.Gzip, compress.Zstd} {
		t.Run(coding.String(), func(t *testing.T) {
			dir := t.TempDir()
			c := newCache(t, disk.Options{Dir: dir})
			s := compressible(4<<20, 7)
			src := newStepSource(s.b, 8) // 512 KiB a step
			h := get(t, c, s, src.Source)
			defer h.Close()

			const followers = 20
			outs := make([]*countingWriter, followers)
			errs := make([]error, followers)
			var wg sync.WaitGroup
			for i := range followers {
				vh, st := c.Variant(idOf(s.id), int64(len(s.b)), coding)
				if st != disk.VariantFollowing || vh == nil {
					t.Fatalf("follower %d: state %d during the fill, want following", i, st)
				}
				if !vh.Growing() || vh.Size() != -1 || vh.File() != nil {
					t.Fatalf("a growing handle: growing %v size %d file %v", vh.Growing(), vh.Size(), vh.File())
				}
				r, err := vh.Reader(context.Background(), 0, -1)
				if err != nil {
					t.Fatal(err)
				}
				outs[i] = &countingWriter{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer vh.Close()
					_, errs[i] = io.Copy(outs[i], r)
				}()
			}
			// Only the first 512 KiB of the segment has landed: the
			// followers already have compressed bytes.
			waitFor(t, "compressed bytes before the fill's second step", func() bool { return outs[0].Len() > 0 })
			if got := len(src.wrote); got != 1 {
				t.Fatalf("%d chunks written, want 1", got)
			}
			for range len(src.chunks) - 1 {
				src.step <- struct{}{}
			}
			mustRead(t, h, s.b)
			wg.Wait()
			for i := range followers {
				if errs[i] != nil {
					t.Fatalf("follower %d: %v", i, errs[i])
				}
				if got := decode(t, coding, outs[i].buf.Bytes()); !bytes.Equal(got, s.b) {
					t.Fatalf("follower %d: decodes to %d bytes, not the segment", i, len(got))
				}
				if outs[i].Len() >= len(s.b)/2 {
					t.Fatalf("follower %d: %d compressed bytes for %d", i, outs[i].Len(), len(s.b))
				}
			}
			if n := src.calls.Load(); n != 1 {
				t.Fatalf("source called %d times", n)
			}
			// Kept: the next call is a complete, verified file with the
			// same bytes the followers got.
			vh, st := waitVariant(t, c, s, coding)
			if st != disk.VariantReady || vh.File() == nil {
				t.Fatalf("after the build: state %d, want ready", st)
			}
			kept, err := readRange(t, vh, 0, -1)
			if err != nil || !bytes.Equal(kept, outs[0].buf.Bytes()) {
				t.Fatalf("kept variant differs from what followers got (err %v)", err)
			}
			stats := c.Stats()
			if stats.VariantsGrown != 1 || stats.VariantsMade != 1 || stats.VariantFollowers != followers || stats.Reserved != 0 {
				t.Fatalf("stats %+v", stats)
			}
			if got := tmpFiles(t, dir); len(got) != 0 {
				t.Fatalf("temp files left: %v", got)
			}
		})
	}
}

// Followers of a growing variant attach and get their first compressed
// bytes when only the encoder's first flush (compress.StormFirstFlush of
// input, at most 64 KiB) has landed: the first byte of a crowd waits for
// one small block, not for a larger share of the fill.
func TestGrowingVariantFirstBytesAfterFirstFlush(t *testing.T) {
	for _, coding := range []compress.Coding{compress.Gzip, compress.Zstd} {
		t.Run(coding.String(), func(t *testing.T) {
			dir := t.TempDir()
			c := newCache(t, disk.Options{Dir: dir})
			s := compressible(2<<20, 9)
			src := newStepSource(s.b, 32) // 64 KiB a step
			if len(src.chunks[0]) != 64<<10 {
				t.Fatalf("first step of %d bytes", len(src.chunks[0]))
			}
			h := get(t, c, s, src.Source)
			defer h.Close()
			vh, st := c.Variant(idOf(s.id), int64(len(s.b)), coding)
			if st != disk.VariantFollowing || vh == nil {
				t.Fatalf("state %d with the first 64 KiB landed, want following", st)
			}
			defer vh.Close()
			r, err := vh.Reader(context.Background(), 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			out := &countingWriter{}
			done := make(chan error, 1)
			go func() {
				_, err := io.Copy(out, r)
				done <- err
			}()
			waitFor(t, "compressed bytes with only the first step landed", func() bool { return out.Len() > 0 })
			if got := len(src.wrote); got != 1 {
				t.Fatalf("%d steps written, want 1", got)
			}
			for range len(src.chunks) - 1 {
				src.step <- struct{}{}
			}
			mustRead(t, h, s.b)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := decode(t, coding, out.buf.Bytes()); !bytes.Equal(got, s.b) {
				t.Fatalf("decodes to %d bytes, not the segment", len(got))
			}
		})
	}
}

// A growing variant whose bytes are corrupted on their way to its file
// never completes an answer: every follower's reader returns an error and
// never io.EOF, nothing is kept, and the coding is remembered as not worth
// trying again.
func TestGrowingVariantCorruptNeverCompletes(t *testing.T) {
	for _, coding := range []compress.Coding{compress.Gzip, compress.Zstd} {
		t.Run(coding.String(), func(t *testing.T) {
			dir := t.TempDir()
			c := newCache(t, disk.Options{Dir: dir})
			// Armed once every follower attached: the first write after
			// it is corrupted.
			var armed atomic.Bool
			var writes atomic.Int32
			disk.SetGrowHookForTest(c, func(p []byte) []byte {
				if !armed.Load() || writes.Add(1) != 1 || len(p) == 0 {
					return p
				}
				q := bytes.Clone(p)
				q[len(q)/2] ^= 0x40
				return q
			})
			s := compressible(4<<20, 8)
			src := newStepSource(s.b, 4)
			h := get(t, c, s, src.Source)
			defer h.Close()
			const followers = 5
			ends := make(chan error, followers)
			for range followers {
				vh, st := c.Variant(idOf(s.id), int64(len(s.b)), coding)
				if st != disk.VariantFollowing {
					t.Fatalf("state %d, want following", st)
				}
				r, err := vh.Reader(context.Background(), 0, -1)
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					defer vh.Close()
					_, err := io.Copy(io.Discard, r) // nil only on io.EOF
					ends <- err
				}()
			}
			armed.Store(true)
			close(src.step)
			mustRead(t, h, s.b) // identity is not affected
			for range followers {
				if err := <-ends; err == nil {
					t.Fatal("a follower of a corrupted variant read to a clean end")
				} else if !errors.Is(err, compress.ErrMismatch) {
					t.Fatalf("follower error %v, want ErrMismatch", err)
				}
			}
			if writes.Load() < 1 {
				t.Fatalf("only %d writes: the fault was not injected", writes.Load())
			}
			_, st := waitVariant(t, c, s, coding)
			if st != disk.VariantNotWorth {
				t.Fatalf("after a rejected build: state %d, want not worth", st)
			}
			if exists(disk.PathForTest(c, s.key+"+"+coding.String())) {
				t.Fatal("a rejected variant was renamed into place")
			}
			stats := c.Stats()
			if stats.VariantsRejected != 1 || stats.VariantsMade != 0 || stats.Reserved != 0 {
				t.Fatalf("stats %+v", stats)
			}
			waitFor(t, "temp files removed", func() bool { return len(tmpFiles(t, dir)) == 0 })
		})
	}
}

// A variant following a fill whose source sends wrong bytes fails with
// it: its followers get an error, never a clean end.
func TestGrowingVariantFailsWithItsFill(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, disk.Options{Dir: dir})
	s := compressible(2<<20, 9)
	wrong := bytes.Clone(s.b)
	wrong[len(wrong)-10] ^= 1
	src := newStepSource(wrong, 4)
	h := get(t, c, s, src.Source)
	defer h.Close()
	vh, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Zstd)
	if st != disk.VariantFollowing {
		t.Fatalf("state %d, want following", st)
	}
	defer vh.Close()
	r, err := vh.Reader(context.Background(), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	close(src.step)
	if _, err := io.Copy(io.Discard, r); err == nil {
		t.Fatal("a variant of wrong bytes read to a clean end")
	}
	if _, err := readRange(t, h, 0, -1); !errors.Is(err, disk.ErrHashMismatch) {
		t.Fatalf("identity read err %v, want ErrHashMismatch", err)
	}
	waitFor(t, "the build's end", func() bool { return c.Stats().VariantsGrown == 1 })
	if exists(disk.PathForTest(c, s.key+"+zstd")) || c.Stats().VariantsMade != 0 {
		t.Fatal("a variant of wrong bytes was kept")
	}
	waitFor(t, "temp files removed", func() bool { return len(tmpFiles(t, dir)) == 0 })
}

// Incompressible bytes: the build stops at its first flush, before any
// follower attached; requests are told not worth (identity), never given
// a handle they would have to abort.
func TestGrowingVariantIncompressibleNeverFollowed(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, disk.Options{Dir: dir})
	s := newSegment(2<<20, 10) // pseudo-random
	src := newStepSource(s.b, 2)
	h := get(t, c, s, src.Source)
	defer h.Close()
	for range 3 {
		vh, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip)
		if vh != nil || st != disk.VariantNotWorth {
			t.Fatalf("incompressible segment: handle %v, state %d, want not worth", vh != nil, st)
		}
	}
	close(src.step)
	mustRead(t, h, s.b)
	waitFor(t, "the build's end", func() bool { return c.Stats().VariantsGrown == 1 })
	stats := c.Stats()
	if stats.VariantsIncompressible != 1 || stats.VariantFollowers != 0 || stats.VariantsMade != 0 || stats.Reserved != 0 {
		t.Fatalf("stats %+v", stats)
	}
	waitFor(t, "temp files removed", func() bool { return len(tmpFiles(t, dir)) == 0 })
}

// A follower's reader stops waiting for a stalled build when its context
// ends; the build and the other followers go on.
func TestGrowingVariantReaderHonoursContext(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := compressible(2<<20, 11)
	src := newStepSource(s.b, 4)
	h := get(t, c, s, src.Source)
	defer h.Close()
	vh, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip)
	if st != disk.VariantFollowing {
		t.Fatalf("state %d, want following", st)
	}
	defer vh.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := vh.Reader(ctx, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, r); ended <- err }()
	select {
	case err := <-ended:
		t.Fatalf("the reader ended (%v) while the fill is stalled", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	other, st := c.Variant(idOf(s.id), int64(len(s.b)), compress.Gzip)
	if st != disk.VariantFollowing {
		t.Fatalf("another follower: state %d", st)
	}
	defer other.Close()
	close(src.step)
	got, err := readRange(t, other, 0, -1)
	if err != nil || !bytes.Equal(decode(t, compress.Gzip, got), s.b) {
		t.Fatalf("the other follower: %v", err)
	}
}
