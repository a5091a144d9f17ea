package disk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/store/disk"
)

// fullAfter makes the disk full once limit bytes of fills were written:
// each later write fails with ENOSPC (before writing anything).
func fullAfter(c *disk.Cache, limit int64) *atomic.Bool {
	var written atomic.Int64
	var full atomic.Bool
	full.Store(true)
	disk.SetHooksForTest(c, func(p []byte) error {
		if full.Load() && written.Load()+int64(len(p)) > limit {
			return syscall.ENOSPC
		}
		written.Add(int64(len(p)))
		return nil
	}, nil)
	return &full
}

// storeAt serves b from offset off (the store a handoff continues from),
// counting opens and closes; mutate, if set, changes what it sends.
type storeAt struct {
	b             []byte
	opens, closes atomic.Int32
	offs          sync.Map // off → true
	mutate        func(b []byte) []byte
	err           error
}

func (s *storeAt) Reopen(ctx context.Context, off int64) (io.ReadCloser, error) {
	s.opens.Add(1)
	s.offs.Store(off, true)
	if s.err != nil {
		return nil, s.err
	}
	b := s.b
	if s.mutate != nil {
		b = s.mutate(bytes.Clone(b))
	}
	if off > int64(len(b)) {
		off = int64(len(b))
	}
	return &countClose{Reader: bytes.NewReader(b[off:]), n: &s.closes}, nil
}

type countClose struct {
	io.Reader
	n *atomic.Int32
}

func (c *countClose) Close() error { c.n.Add(1); return nil }

// The disk fills up mid-fill: the fill fails, and every reader following
// it (the one that started it, one that joined) gets the whole segment,
// the rest read from the store and verified, and a clean end.
func TestDiskFullHandsReadersToStore(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	c := newCache(t, disk.Options{Dir: dir, Now: clk.Now, RetryInterval: time.Minute})
	s := newSegment(300_000, 90)
	src := newStepSource(s.b, 3) // 100 000 bytes a chunk
	full := fullAfter(c, 100_000)
	st := &storeAt{b: s.b}

	leader := get(t, c, s, src.Source)
	follower := get(t, c, s, noSource(t))
	for _, h := range []*disk.Handle{leader, follower} {
		h.SetReopen(st.Reopen)
	}
	// The leader has read a little before the disk fills.
	r, err := leader.Reader(context.Background(), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 5000)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	close(src.step) // the second chunk meets a full disk
	rest, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(append(head, rest...), s.b) {
		t.Fatalf("leader: %d bytes, %v", len(head)+len(rest), err)
	}
	mustRead(t, follower, s.b)
	if _, ok := st.offs.Load(int64(100_000)); !ok || st.opens.Load() != 2 {
		t.Fatalf("store opens %d; want 2, at the fill's 100000 bytes", st.opens.Load())
	}
	leader.Close()
	follower.Close()
	if st.closes.Load() != 2 {
		t.Fatalf("store streams closed %d of 2", st.closes.Load())
	}
	stats := c.Stats()
	if stats.FillErrors != 1 || stats.Handoffs != 2 || stats.Reserved != 0 {
		t.Fatalf("stats %+v", stats)
	}
	if exists(disk.PathForTest(c, s.key)) || len(tmpFiles(t, dir)) != 0 {
		t.Fatal("the failed fill left a file")
	}
	// Then the cache steps aside (the caller streams from the store) and
	// tries the directory again after the retry interval.
	if _, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), noSource(t)); !errors.Is(err, disk.ErrUnavailable) {
		t.Fatalf("err %v, want a bypass after ENOSPC", err)
	}
	full.Store(false)
	clk.Add(time.Minute)
	mustRead(t, get(t, c, s, bytesSource(s.b, nil)), s.b)
}

