package disk_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/disk"
)

// segment is test bytes with their id.
type segment struct {
	b   []byte
	id  string
	key string
}

func newSegment(n int, seed uint64) segment {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed+1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return segmentOf(b)
}

// segmentOf is b with its id.
func segmentOf(b []byte) segment {
	sum := sha256.Sum256(b)
	key := hex.EncodeToString(sum[:])
	return segment{b: b, id: "sha256:" + key, key: key}
}

// clock is an injected, settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newCache(t *testing.T, opts disk.Options) *disk.Cache {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	c, err := disk.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// bytesSource writes b in one call and counts its calls.
func bytesSource(b []byte, calls *atomic.Int32) disk.Source {
	return func(ctx context.Context, w io.Writer) error {
		if calls != nil {
			calls.Add(1)
		}
		_, err := w.Write(b)
		return err
	}
}

// noSource fails the test if a fill starts.
func noSource(t *testing.T) disk.Source {
	return func(ctx context.Context, w io.Writer) error {
		t.Error("the source was called; want the segment served from disk")
		return errors.New("unexpected fill")
	}
}

// stepSource writes chunks one at a time, each after a receive on step
// (the first chunk immediately).
type stepSource struct {
	chunks [][]byte
	step   chan struct{}
	calls  atomic.Int32
	wrote  chan int // index of each chunk written
	hold   bool     // wait for one more step before returning
}

func newStepSource(b []byte, parts int) *stepSource {
	s := &stepSource{step: make(chan struct{}), wrote: make(chan int, 64)}
	sz := (len(b) + parts - 1) / parts
	for i := 0; i < len(b); i += sz {
		s.chunks = append(s.chunks, b[i:min(i+sz, len(b))])
	}
	return s
}

