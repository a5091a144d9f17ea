package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// countingStore is an in-memory Store that counts inner calls and can hold
// them at a gate, so tests can line up concurrent callers deterministically.
type countingStore struct {
	mu      sync.Mutex
	recs    map[string]*Record
	data    map[string][]byte
	lookups int
	opens   int
	gate    chan struct{} // when non-nil, calls wait for it to close
	started chan string   // when non-nil, receives "lookup"/"open" on entry
	// ctxErrs records, per finished inner call, the context's error at
	// completion (a shared call must not be canceled by one caller).
	ctxErrs []error
}

func newCountingStore() *countingStore {
	return &countingStore{recs: map[string]*Record{}, data: map[string][]byte{}}
}

func segID(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// add stores b under its id (or under id when given, to plant corruption).
func (s *countingStore) add(b []byte, id ...string) string {
	i := segID(b)
	if len(id) > 0 {
		i = id[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs[i] = &Record{SegmentID: i, ByteLength: int64(len(b)), MediaType: MediaRows}
	s.data[i] = b
	return i
}

func (s *countingStore) hold(ctx context.Context, op string) error {
	s.mu.Lock()
	gate, started := s.gate, s.started
	s.mu.Unlock()
	if started != nil {
		started <- op
	}
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *countingStore) done(ctx context.Context) {
	s.mu.Lock()
	s.ctxErrs = append(s.ctxErrs, ctx.Err())
	s.mu.Unlock()
}

func (s *countingStore) Lookup(ctx context.Context, pid segid.ID) (*Record, error) {
	id := pid.String()
	s.mu.Lock()
	s.lookups++
	s.mu.Unlock()
	defer s.done(ctx)
	if err := s.hold(ctx, "lookup"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.recs[id]; ok {
		return r, nil
	}
	return nil, ErrNotFound
}

func (s *countingStore) Open(ctx context.Context, pid segid.ID, off, n int64) (io.ReadCloser, error) {
	id := pid.String()
	s.mu.Lock()
	s.opens++
	s.mu.Unlock()
	defer s.done(ctx)
	if err := s.hold(ctx, "open"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	b, ok := s.data[id]
	s.mu.Unlock()
	if !ok {
		return nil, ErrNotFound
	}
	return sliceReader(b, off, n), nil
}

func (s *countingStore) Close() error { return nil }

// sliceReader reads b[off:off+n] (n < 0: to the end), clamped to b.
func sliceReader(b []byte, off, n int64) io.ReadCloser {
	return io.NopCloser(bytes.NewReader(clamp(b, off, n)))
}

func (s *countingStore) counts() (lookups, opens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups, s.opens
}

func (s *countingStore) setGate(g chan struct{}) {
	s.mu.Lock()
	s.gate = g
	s.mu.Unlock()
}

func readAll(t *testing.T, rc io.ReadCloser, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func openAll(t *testing.T, c *Cached, ctx context.Context, id string, off, n int64) []byte {
	t.Helper()
	rc, err := c.Open(ctx, idOf(id), off, n)
	return readAll(t, rc, err)
}

func seg(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCachedOpenCoalesces(t *testing.T) {
	inner := newCountingStore()
	data := seg(64<<10, 1)
	id := inner.add(data)
	c := NewCached(inner, DefaultCacheOptions())
	ctx := context.Background()
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatal(err)
	}

	gate := make(chan struct{})
	inner.setGate(gate)
	const n = 50
	var wg sync.WaitGroup
	results := make([][]byte, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc, err := c.Open(ctx, idOf(id), 0, -1)
			if err != nil {
				errs[i] = err
				return
			}
			results[i], errs[i] = io.ReadAll(rc)
			rc.Close()
		}()
	}
	waitFor(t, "all callers attached", func() bool { return c.fills.waiting(id) == n })
	close(gate)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !bytes.Equal(results[i], data) {
			t.Fatalf("caller %d: err %v, %d bytes", i, errs[i], len(results[i]))
		}
	}
	if _, opens := inner.counts(); opens != 1 {
		t.Fatalf("%d concurrent Opens of one uncached segment made %d inner Opens, want 1", n, opens)
	}
	if got := c.Stats().Coalesced; got != n-1 {
		t.Fatalf("Coalesced = %d, want %d (every caller but the first joined)", got, n-1)
	}
	// A later Open, with a Range, is a hit.
	got := openAll(t, c, ctx, id, 100, 10)
	if !bytes.Equal(got, data[100:110]) {
		t.Fatal("range from cache differs")
	}
	if _, opens := inner.counts(); opens != 1 {
		t.Fatalf("cached Open read the store (%d opens)", opens)
	}
}

func TestCachedLookupCoalescesAndExpires(t *testing.T) {
	inner := newCountingStore()
	id := inner.add(seg(100, 2))
	now := time.Unix(1_750_000_000, 0)
	var clockMu sync.Mutex
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	advance := func(d time.Duration) { clockMu.Lock(); now = now.Add(d); clockMu.Unlock() }
	opts := DefaultCacheOptions()
	opts.Now = clock
	c := NewCached(inner, opts)
	ctx := context.Background()

	gate := make(chan struct{})
	inner.setGate(gate)
	const n = 20
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rec, err := c.Lookup(ctx, idOf(id)); err != nil || rec.SegmentID != id {
				t.Errorf("lookup: %v", err)
			}
		}()
	}
	waitFor(t, "all callers attached", func() bool { return c.lookups.waiting(id) == n })
	close(gate)
	wg.Wait()
	if l, _ := inner.counts(); l != 1 {
		t.Fatalf("%d concurrent Lookups made %d inner Lookups, want 1", n, l)
	}

	advance(opts.RecordTTL - time.Millisecond)
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatal(err)
	}
	if l, _ := inner.counts(); l != 1 {
		t.Fatalf("lookup within the TTL read the store (%d lookups)", l)
	}
	advance(time.Millisecond)
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatal(err)
	}
	if l, _ := inner.counts(); l != 2 {
		t.Fatalf("lookup at the TTL did not refetch (%d lookups, want 2)", l)
	}

	// A record deleted from the store is seen no longer than the TTL.
	inner.mu.Lock()
	delete(inner.recs, id)
	inner.mu.Unlock()
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatalf("within the TTL the cached record is served: %v", err)
	}
	advance(opts.RecordTTL)
	if _, err := c.Lookup(ctx, idOf(id)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after the TTL a deleted record is ErrNotFound, got %v", err)
	}
}