// Every range of a handed-over reader gets its bytes: before, across and
// after the point where the disk filled, and the segment's last byte.
func TestHandoffRanges(t *testing.T) {
	s := newSegment(250_000, 91)
	size := int64(len(s.b))
	const at = 100_000
	for _, tc := range []struct{ off, n int64 }{
		{0, -1}, {10, 100}, {at - 5, 10}, {at, 1}, {at - 1, 1}, {at + 7, 50_000},
		{size - 100, -1}, {size - 1, 1}, {0, at}, {1, size - 1}, {size, -1},
	} {
		t.Run(fmt.Sprintf("%d+%d", tc.off, tc.n), func(t *testing.T) {
			c := newCache(t, disk.Options{})
			fullAfter(c, at)
			src := newStepSource(s.b, 3)
			src.chunks = [][]byte{s.b[:at], s.b[at:]}
			st := &storeAt{b: s.b}
			h := get(t, c, s, src.Source)
			h.SetReopen(st.Reopen)
			close(src.step)
			got, err := readRange(t, h, tc.off, tc.n)
			end := size
			if tc.n >= 0 {
				end = tc.off + tc.n
			}
			if err != nil || !bytes.Equal(got, s.b[tc.off:end]) {
				t.Fatalf("%d bytes, want %d; err %v", len(got), end-tc.off, err)
			}
			if c.Stats().Handoffs != 1 {
				t.Fatalf("stats %+v", c.Stats())
			}
		})
	}
}

// A handed-over reader verifies the whole segment: store bytes that do
// not hash to the id, a store that sends too few or too many bytes, or
// cannot be opened, end the read in an error before the range's last
// byte, never in a clean end.
func TestHandoffNeverEndsCleanOnBadStore(t *testing.T) {
	s := newSegment(200_000, 92)
	const at = 80_000
	for name, st := range map[string]*storeAt{
		"corrupt after the resume point":                {b: s.b, mutate: func(b []byte) []byte { b[150_000] ^= 1; return b }},
		"corrupt before the resume point (not re-read)": nil,
		"short":      {b: s.b[:190_000]},
		"long":       {b: append(bytes.Clone(s.b), 'x')},
		"open fails": {b: s.b, err: errors.New("store down")},
	} {
		t.Run(name, func(t *testing.T) {
			if st == nil {
				// The store's first at bytes are not read again: a change
				// there cannot reach the reader (its bytes are the fill's).
				st = &storeAt{b: s.b, mutate: func(b []byte) []byte { b[10] ^= 1; return b }}
			}
			for _, rg := range []struct{ off, n int64 }{{0, -1}, {1000, 2000}, {at + 10, 100}} {
				c := newCache(t, disk.Options{})
				fullAfter(c, at)
				src := newStepSource(s.b, 2)
				src.chunks = [][]byte{s.b[:at], s.b[at:]}
				h := get(t, c, s, src.Source)
				h.SetReopen(st.Reopen)
				close(src.step)
				got, err := readRange(t, h, rg.off, rg.n)
				want := int64(len(s.b)) - rg.off
				if rg.n >= 0 {
					want = rg.n
				}
				if name == "corrupt before the resume point (not re-read)" {
					if err != nil || !bytes.Equal(got, s.b[rg.off:rg.off+want]) {
						t.Fatalf("range %v: %d bytes, %v", rg, len(got), err)
					}
					continue
				}
				if err == nil || int64(len(got)) >= want {
					t.Fatalf("range %v: %d of %d bytes, err %v: a bad store ended cleanly", rg, len(got), want, err)
				}
				if errors.Is(err, disk.ErrUnavailable) {
					t.Fatalf("range %v: err %v matches ErrUnavailable (a disk fault), want the store's", rg, err)
				}
				h.Close()
			}
		})
	}
}

// Without a Reopen, readers of a fill that failed on the disk get the
// disk's error (the caller must abort).
func TestDiskFullWithoutReopenFailsReaders(t *testing.T) {
	c := newCache(t, disk.Options{})
	fullAfter(c, 50_000)
	s := newSegment(100_000, 93)
	src := newStepSource(s.b, 2)
	h := get(t, c, s, src.Source)
	close(src.step)
	got, err := readRange(t, h, 0, -1)
	if !errors.Is(err, disk.ErrUnavailable) || !errors.Is(err, syscall.ENOSPC) || len(got) >= len(s.b) {
		t.Fatalf("%d bytes, err %v", len(got), err)
	}
	if c.Stats().Handoffs != 0 {
		t.Fatalf("stats %+v", c.Stats())
	}
}