func (s *stepSource) Source(ctx context.Context, w io.Writer) error {
	s.calls.Add(1)
	for i, ch := range s.chunks {
		if i > 0 {
			select {
			case <-s.step:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := w.Write(ch); err != nil {
			return err
		}
		select {
		case s.wrote <- i:
		default: // nobody counts (several fills would be a bug the test reports)
		}
	}
	if s.hold { // written all, but the source has not returned yet
		select {
		case <-s.step:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func get(t *testing.T, c *disk.Cache, s segment, src disk.Source) *disk.Handle {
	t.Helper()
	h, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), src)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// fillNow fills s and reads it to the end, so the fill is committed.
func fillNow(t *testing.T, c *disk.Cache, s segment) {
	t.Helper()
	h := get(t, c, s, bytesSource(s.b, nil))
	mustRead(t, h, s.b)
	h.Close()
}

func readRange(t *testing.T, h *disk.Handle, off, n int64) ([]byte, error) {
	t.Helper()
	r, err := h.Reader(context.Background(), off, n)
	if err != nil {
		t.Fatalf("Reader(%d, %d): %v", off, n, err)
	}
	return io.ReadAll(r)
}

func mustRead(t *testing.T, h *disk.Handle, want []byte) {
	t.Helper()
	got, err := readRange(t, h, 0, -1)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d (equal %v)", len(got), len(want), bytes.Equal(got, want))
	}
}

func tmpFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func TestFillThenHit(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, disk.Options{Dir: dir})
	s := newSegment(300_000, 1)
	var calls atomic.Int32

	h := get(t, c, s, bytesSource(s.b, &calls))
	if h.Hit() || h.Size() != int64(len(s.b)) {
		t.Fatalf("first Get: hit %v size %d", h.Hit(), h.Size())
	}
	mustRead(t, h, s.b)

	p := disk.PathForTest(c, s.key)
	if p != filepath.Join(dir, s.key[:2], s.key) {
		t.Fatalf("file at %s", p)
	}
	onDisk, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(onDisk, s.b) {
		t.Fatalf("file on disk: err %v, equal %v", err, bytes.Equal(onDisk, s.b))
	}

	h2 := get(t, c, s, bytesSource(s.b, &calls))
	if !h2.Hit() || h2.File() == nil {
		t.Fatalf("second Get: hit %v file %v", h2.Hit(), h2.File())
	}
	mustRead(t, h2, s.b)
	if n := calls.Load(); n != 1 {
		t.Fatalf("source called %d times, want 1", n)
	}
	st := c.Stats()
	if st.Fills != 1 || st.Hits != 1 || st.Files != 1 || st.Bytes != int64(len(s.b)) || st.Reserved != 0 {
		t.Fatalf("stats %+v", st)
	}
	if got := tmpFiles(t, dir); len(got) != 0 {
		t.Fatalf("temp files left: %v", got)
	}
}

// A complete file's reader must be the one type net/http's sendfile path
// accepts: *io.LimitedReader over an *os.File (net/sendfile.go).
func TestCompleteReaderKeepsSendfilePath(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(100_000, 2)
	fillNow(t, c, s)
	h := get(t, c, s, noSource(t))
	r, err := h.Reader(context.Background(), 1000, 5000)
	if err != nil {
		t.Fatal(err)
	}
	lr, ok := r.(*io.LimitedReader)
	if !ok {
		t.Fatalf("reader is %T, want *io.LimitedReader", r)
	}
	if _, ok := lr.R.(*os.File); !ok || lr.N != 5000 {
		t.Fatalf("limited reader over %T, N %d", lr.R, lr.N)
	}

	// And through a real HTTP server: the bytes arrive intact.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rd, err := h.Reader(r.Context(), 1000, 5000)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Length", "5000")
		io.Copy(w, rd)
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(body, s.b[1000:6000]) {
		t.Fatalf("served %d bytes, equal %v", len(body), bytes.Equal(body, s.b[1000:6000]))
	}
}

func TestHashMismatchIsNeverVisible(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, disk.Options{Dir: dir})
	s := newSegment(200_000, 3)
	wrong := bytes.Clone(s.b)
	wrong[len(wrong)-1] ^= 1

	src := newStepSource(wrong, 2)
	src.hold = true
	h := get(t, c, s, src.Source) // the first chunk is right
	src.step <- struct{}{}        // the last (wrong) chunk lands; the fill is not over
	r, err := h.Reader(context.Background(), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	all := make([]byte, len(wrong)-1)
	if _, err := io.ReadFull(r, all); err != nil {
		t.Fatal(err)
	}
	// Every byte but the last is read: the last (a client that got it
	// would see a complete response) is held back until the fill is
	// verified, and then never comes.
	end := make(chan error, 1)
	go func() {
		n, err := r.Read(make([]byte, 1))
		if n != 0 {
			err = fmt.Errorf("read %d bytes past the verified end (err %v)", n, err)
		}
		end <- err
	}()
	select {
	case err := <-end:
		t.Fatalf("the reader ended (%v) before the fill was verified", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(src.step)
	if err := <-end; !errors.Is(err, disk.ErrHashMismatch) {
		t.Fatalf("read err %v, want ErrHashMismatch", err)
	}
	// A range wholly before the bad byte still ends in the error, not EOF.
	if _, err := readRange(t, h, 0, 10); !errors.Is(err, disk.ErrHashMismatch) {
		t.Fatalf("range read err %v, want ErrHashMismatch", err)
	}
	if exists(disk.PathForTest(c, s.key)) {
		t.Fatal("a file that does not hash to its id was renamed into place")
	}
	if got := tmpFiles(t, dir); len(got) != 0 {
		t.Fatalf("temp files left: %v", got)
	}
	st := c.Stats()
	if st.Files != 0 || st.FillErrors != 1 || st.Reserved != 0 || st.BypassUnavailable != 0 {
		t.Fatalf("stats %+v", st)
	}
	// A source error is not a disk fault: the next Get fills again.
	var calls atomic.Int32
	mustRead(t, get(t, c, s, bytesSource(s.b, &calls)), s.b)
	if calls.Load() != 1 {
		t.Fatalf("source called %d times", calls.Load())
	}
}

func TestLengthMismatch(t *testing.T) {
	s := newSegment(50_000, 4)
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"short", s.b[:len(s.b)-1]},
		{"long", append(bytes.Clone(s.b), 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := newCache(t, disk.Options{Dir: dir})
			h, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), bytesSource(tc.body, nil))
			if err == nil { // the fill had bytes before it failed
				defer h.Close()
				_, err = readRange(t, h, 0, -1)
			}
			if !errors.Is(err, disk.ErrSizeMismatch) {
				t.Fatalf("err %v, want ErrSizeMismatch", err)
			}
			if exists(disk.PathForTest(c, s.key)) || len(tmpFiles(t, dir)) != 0 {
				t.Fatal("a failed fill left a file")
			}
			if st := c.Stats(); st.FillErrors != 1 || st.Files != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
	t.Run("empty", func(t *testing.T) {
		c := newCache(t, disk.Options{})
		_, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), bytesSource(nil, nil))
		if !errors.Is(err, disk.ErrSizeMismatch) {
			t.Fatalf("err %v, want ErrSizeMismatch from Get (no byte ever landed)", err)
		}
	})
}

func TestSourceErrorBeforeFirstByte(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(1000, 5)
	storeErr := errors.New("store: segment not found")
	_, err := c.Get(context.Background(), idOf(s.id), 1000, func(context.Context, io.Writer) error { return storeErr })
	if !errors.Is(err, storeErr) {
		t.Fatalf("err %v, want the source's error", err)
	}
	if errors.Is(err, disk.ErrUnavailable) || errors.Is(err, disk.ErrTooLarge) || errors.Is(err, disk.ErrNoRoom) {
		t.Fatalf("a source error is reported as a bypass: %v", err)
	}
	if st := c.Stats(); st.FillErrors != 1 || st.BypassUnavailable != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConcurrentCallersShareOneFill(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(1<<20, 6)
	src := newStepSource(s.b, 2)

	const n = 50
	handles := make([]*disk.Handle, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			handles[i], errs[i] = c.Get(context.Background(), idOf(s.id), int64(len(s.b)), src.Source)
		}()
	}
	wg.Wait() // all 50 returned while the fill still waits for step
	if st := c.Stats(); st.Fills != 0 {
		t.Fatalf("the fill completed before the second chunk was released: %+v", st)
	}
	close(src.step)
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		mustRead(t, handles[i], s.b)
		handles[i].Close()
	}
	if got := src.calls.Load(); got != 1 {
		t.Fatalf("source opened %d times, want 1", got)
	}
	if st := c.Stats(); st.Followers != n-1 || st.Fills != 1 {
		t.Fatalf("stats %+v, want %d followers", st, n-1)
	}
}