func TestCachedRecordTTLZeroAlwaysReads(t *testing.T) {
	inner := newCountingStore()
	id := inner.add(seg(10, 3))
	opts := DefaultCacheOptions()
	opts.RecordTTL = 0
	c := NewCached(inner, opts)
	for range 3 {
		if _, err := c.Lookup(context.Background(), idOf(id)); err != nil {
			t.Fatal(err)
		}
	}
	if l, _ := inner.counts(); l != 3 {
		t.Fatalf("record_ttl 0: %d inner lookups, want 3", l)
	}
	// The bytes cache still knows the length and caches.
	for range 3 {
		openAll(t, c, context.Background(), id, 0, -1)
	}
	if _, o := inner.counts(); o != 1 {
		t.Fatalf("record_ttl 0: %d inner opens, want 1", o)
	}
}

func TestCachedDisconnectDoesNotCancelShared(t *testing.T) {
	inner := newCountingStore()
	data := seg(4096, 4)
	id := inner.add(data)
	c := NewCached(inner, DefaultCacheOptions())
	if _, err := c.Lookup(context.Background(), idOf(id)); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	inner.setGate(gate)

	// The first caller starts the shared read, then disconnects.
	ctxA, cancelA := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() {
		rc, err := c.Open(ctxA, idOf(id), 0, -1)
		if err == nil {
			rc.Close()
		}
		errA <- err
	}()
	waitFor(t, "first caller attached", func() bool { return c.fills.waiting(id) == 1 })
	type res struct {
		b   []byte
		err error
	}
	resB := make(chan res, 1)
	go func() {
		rc, err := c.Open(context.Background(), idOf(id), 0, -1)
		if err != nil {
			resB <- res{nil, err}
			return
		}
		b, err := io.ReadAll(rc)
		resB <- res{b, err}
	}()
	waitFor(t, "second caller attached", func() bool { return c.fills.waiting(id) == 2 })
	cancelA()
	select {
	case err := <-errA:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("disconnected caller got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("disconnected caller still waiting")
	}
	close(gate)
	r := <-resB
	if r.err != nil || !bytes.Equal(r.b, data) {
		t.Fatalf("remaining caller: %v (%d bytes)", r.err, len(r.b))
	}
	inner.mu.Lock()
	defer inner.mu.Unlock()
	if inner.opens != 1 {
		t.Fatalf("%d inner opens, want 1", inner.opens)
	}
	for _, e := range inner.ctxErrs {
		if e != nil {
			t.Fatalf("the shared read's context ended: %v", e)
		}
	}
}

func TestCachedSharedCallTimeout(t *testing.T) {
	inner := newCountingStore()
	id := inner.add(seg(10, 5))
	opts := DefaultCacheOptions()
	opts.Timeout = 20 * time.Millisecond
	c := NewCached(inner, opts)
	inner.setGate(make(chan struct{})) // never opens
	_, err := c.Lookup(context.Background(), idOf(id))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stuck store: %v, want DeadlineExceeded", err)
	}
}