// Many concurrent readers of a fill that meets a full disk all get the
// whole segment.
func TestDiskFullManyReaders(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(1<<20, 94)
	fullAfter(c, 300_000)
	src := newStepSource(s.b, 8)
	st := &storeAt{b: s.b}
	leader := get(t, c, s, src.Source)
	leader.SetReopen(st.Reopen)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	read := func(h *disk.Handle) {
		defer wg.Done()
		defer h.Close()
		b, err := io.ReadAll(must(h.Reader(context.Background(), 0, -1)))
		if err == nil && !bytes.Equal(b, s.b) {
			err = fmt.Errorf("%d wrong bytes", len(b))
		}
		if err != nil {
			errs <- err
		}
	}
	for range 19 {
		h := get(t, c, s, noSource(t))
		h.SetReopen(st.Reopen)
		wg.Add(1)
		go read(h)
	}
	wg.Add(1)
	go read(leader)
	close(src.step)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := c.Stats(); st.Handoffs != 20 || st.FillErrors != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A fill that wrote and verified every byte but cannot be renamed into
// place (its shard directory cannot be made) fails on the disk after the
// fact: its readers finish from their descriptors, verified, without the
// store.
func TestCommitFailureAfterAllBytesFinishesReaders(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, disk.Options{Dir: dir})
	s := newSegment(200_000, 95)
	// A regular file where the segment's shard directory must go.
	if err := os.WriteFile(filepath.Join(dir, s.key[:2]), []byte("in the way"), 0o640); err != nil {
		t.Fatal(err)
	}
	src := newStepSource(s.b, 2)
	leader := get(t, c, s, src.Source)
	follower := get(t, c, s, noSource(t))
	close(src.step)
	for name, h := range map[string]*disk.Handle{"leader": leader, "follower": follower} {
		got, err := readRange(t, h, 0, -1)
		if err != nil || !bytes.Equal(got, s.b) {
			t.Fatalf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	if st := c.Stats(); st.FillErrors != 1 || st.Handoffs != 2 || st.Files != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A fill from a source that verifies its own bytes (GetVerified) hashes
// nothing, so when the disk fails under it the bytes it wrote are hashed
// once, read back from its file, and its readers go on from the store
// verified as after any fill: the whole segment, or, when the store's
// bytes are not the segment's, an error before the last byte.
func TestDiskFullHandsVerifiedFillToStore(t *testing.T) {
	s := newSegment(300_000, 92)
	for name, mutate := range map[string]func([]byte) []byte{
		"sound":   nil,
		"corrupt": func(b []byte) []byte { b[250_000] ^= 1; return b },
	} {
		t.Run(name, func(t *testing.T) {
			c := newCache(t, disk.Options{})
			fullAfter(c, 100_000)
			src := newStepSource(s.b, 3)
			st := &storeAt{b: s.b, mutate: mutate}
			h, err := c.GetVerified(context.Background(), idOf(s.id), int64(len(s.b)), src.Source)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			h.SetReopen(st.Reopen)
			close(src.step)
			r, err := h.Reader(context.Background(), 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			if mutate == nil && (err != nil || !bytes.Equal(got, s.b)) {
				t.Fatalf("%d bytes, %v", len(got), err)
			}
			if mutate != nil && (!errors.Is(err, disk.ErrHashMismatch) || len(got) >= len(s.b)) {
				t.Fatalf("%d bytes, %v; want ErrHashMismatch before the last byte", len(got), err)
			}
			if c.Stats().Handoffs != 1 {
				t.Fatalf("stats %+v", c.Stats())
			}
		})
	}
}

// GetVerified's fill takes its source's word for the bytes (the source
// hashed them; the fill hashes nothing), where Get's fill hashes them
// itself: bytes that do not hash to the id, from a source that returned
// nil, are committed by the one and refused by the other.
func TestGetVerifiedHashesNothing(t *testing.T) {
	s := newSegment(50_000, 93)
	wrong := bytes.Clone(s.b)
	wrong[7] ^= 1
	c := newCache(t, disk.Options{})
	h, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), bytesSource(wrong, nil))
	if err == nil {
		r, _ := h.Reader(context.Background(), 0, -1)
		_, err = io.ReadAll(r)
		h.Close()
	}
	if !errors.Is(err, disk.ErrHashMismatch) {
		t.Fatalf("Get: %v, want ErrHashMismatch", err)
	}
	h, err = c.GetVerified(context.Background(), idOf(s.id), int64(len(s.b)), bytesSource(wrong, nil))
	if err != nil {
		t.Fatal(err)
	}
	mustRead(t, h, wrong)
	h.Close()
	if st := c.Stats(); st.Files != 1 {
		t.Fatalf("stats %+v, want the verified fill committed", st)
	}
}