func TestFollowersReadWhileFilling(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(300_000, 7)
	src := newStepSource(s.b, 3)
	leader := get(t, c, s, src.Source)
	<-src.wrote // chunk 0 on disk
	follower := get(t, c, s, noSource(t))
	if follower.Hit() || follower.File() != nil {
		t.Fatal("the follower reports a complete file during the fill")
	}

	r, err := follower.Reader(context.Background(), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Fatalf("an empty read during the fill: %d, %v", n, err)
	}
	first := make([]byte, len(src.chunks[0]))
	if _, err := io.ReadFull(r, first); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, src.chunks[0]) {
		t.Fatal("the follower's first chunk differs")
	}
	if st := c.Stats(); st.Fills != 0 || src.calls.Load() != 1 {
		t.Fatalf("want the fill still running after the first chunk: %+v", st)
	}

	// A read past the written bytes blocks until the next chunk lands.
	got := make(chan []byte)
	go func() {
		b, err := io.ReadAll(r)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	select {
	case <-got:
		t.Fatal("the follower's read ended before the fill did")
	case <-time.After(50 * time.Millisecond):
	}
	src.step <- struct{}{}
	src.step <- struct{}{}
	rest := <-got
	if !bytes.Equal(append(first, rest...), s.b) {
		t.Fatal("the follower's bytes differ")
	}
	mustRead(t, leader, s.b)
	// Ranges read through a fill handle too.
	b, err := readRange(t, follower, 1234, 100_000)
	if err != nil || !bytes.Equal(b, s.b[1234:101_234]) {
		t.Fatalf("follower range: %v", err)
	}
}

