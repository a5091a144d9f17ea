package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// clock is an injected clock for the cache's record ages and backoffs.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.UnixMilli(1_750_000_000_000)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// faultStore is a countingStore whose calls can be made to fail with an
// injected error or to hang until their context ends, as a store that is
// down, stopped or unreachable does. Bodies are plain streams.
type faultStore struct {
	*countingStore
	mu      sync.Mutex
	err     error // returned by every call while set
	hang    bool  // calls block until their context ends
	probes  int   // lookups of probeID
	running atomic.Int64
}

func newFaultStore() *faultStore { return &faultStore{countingStore: newCountingStore()} }

func (f *faultStore) set(err error, hang bool) {
	f.mu.Lock()
	f.err, f.hang = err, hang
	f.mu.Unlock()
}

func (f *faultStore) fault(ctx context.Context) error {
	f.running.Add(1)
	defer f.running.Add(-1)
	f.mu.Lock()
	err, hang := f.err, f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return fmt.Errorf("fault store: %w", ctx.Err())
	}
	return err
}

func (f *faultStore) Lookup(ctx context.Context, pid segid.ID) (*Record, error) {
	id := pid.String()
	if pid == probeID {
		f.mu.Lock()
		f.probes++
		f.mu.Unlock()
	}
	if err := f.fault(ctx); err != nil {
		f.countingStore.mu.Lock()
		f.countingStore.lookups++
		f.countingStore.mu.Unlock()
		return nil, err
	}
	return f.countingStore.Lookup(ctx, idOf(id))
}

func (f *faultStore) Open(ctx context.Context, pid segid.ID, off, n int64) (io.ReadCloser, error) {
	id := pid.String()
	if err := f.fault(ctx); err != nil {
		f.countingStore.mu.Lock()
		f.countingStore.opens++
		f.countingStore.mu.Unlock()
		return nil, err
	}
	rc, err := f.countingStore.Open(ctx, idOf(id), off, n)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(rc), nil
}

func (f *faultStore) probeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.probes
}

// errUnreachable is an unreadable store's error: no answer arrived (store/s3's
// TestUnreadableS3 checks the S3 store's own errors).
var errUnreachable = fmt.Errorf("store: s3 HeadObject k: connection refused: %w", syscall.ECONNREFUSED)

// errDenied is a store's answer refusing the request, as the S3 store
// returns an HTTP 403 AccessDenied.
var errDenied = fmt.Errorf("store: s3 HeadObject k: HTTP 403 AccessDenied: %w", ErrRefused)