func TestCachedByteBudget(t *testing.T) {
	inner := newCountingStore()
	opts := DefaultCacheOptions()
	opts.MaxBytes = 100
	opts.MaxEntry = 40
	c := NewCached(inner, opts)
	ctx := context.Background()
	var ids []string
	for i := range 10 {
		id := inner.add(seg(30, byte(10+i)))
		ids = append(ids, id)
		if _, err := c.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
		openAll(t, c, ctx, id, 0, -1)
		if used := c.Stats().Bytes; used > opts.MaxBytes {
			t.Fatalf("after %d fills the cache holds %d bytes, budget %d", i+1, used, opts.MaxBytes)
		}
		// Keep the first segment hot: it must survive every eviction.
		openAll(t, c, ctx, ids[0], 0, -1)
	}
	if used := c.Stats().Bytes; used != 90 {
		t.Fatalf("cache holds %d bytes, want 90 (three 30-byte entries)", used)
	}
	if ev := c.Stats().ByteEvictions; ev != 7 {
		t.Fatalf("ByteEvictions = %d, want 7 (ten 30-byte fills, three kept)", ev)
	}
	_, opens := inner.counts()
	openAll(t, c, ctx, ids[0], 0, -1)
	openAll(t, c, ctx, ids[9], 0, -1)
	if _, o := inner.counts(); o != opens {
		t.Fatal("the most recently used entries were evicted")
	}
	openAll(t, c, ctx, ids[1], 0, -1)
	if _, o := inner.counts(); o != opens+1 {
		t.Fatal("a least recently used entry was not evicted")
	}

	// Larger than MaxEntry: streamed from the store every time, with the
	// caller's range.
	big := seg(41, 99)
	bid := inner.add(big)
	if _, err := c.Lookup(ctx, idOf(bid)); err != nil {
		t.Fatal(err)
	}
	_, opens = inner.counts()
	for range 3 {
		got := openAll(t, c, ctx, bid, 5, 10)
		if !bytes.Equal(got, big[5:15]) {
			t.Fatal("pass-through range differs")
		}
	}
	if _, o := inner.counts(); o != opens+3 {
		t.Fatalf("large segment: %d inner opens, want 3", o-opens)
	}
	if used := c.Stats().Bytes; used > opts.MaxBytes {
		t.Fatalf("cache holds %d bytes", used)
	}
}

func TestCachedCorruptBytes(t *testing.T) {
	inner := newCountingStore()
	good := seg(1000, 6)
	id := segID(good)
	bad := append([]byte(nil), good...)
	bad[500] ^= 1
	inner.add(bad, id) // the store returns other bytes under the id
	short := seg(1000, 7)
	sid := segID(short)
	inner.add(short, sid)
	inner.mu.Lock()
	inner.recs[sid].ByteLength = 1001 // record says longer than the object
	inner.mu.Unlock()

	c := NewCached(inner, DefaultCacheOptions())
	ctx := context.Background()
	for _, i := range []string{id, sid} {
		if _, err := c.Lookup(ctx, idOf(i)); err != nil {
			t.Fatal(err)
		}
		for k := range 2 {
			rc, err := c.Open(ctx, idOf(i), 0, -1)
			if !errors.Is(err, ErrCorruptSegment) {
				if rc != nil {
					rc.Close()
				}
				t.Fatalf("corrupt bytes: Open returned %v, want ErrCorruptSegment", err)
			}
			// The second Open backs off instead of reading them again.
			if got := errors.Is(err, ErrCorruptBackoff); got != (k == 1) {
				t.Fatalf("Open %d: backing off %v (%v)", k+1, got, err)
			}
		}
	}
	if _, o := inner.counts(); o != 2 {
		t.Fatalf("%d inner opens, want 2 (corrupt bytes are neither cached nor read again at once)", o)
	}
	if used := c.Stats().Bytes; used != 0 {
		t.Fatalf("cache holds %d bytes after failed fills", used)
	}
}