func TestFollowerReadHonoursContext(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(10_000, 8)
	src := newStepSource(s.b, 2)
	h := get(t, c, s, src.Source)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := h.Reader(ctx, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := io.ReadAll(r)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	close(src.step)
}

func TestEvictionUnderOpenReader(t *testing.T) {
	const size = 100_000
	c := newCache(t, disk.Options{MaxBytes: 3 * size})
	a := newSegment(size, 10)
	fillNow(t, c, a)
	h := get(t, c, a, noSource(t)) // a hit, held open
	r, err := h.Reader(context.Background(), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	half := make([]byte, size/2)
	if _, err := io.ReadFull(r, half); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // a is least recently used when the third needs room
		s := newSegment(size, uint64(11+i))
		mustRead(t, get(t, c, s, bytesSource(s.b, nil)), s.b)
	}
	st := c.Stats()
	if st.Evictions != 1 || st.Files != 3 || st.Bytes != 3*size {
		t.Fatalf("stats %+v", st)
	}
	if exists(disk.PathForTest(c, a.key)) {
		t.Fatal("the evicted file is still on disk")
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(half, rest...), a.b) {
		t.Fatal("the open reader of an evicted file read wrong bytes")
	}
	// The evicted segment is filled again on demand.
	var calls atomic.Int32
	mustRead(t, get(t, c, a, bytesSource(a.b, &calls)), a.b)
	if calls.Load() != 1 {
		t.Fatal("the evicted segment was not filled again")
	}
}

func TestTooLargeAndNoRoom(t *testing.T) {
	c := newCache(t, disk.Options{MaxBytes: 1000})
	big := newSegment(1001, 20)
	_, err := c.Get(context.Background(), idOf(big.id), 1001, noSource(t))
	if !errors.Is(err, disk.ErrTooLarge) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}

	a, b := newSegment(600, 21), newSegment(600, 22)
	src := newStepSource(a.b, 2)
	get(t, c, a, src.Source) // holds 600 of 1000 while it runs
	_, err = c.Get(context.Background(), idOf(b.id), 600, noSource(t))
	if !errors.Is(err, disk.ErrNoRoom) {
		t.Fatalf("err %v, want ErrNoRoom", err)
	}
	close(src.step)
	st := c.Stats()
	if st.BypassTooLarge != 1 || st.BypassNoRoom != 1 || st.BypassUnavailable != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRestart(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	opts := disk.Options{Dir: dir, Now: clk.Now, FillTimeout: time.Minute}
	c, err := disk.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	good, corrupt, short := newSegment(70_000, 30), newSegment(70_000, 31), newSegment(70_000, 32)
	for _, s := range []segment{good, corrupt, short} {
		fillNow(t, c, s)
	}
	c.Close()

	// Bit rot in one file (same size), truncation of another.
	p := disk.PathForTest(c, corrupt.key)
	b, _ := os.ReadFile(p)
	b[100] ^= 0xff
	if err := os.WriteFile(p, b, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk.PathForTest(c, short.key), 1000); err != nil {
		t.Fatal(err)
	}
	// A crash's leftover, and a file that is not ours.
	leftover := filepath.Join(dir, "tmp", "fill-123")
	os.WriteFile(leftover, []byte("partial"), 0o640)
	old := clk.Now().Add(-time.Hour)
	os.Chtimes(leftover, old, old)
	foreign := filepath.Join(dir, "notes.txt")
	os.WriteFile(foreign, []byte("keep me"), 0o640)

	c2 := newCache(t, opts)
	if st := c2.Stats(); st.Files != 3 {
		t.Fatalf("restart indexed %+v, want 3 files", st)
	}
	if exists(leftover) || !exists(foreign) {
		t.Fatalf("leftover removed %v, foreign kept %v", !exists(leftover), exists(foreign))
	}
	// First use after the restart: concurrent callers share one
	// verification (a read of the file) and none reaches the store.
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := c2.Get(context.Background(), idOf(good.id), int64(len(good.b)), noSource(t))
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			if b, err := io.ReadAll(must(h.Reader(context.Background(), 0, -1))); err != nil || !bytes.Equal(b, good.b) {
				t.Errorf("read after restart: %v", err)
			}
		}()
	}
	wg.Wait()
	h := get(t, c2, good, noSource(t))
	if !h.Hit() {
		t.Fatal("the file kept across the restart was not a hit")
	}
	mustRead(t, h, good.b)

	for _, s := range []segment{corrupt, short} {
		var calls atomic.Int32
		h := get(t, c2, s, bytesSource(s.b, &calls))
		mustRead(t, h, s.b)
		if calls.Load() != 1 {
			t.Fatalf("a damaged file was served without a refill (calls %d)", calls.Load())
		}
	}
	if st := c2.Stats(); st.Discarded != 2 || st.Fills != 2 || st.Hits != 11 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRestartKeepsRecencyAndBudget(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	const size = 10_000
	segs := []segment{newSegment(size, 40), newSegment(size, 41), newSegment(size, 42)}
	c, _ := disk.New(disk.Options{Dir: dir, Now: clk.Now})
	for _, s := range segs {
		fillNow(t, c, s)
		clk.Add(2 * time.Minute)
	}
	// Touch the oldest: it becomes the most recent.
	h, err := c.Get(context.Background(), idOf(segs[0].id), size, noSource(t))
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	c.Close()

	// A smaller budget after the restart keeps the two most recent.
	c2 := newCache(t, disk.Options{Dir: dir, Now: clk.Now, MaxBytes: 2 * size})
	if st := c2.Stats(); st.Files != 2 || st.Evictions != 1 {
		t.Fatalf("stats %+v", st)
	}
	if exists(disk.PathForTest(c2, segs[1].key)) {
		t.Fatal("the least recently used file survived the smaller budget")
	}
	for _, s := range []segment{segs[0], segs[2]} {
		mustRead(t, get(t, c2, s, noSource(t)), s.b)
	}
}