func TestUnreadable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrNotFound, false},
		{fmt.Errorf("wrapped: %w", ErrNotFound), false},
		{fmt.Errorf("store: x: %w", ErrCorruptSegment), false},
		{fmt.Errorf("store: s3 record of x: %w: bad", ErrCorruptRecord), false},
		{&RangeNotSatisfiableError{Size: -1}, false},
		{errDenied, false},
		{fmt.Errorf("store: cache: %w", context.Canceled), false},
		{errUnreachable, true},
		{context.DeadlineExceeded, true},
		{errors.New("store: sqlite: database file unavailable: no such file or directory"), true},
		{errors.New("store: sqlite lookup: disk I/O error (10)"), true},
		{ErrStoreDown, true},
	} {
		if got := Unreadable(tc.err); got != tc.want {
			t.Errorf("Unreadable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestCachedGrace: while the store cannot be read, a record read less than
// Grace ago answers Lookup (grace true); an older one, or an answer of the
// store (not found, a corrupt record), does not; Grace 0 turns it off.
func TestCachedGrace(t *testing.T) {
	for _, grace := range []time.Duration{time.Minute, 0} {
		t.Run(fmt.Sprint("grace ", grace), func(t *testing.T) {
			fs := newFaultStore()
			id := fs.add(seg(100, 1))
			clk := newClock()
			opts := DefaultCacheOptions()
			opts.Now, opts.Grace = clk.Now, grace
			opts.BreakerFailures = 1000 // this test is not about the breaker
			c := NewCached(fs, opts)
			defer c.Stop()
			ctx := context.Background()
			rec, g, err := lookupGrace(c, ctx, id)
			if err != nil || g {
				t.Fatalf("healthy lookup: grace %v, %v", g, err)
			}
			fs.set(errUnreachable, false)
			clk.Advance(opts.RecordTTL) // the record is stale
			got, g, err := lookupGrace(c, ctx, id)
			if grace == 0 {
				if !errors.Is(err, errUnreachable) || got != nil || g {
					t.Fatalf("grace off: got %v, grace %v, err %v; want the fault", got, g, err)
				}
				return
			}
			if err != nil || !g || got != rec {
				t.Fatalf("store down within grace: got %v, grace %v, err %v; want the record read before", got, g, err)
			}
			// The grace record is not taken for a fresh read.
			if _, ok, err := c.Revalidate(ctx, idOf(id), got); ok || err == nil {
				t.Fatalf("revalidating a grace record during the outage: ok %v, err %v", ok, err)
			}
			if s := c.Stats(); s.GraceHits != 1 {
				t.Fatalf("GraceHits %d, want 1", s.GraceHits)
			}
			clk.Advance(grace) // read RecordTTL+grace ago: past grace
			if _, g, err := lookupGrace(c, ctx, id); err == nil || g {
				t.Fatalf("past grace: grace %v, err %v; want the fault", g, err)
			}
			// An answer of the store is never overridden by grace.
			clk.Advance(-grace)
			for _, answer := range []error{fmt.Errorf("store: %w: bad", ErrCorruptRecord),
				errDenied, ErrNotFound} {
				fs.set(answer, false)
				if _, g, err := lookupGrace(c, ctx, id); g || !errors.Is(err, answer) {
					t.Fatalf("store answered %v: grace %v, err %v", answer, g, err)
				}
			}
		})
	}
}

// TestCachedBreaker: after BreakerFailures unreadable calls in a row the
// store is not called any more (ErrStoreDown at once, bytes held in memory
// still served), one background probe runs until the store answers, and
// then everything is read again. OnBreaker hears both transitions.
func TestCachedBreaker(t *testing.T) {
	fs := newFaultStore()
	held := fs.add(seg(100, 2))
	other := fs.add(seg(100, 3))
	opts := DefaultCacheOptions()
	opts.ProbeInterval = 5 * time.Millisecond
	opts.Timeout = 200 * time.Millisecond
	var (
		mu     sync.Mutex
		events []string
	)
	opts.OnBreaker = func(open bool, cause error) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, fmt.Sprintf("open=%v cause=%v", open, cause != nil))
	}
	c := NewCached(fs, opts)
	defer c.Stop()
	ctx := context.Background()
	if _, err := c.Lookup(ctx, idOf(held)); err != nil {
		t.Fatal(err)
	}
	openAll(t, c, ctx, held, 0, -1) // held in memory now

	fs.set(errUnreachable, false)
	tripped := time.Now()
	for i := range DefaultBreakerFailures {
		// Distinct ids: nothing coalesces, each is one failed call.
		sum := fmt.Sprintf("sha256:%064x", i+1)
		if _, err := c.Lookup(ctx, idOf(sum)); !errors.Is(err, errUnreachable) {
			t.Fatalf("call %d: %v, want the store's fault", i+1, err)
		}
	}
	if !c.BreakerOpen() {
		t.Fatal("breaker still closed after the failures")
	}
	if since, open := c.BreakerOpenSince(); !open || since.Before(tripped) || time.Since(since) > time.Second {
		t.Fatalf("BreakerOpenSince %v %v, want open since %v", since, open, tripped)
	}
	fs.set(nil, true) // the store hangs now: a call would wait Timeout
	lookups, opens := fs.counts()
	start := time.Now()
	if _, err := c.Lookup(ctx, idOf(other)); !errors.Is(err, ErrStoreDown) {
		t.Fatalf("lookup with the breaker open: %v", err)
	}
	if rc, err := c.Open(ctx, idOf(other), 0, -1); !errors.Is(err, ErrStoreDown) {
		if rc != nil {
			rc.Close()
		}
		t.Fatalf("open of bytes not held, breaker open: %v", err)
	}
	if b := openAll(t, c, ctx, held, 0, -1); len(b) != 100 {
		t.Fatalf("bytes held in memory: %d bytes", len(b))
	}
	if took := time.Since(start); took >= opts.Timeout {
		t.Fatalf("answers with the breaker open took %v: they waited on the store", took)
	}
	if l, o := fs.counts(); l != lookups || o != opens {
		t.Fatalf("the breaker let %d lookups and %d opens through", l-lookups, o-opens)
	}
	if s := c.Stats(); !s.BreakerOpen || s.BreakerTrips != 1 || s.FastFailures < 2 {
		t.Fatalf("stats %+v", s)
	}
	// The probe keeps trying (each probe times out on the hung store).
	waitFor(t, "probes of the hung store", func() bool { return fs.probeCount() >= 2 })
	fs.set(nil, false)
	waitFor(t, "the breaker to close", func() bool { return !c.BreakerOpen() })
	if _, open := c.BreakerOpenSince(); open {
		t.Fatal("BreakerOpenSince open after the breaker closed")
	}
	if _, err := c.Lookup(ctx, idOf(other)); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	mu.Lock()
	got := fmt.Sprint(events)
	mu.Unlock()
	if got != "[open=true cause=true open=false cause=false]" {
		t.Fatalf("OnBreaker events %s", got)
	}
	// Answers reset the count: failures apart from each other never open it.
	for i := range 2 * DefaultBreakerFailures {
		fs.set(errUnreachable, false)
		c.Lookup(ctx, idOf(fmt.Sprintf("sha256:%064x", 100+i)))
		fs.set(nil, false)
		c.Lookup(ctx, idOf(fmt.Sprintf("sha256:%064x", 200+i))) // not found: an answer
	}
	if c.BreakerOpen() || c.Stats().BreakerTrips != 1 {
		t.Fatal("failures separated by answers opened the breaker")
	}
}

// TestCachedStopEndsProbe: Stop ends the probe of an open breaker, even one
// waiting on a hung store, and no probe starts after it, so a config
// reload that drops a Cached leaves no goroutine behind.
func TestCachedStopEndsProbe(t *testing.T) {
	before := runtime.NumGoroutine()
	fs := newFaultStore()
	opts := DefaultCacheOptions()
	opts.ProbeInterval = time.Millisecond
	opts.Timeout = time.Hour // the probe waits on the hung store until Stop
	c := NewCached(fs, opts)
	fs.set(errUnreachable, false)
	for i := range DefaultBreakerFailures {
		c.Lookup(context.Background(), idOf(fmt.Sprintf("sha256:%064x", i+1)))
	}
	fs.set(nil, true)
	waitFor(t, "the probe to wait on the store", func() bool { return fs.probeCount() >= 1 && fs.running.Load() == 1 })
	done := make(chan struct{})
	go func() { c.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not end the probe")
	}
	if n := fs.running.Load(); n != 0 {
		t.Fatalf("%d store calls still running after Stop", n)
	}
	// After Stop, failures no longer start a probe.
	fs.set(errUnreachable, false)
	c.brk.open.Store(false)
	c.brk.fails.Store(0)
	for i := range 2 * DefaultBreakerFailures {
		c.Lookup(context.Background(), idOf(fmt.Sprintf("sha256:%064x", 50+i)))
	}
	p := fs.probeCount()
	time.Sleep(20 * time.Millisecond)
	if fs.probeCount() != p || c.BreakerOpen() {
		t.Fatal("a probe started after Stop")
	}
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestCachedRefusalMemo: a refusal remembered on a fresh record answers
// RefusedRecently for that reason only, for at most RefusalWindow and never
// longer than RecordTTL, and is forgotten when the record is read again.
func TestCachedRefusalMemo(t *testing.T) {
	for _, ttl := range []time.Duration{DefaultRecordTTL, 300 * time.Millisecond, 0} {
		t.Run(fmt.Sprint("record_ttl ", ttl), func(t *testing.T) {
			cs := newCountingStore()
			id := cs.add(seg(10, 4))
			clk := newClock()
			opts := DefaultCacheOptions()
			opts.Now, opts.RecordTTL = clk.Now, ttl
			c := NewCached(cs, opts)
			defer c.Stop()
			ctx := context.Background()
			rec, err := c.Lookup(ctx, idOf(id))
			if err != nil {
				t.Fatal(err)
			}
			c.RememberRefusal(idOf(id), rec, ReasonExpired)
			window := min(RefusalWindow, ttl)
			if got := c.RefusedRecently(idOf(id), rec, ReasonExpired); got != (window > 0) {
				t.Fatalf("just remembered: %v (window %v)", got, window)
			}
			if c.RefusedRecently(idOf(id), rec, ReasonScope) || c.RefusedRecently(idOf(id), rec, ReasonNone) {
				t.Fatal("another reason was remembered")
			}
			if window == 0 {
				return
			}
			clk.Advance(window - time.Millisecond)
			if !c.RefusedRecently(idOf(id), rec, ReasonExpired) {
				t.Fatal("forgotten inside the window")
			}
			clk.Advance(time.Millisecond)
			if c.RefusedRecently(idOf(id), rec, ReasonExpired) {
				t.Fatal("remembered past the window")
			}
			// A new read replaces the record and forgets its refusals.
			cs.mu.Lock()
			cp := *cs.recs[id]
			cs.recs[id] = &cp
			cs.mu.Unlock()
			clk.Advance(ttl)
			fresh, err := c.Lookup(ctx, idOf(id))
			if err != nil || fresh != &cp {
				t.Fatalf("expected a fresh read: %v", err)
			}
			c.RememberRefusal(idOf(id), rec, ReasonExpired) // the old record: ignored
			if c.RefusedRecently(idOf(id), fresh, ReasonExpired) || c.RefusedRecently(idOf(id), rec, ReasonExpired) {
				t.Fatal("a refusal on a replaced record was remembered")
			}
			if s := c.Stats(); s.RefusalHits != 2 {
				t.Fatalf("RefusalHits %d, want 2", s.RefusalHits)
			}
		})
	}
}

// TestCachedMissMemo: an id a fresh read found absent is answered
// ErrNotFound without a read for the refusal window, then read again.
func TestCachedMissMemo(t *testing.T) {
	cs := newCountingStore()
	clk := newClock()
	opts := DefaultCacheOptions()
	opts.Now = clk.Now
	c := NewCached(cs, opts)
	defer c.Stop()
	ctx := context.Background()
	b := seg(10, 5)
	id := segID(b)
	for range 100 {
		if _, err := c.Lookup(ctx, idOf(id)); !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
	}
	if l, _ := cs.counts(); l != 1 {
		t.Fatalf("100 lookups of an absent id in the window: %d store reads, want 1", l)
	}
	cs.add(b)
	clk.Advance(RefusalWindow)
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

// TestCachedCorruptBackoff: store bytes that fail verification are not read
// again for CorruptBackoff, doubling with each failure up to
// CorruptBackoffMax; bytes that verify clear it. Through the memory tier,
// the disk tier and a verified stream from the store.
func TestCachedCorruptBackoff(t *testing.T) {
	for _, tier := range []string{"memory", "disk", "stream"} {
		t.Run(tier, func(t *testing.T) {
			cs := newCountingStore()
			good := randomBytes(2<<20, 9)
			bad := append([]byte(nil), good...)
			bad[len(bad)-10] ^= 1
			id := segID(good)
			cs.add(bad, id)
			clk := newClock()
			var c *Cached
			switch tier {
			case "memory":
				opts := DefaultCacheOptions()
				opts.Now = clk.Now
				c = NewCached(cs, opts)
			case "disk", "stream":
				dir := t.TempDir()
				if tier == "stream" {
					dir = ""
				}
				c, _ = tierCache(t, streamStore{cs}, dir)
				c.opts.Now = clk.Now
			}
			defer c.Stop()
			c.opts.CorruptBackoff, c.opts.CorruptBackoffMax = 30*time.Second, 100*time.Second
			ctx := context.Background()
			if _, err := c.Lookup(ctx, idOf(id)); err != nil {
				t.Fatal(err)
			}
			reads := func() int { _, o := cs.counts(); return o }
			// try opens and reads the whole segment: corrupt, backing off, or ok.
			try := func() string {
				rc, err := c.Open(ctx, idOf(id), 0, -1)
				if err == nil {
					_, err = io.ReadAll(rc)
					rc.Close()
				}
				switch {
				case err == nil:
					return "ok"
				case errors.Is(err, ErrCorruptBackoff):
					return "backoff"
				case errors.Is(err, ErrCorruptSegment):
					return "corrupt"
				}
				return err.Error()
			}
			step := func(advance time.Duration, want string, wantReads int) {
				t.Helper()
				clk.Advance(advance)
				if got := try(); got != want {
					t.Fatalf("after +%v: %s, want %s", advance, got, want)
				}
				if r := reads(); r != wantReads {
					t.Fatalf("after +%v: %d store reads, want %d", advance, r, wantReads)
				}
			}
			step(0, "corrupt", 1)
			for range 10 {
				step(0, "backoff", 1)
			}
			step(29*time.Second, "backoff", 1)
			step(time.Second, "corrupt", 2) // 30 s: read again, still bad
			step(59*time.Second, "backoff", 2)
			step(time.Second, "corrupt", 3)     // 60 s
			step(100*time.Second, "corrupt", 4) // 120 s capped at 100 s
			step(99*time.Second, "backoff", 4)
			cs.mu.Lock()
			cs.data[id] = good // repaired
			cs.mu.Unlock()
			step(time.Second, "ok", 5)
			if c.corrupt.n.Load() != 0 {
				t.Fatal("bytes that verified did not clear the backoff")
			}
			if s := c.Stats(); s.CorruptBackoffs != 13 {
				t.Fatalf("CorruptBackoffs %d, want 13", s.CorruptBackoffs)
			}
		})
	}
}

// lookupGrace is LookupFrom, with grace true for a RecordGrace answer.
func lookupGrace(c *Cached, ctx context.Context, id string) (*Record, bool, error) {
	rec, src, err := c.LookupFrom(ctx, idOf(id))
	return rec, src == RecordGrace, err
}