func TestCachedNotFoundCannotEvict(t *testing.T) {
	inner := newCountingStore()
	opts := DefaultCacheOptions()
	opts.MaxRecords = 4
	clk := newClock()
	opts.Now = clk.Now
	c := NewCached(inner, opts)
	ctx := context.Background()
	var ids []string
	for i := range 4 {
		id := inner.add(seg(10, byte(40+i)))
		ids = append(ids, id)
		if _, err := c.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 {
		sum := sha256.Sum256([]byte(fmt.Sprint("random", i)))
		if _, err := c.Lookup(ctx, idOf("sha256:"+hex.EncodeToString(sum[:]))); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown id: %v", err)
		}
	}
	before, _ := inner.counts()
	for _, id := range ids {
		if _, err := c.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
	}
	if after, _ := inner.counts(); after != before {
		t.Fatalf("misses evicted real records: %d re-reads", after-before)
	}
	if n := c.Stats().Records; n != 4 {
		t.Fatalf("record cache holds %d entries, want 4", n)
	}
	// Misses are not cached as records: an id published later is found
	// once the refusal window of the read that missed it has passed.
	late := seg(10, 77)
	lid := segID(late)
	if _, err := c.Lookup(ctx, idOf(lid)); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	inner.add(late)
	clk.Advance(RefusalWindow)
	if _, err := c.Lookup(ctx, idOf(lid)); err != nil {
		t.Fatalf("a miss was remembered past the refusal window: %v", err)
	}
}

func TestCachedDisabled(t *testing.T) {
	inner := newCountingStore()
	id := inner.add(seg(10, 8))
	c := NewCached(inner, CacheOptions{})
	ctx := context.Background()
	for range 3 {
		if _, err := c.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
		openAll(t, c, ctx, id, 0, -1)
	}
	if l, o := inner.counts(); l != 3 || o != 3 {
		t.Fatalf("zero options cached something: %d lookups, %d opens", l, o)
	}
}

func TestSliceReader(t *testing.T) {
	b := []byte("0123456789")
	for _, tc := range []struct {
		off, n int64
		want   string
	}{
		{0, -1, "0123456789"}, {3, 4, "3456"}, {8, 10, "89"}, {10, 1, ""}, {20, -1, ""}, {0, 0, ""},
	} {
		got, _ := io.ReadAll(sliceReader(b, tc.off, tc.n))
		if string(got) != tc.want {
			t.Errorf("(%d,%d) = %q, want %q", tc.off, tc.n, got, tc.want)
		}
	}
}

func TestCachedRevalidate(t *testing.T) {
	inner := newCountingStore()
	id := inner.add(seg(10, 9))
	c := NewCached(inner, DefaultCacheOptions())
	ctx := context.Background()
	rec, err := c.Lookup(ctx, idOf(id)) // a miss: read now
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.Revalidate(ctx, idOf(id), rec); ok || err != nil {
		t.Fatalf("a record just read was re-read (ok %v, err %v)", ok, err)
	}
	if l, _ := inner.counts(); l != 1 {
		t.Fatalf("%d lookups, want 1", l)
	}
	hit, err := c.Lookup(ctx, idOf(id)) // a hit: may be stale
	if err != nil || hit != rec {
		t.Fatal("expected a cache hit")
	}
	inner.mu.Lock()
	newer := &Record{SegmentID: id, ByteLength: 10, MediaType: MediaSQLite}
	inner.recs[id] = newer
	inner.mu.Unlock()
	fresh, ok, err := c.Revalidate(ctx, idOf(id), hit)
	if err != nil || !ok || fresh != newer {
		t.Fatalf("revalidate: %v %v %v", fresh, ok, err)
	}
	if l, _ := inner.counts(); l != 2 {
		t.Fatalf("%d lookups, want 2", l)
	}
	// The cache now holds the newer record.
	if got, _ := c.Lookup(ctx, idOf(id)); got != newer {
		t.Fatal("revalidated record not cached")
	}
}

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