func TestUnusableDirectoryBypasses(t *testing.T) {
	base := t.TempDir()
	blocker := filepath.Join(base, "file")
	if err := os.WriteFile(blocker, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	var warned atomic.Int32
	c := newCache(t, disk.Options{
		Dir: filepath.Join(blocker, "cache"), Now: clk.Now, RetryInterval: time.Minute,
		Warn: func(string, error) { warned.Add(1) },
	})
	if warned.Load() == 0 {
		t.Error("no warning for an unusable directory")
	}
	s := newSegment(1000, 50)
	for range 2 {
		_, err := c.Get(context.Background(), idOf(s.id), 1000, noSource(t))
		if !errors.Is(err, disk.ErrUnavailable) || !errors.Is(err, syscall.ENOTDIR) {
			t.Fatalf("err %v, want ErrUnavailable wrapping ENOTDIR", err)
		}
	}
	if st := c.Stats(); st.BypassUnavailable != 2 || st.Usable {
		t.Fatalf("stats %+v (want unusable)", st)
	}
	// Repaired: used again once the retry interval passed, not before.
	os.Remove(blocker)
	if _, err := c.Get(context.Background(), idOf(s.id), 1000, noSource(t)); !errors.Is(err, disk.ErrUnavailable) {
		t.Fatalf("err %v before the retry interval", err)
	}
	clk.Add(time.Minute)
	mustRead(t, get(t, c, s, bytesSource(s.b, nil)), s.b)
	if st := c.Stats(); !st.Usable || st.MaxBytes != disk.DefaultMaxBytes {
		t.Fatalf("stats %+v after repair (want usable, the default budget)", st)
	}
}

func TestReadOnlyDirectoryBypasses(t *testing.T) {
	clk := newClock()
	c := newCache(t, disk.Options{Now: clk.Now, RetryInterval: time.Minute})
	var readOnly atomic.Bool
	readOnly.Store(true)
	disk.SetHooksForTest(c, nil, func() error {
		if readOnly.Load() {
			return &os.PathError{Op: "open", Path: "tmp", Err: syscall.EROFS}
		}
		return nil
	})
	s := newSegment(1000, 51)
	_, err := c.Get(context.Background(), idOf(s.id), 1000, noSource(t))
	if !errors.Is(err, disk.ErrUnavailable) || !errors.Is(err, syscall.EROFS) {
		t.Fatalf("err %v, want ErrUnavailable wrapping EROFS", err)
	}
	// Down for the retry interval: no new fill is tried.
	_, err = c.Get(context.Background(), idOf(s.id), 1000, noSource(t))
	if !errors.Is(err, disk.ErrUnavailable) {
		t.Fatalf("err %v", err)
	}
	if st := c.Stats(); st.BypassUnavailable != 2 || st.FillErrors != 1 || st.Reserved != 0 {
		t.Fatalf("stats %+v", st)
	}
	readOnly.Store(false)
	clk.Add(time.Minute)
	mustRead(t, get(t, c, s, bytesSource(s.b, nil)), s.b)
}

func TestDiskFullDuringFillFailsAttachedReaders(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	c := newCache(t, disk.Options{Dir: dir, Now: clk.Now, RetryInterval: time.Minute})
	var written atomic.Int64
	var full atomic.Bool
	full.Store(true)
	disk.SetHooksForTest(c, func(p []byte) error {
		if full.Load() && written.Load() > 0 {
			return syscall.ENOSPC
		}
		written.Add(int64(len(p)))
		return nil
	}, nil)

	s := newSegment(200_000, 52)
	src := newStepSource(s.b, 2)
	leader := get(t, c, s, src.Source)
	follower := get(t, c, s, noSource(t))
	close(src.step) // the second chunk meets a full disk
	for name, h := range map[string]*disk.Handle{"leader": leader, "follower": follower} {
		got, err := readRange(t, h, 0, -1)
		if !errors.Is(err, disk.ErrUnavailable) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("%s: err %v after %d bytes, want ErrUnavailable wrapping ENOSPC", name, err, len(got))
		}
	}
	if exists(disk.PathForTest(c, s.key)) || len(tmpFiles(t, dir)) != 0 {
		t.Fatal("the failed fill left a file")
	}
	// The cache steps aside until the retry interval passed.
	if _, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), noSource(t)); !errors.Is(err, disk.ErrUnavailable) {
		t.Fatalf("err %v, want a bypass after ENOSPC", err)
	}
	st := c.Stats()
	if st.FillErrors != 1 || st.BypassUnavailable != 1 || st.Reserved != 0 {
		t.Fatalf("stats %+v", st)
	}
	full.Store(false)
	clk.Add(time.Minute)
	mustRead(t, get(t, c, s, bytesSource(s.b, nil)), s.b)
}

func TestRangeReads(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(65_537, 60)
	fillNow(t, c, s)
	h := get(t, c, s, noSource(t))
	size := int64(len(s.b))
	for _, tc := range []struct{ off, n, wantEnd int64 }{
		{0, -1, size},
		{0, 1, 1},
		{100, 1000, 1100},
		{size - 1, 1, size},
		{size - 10, 100, size}, // clamped
		{size, -1, size},       // empty
		{500, -1, size},
	} {
		got, err := readRange(t, h, tc.off, tc.n)
		if err != nil || !bytes.Equal(got, s.b[tc.off:tc.wantEnd]) {
			t.Fatalf("range (%d, %d): %d bytes, err %v", tc.off, tc.n, len(got), err)
		}
	}
	if _, err := h.Reader(context.Background(), size+1, 1); err == nil {
		t.Fatal("an offset past the end was accepted")
	}
	if _, err := h.Reader(context.Background(), -1, 1); err == nil {
		t.Fatal("a negative offset was accepted")
	}
}

func TestCloseFailsRunningFill(t *testing.T) {
	dir := t.TempDir()
	c, _ := disk.New(disk.Options{Dir: dir})
	s := newSegment(10_000, 70)
	src := newStepSource(s.b, 2)
	h := get(t, c, s, src.Source)
	c.Close() // cancels the fill's context; the source returns
	if _, err := readRange(t, h, 0, -1); !errors.Is(err, context.Canceled) || !errors.Is(err, disk.ErrUnavailable) {
		t.Fatalf("err %v, want the fill cancelled, as a cache fault", err)
	}
	if _, err := c.Get(context.Background(), idOf(s.id), 10_000, noSource(t)); !errors.Is(err, disk.ErrUnavailable) {
		t.Fatalf("Get after Close: %v", err)
	}
	if len(tmpFiles(t, dir)) != 0 {
		t.Fatal("temp file left after Close")
	}
}

func TestZeroLengthSegment(t *testing.T) {
	c := newCache(t, disk.Options{})
	s := newSegment(0, 0)
	h := get(t, c, s, bytesSource(nil, nil))
	mustRead(t, h, nil)
	if !get(t, c, s, noSource(t)).Hit() {
		t.Fatal("an empty segment was not cached")
	}
}

func TestInvalidArguments(t *testing.T) {
	if _, err := disk.New(disk.Options{}); err == nil {
		t.Fatal("New without a directory succeeded")
	}
	c := newCache(t, disk.Options{})
	for _, id := range []string{"", "sha256:abc", "sha256:" + string(bytes.Repeat([]byte("A"), 64)), "md5:" + string(bytes.Repeat([]byte("a"), 67))} {
		if _, err := c.Get(context.Background(), idOf(id), 1, noSource(t)); err == nil {
			t.Fatalf("id %q accepted", id)
		}
	}
	if _, err := c.Get(context.Background(), idOf(newSegment(1, 1).id), -1, noSource(t)); err == nil {
		t.Fatal("negative size accepted")
	}
}

// countFDs is the number of open descriptors of this process.
func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(ents)
}

func TestDescriptorsReturnToBaseline(t *testing.T) {
	dir := t.TempDir()
	exercise := func(seed uint64) {
		c, err := disk.New(disk.Options{Dir: dir, MaxBytes: 150_000})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 { // fills, hits, evictions
			s := newSegment(60_000, seed+uint64(i))
			for range 2 {
				h, err := c.Get(context.Background(), idOf(s.id), 60_000, bytesSource(s.b, nil))
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, must(h.Reader(context.Background(), 0, -1)))
				h.Close()
			}
		}
		// Followers of a fill, and a failed fill.
		s := newSegment(60_000, seed+10)
		src := newStepSource(s.b, 3)
		var hs []*disk.Handle
		for range 5 {
			h, err := c.Get(context.Background(), idOf(s.id), 60_000, src.Source)
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		close(src.step)
		for _, h := range hs {
			io.Copy(io.Discard, must(h.Reader(context.Background(), 0, -1)))
			h.Close()
		}
		bad := newSegment(60_000, seed+11)
		if h, err := c.Get(context.Background(), idOf(bad.id), 60_000, bytesSource(s.b, nil)); err == nil {
			io.Copy(io.Discard, must(h.Reader(context.Background(), 0, -1)))
			h.Close()
		}
		c.Close()
	}
	exercise(100) // warm up whatever the runtime opens once
	before := countFDs(t)
	exercise(200)
	if after := countFDs(t); after != before {
		t.Fatalf("open descriptors %d, want %d", after, before)
	}
}

func must(r io.Reader, err error) io.Reader {
	if err != nil {
		panic(err)
	}
	return r
}

// The case: 30 clients of a 48 MiB segment. They share one fill
// and read the file, so the Go heap allocated while all of them read it
// is a small fraction of one copy (a whole-blob read per client would
// allocate 30 × 48 MiB).
func TestThirtyReadersBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 96 MiB")
	}
	size, readers := 48<<20, 30
	if raceEnabled {
		size = 8 << 20
	}
	s := newSegment(size, 90)
	c := newCache(t, disk.Options{})
	chunked := func(ctx context.Context, w io.Writer) error {
		for off := 0; off < size; off += 1 << 20 {
			if _, err := w.Write(s.b[off : off+1<<20]); err != nil {
				return err
			}
		}
		return nil
	}
	run := func() {
		var wg sync.WaitGroup
		for range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h, err := c.Get(context.Background(), idOf(s.id), int64(size), chunked)
				if err != nil {
					t.Error(err)
					return
				}
				defer h.Close()
				r, err := h.Reader(context.Background(), 0, -1)
				if err != nil {
					t.Error(err)
					return
				}
				if n, err := io.Copy(io.Discard, r); err != nil || n != int64(size) {
					t.Errorf("read %d bytes: %v", n, err)
				}
			}()
		}
		wg.Wait()
	}
	measure := func(f func()) uint64 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	fill := measure(run) // one fill, 29 followers or hits
	hits := measure(run) // 30 hits
	t.Logf("%d readers × %d MiB: TotalAlloc %.2f MiB during the fill, %.2f MiB from the complete file",
		readers, size>>20, float64(fill)/(1<<20), float64(hits)/(1<<20))
	if st := c.Stats(); st.Fills != 1 || st.Hits < uint64(readers) {
		t.Fatalf("stats %+v", st)
	}
	if fill >= 16<<20 || hits >= 16<<20 {
		t.Fatalf("allocated %d and %d bytes, want < 16 MiB each", fill, hits)
	}
}

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
