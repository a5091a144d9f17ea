package caddymodule

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeReleaser is a memReleaser on an injected clock whose timers run
// only when the test says.
type fakeReleaser struct {
	*memReleaser
	mu     sync.Mutex
	clock  time.Time
	timers []time.Duration
	fns    []func()
	freed  int
}

func newFakeReleaser() *fakeReleaser {
	f := &fakeReleaser{clock: time.Unix(1_700_000_000, 0)}
	f.memReleaser = &memReleaser{
		free: func() { f.mu.Lock(); f.freed++; f.mu.Unlock() },
		after: func(d time.Duration, fn func()) {
			f.mu.Lock()
			f.timers = append(f.timers, d)
			f.fns = append(f.fns, fn)
			f.mu.Unlock()
		},
		now:   func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.clock },
		delay: memReleaseDelay,
		gap:   memReleaseGap,
	}
	return f
}

// fire advances the clock by the oldest pending timer's duration and
// runs it.
func (f *fakeReleaser) fire(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	if len(f.fns) == 0 {
		f.mu.Unlock()
		t.Fatal("no release pending")
	}
	d, fn := f.timers[0], f.fns[0]
	f.timers, f.fns = f.timers[1:], f.fns[1:]
	f.clock = f.clock.Add(d)
	f.mu.Unlock()
	fn()
}

func (f *fakeReleaser) pending() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.timers...)
}

// TestStreamSlotsReleaseMemoryAfterOverload: when the SQLite streams go
// idle after an answer was refused for lack of a slot, one release of
// the process's free memory is scheduled memReleaseDelay later; streams
// that never met the cap schedule none; a second overload soon after the
// first waits for memReleaseGap since the first release, and overloads
// while one is pending add none.
func TestStreamSlotsReleaseMemoryAfterOverload(t *testing.T) {
	f := newFakeReleaser()
	s := newStreamSlots(2, 0)
	s.mem = f.memReleaser
	ctx := context.Background()

	// Below the cap: streams come and go, nothing is scheduled.
	for range 3 {
		first := s.acquire(ctx, time.Second)
		second := s.acquire(ctx, time.Second)
		if !first || !second {
			t.Fatal("a slot was refused below the cap")
		}
		s.release()
		s.release()
	}
	if p := f.pending(); len(p) != 0 {
		t.Fatalf("streams below the cap scheduled a release: %v", p)
	}

	// At the cap with no waiting list: the next answer is refused.
	s.acquire(ctx, time.Second)
	s.acquire(ctx, time.Second)
	if s.acquire(ctx, time.Second) {
		t.Fatal("a third stream got a slot of 2")
	}
	s.release()
	if p := f.pending(); len(p) != 0 {
		t.Fatalf("a release was scheduled while a stream still runs: %v", p)
	}
	s.release()
	if p := f.pending(); len(p) != 1 || p[0] != memReleaseDelay {
		t.Fatalf("streams idle after an overload: pending releases %v, want [%v]", p, memReleaseDelay)
	}
	f.fire(t)
	if f.freed != 1 || f.releases() != 1 {
		t.Fatalf("freed %d times, want 1", f.freed)
	}

	// A second overload 2 s later: its release waits for the gap.
	f.clock = f.clock.Add(2 * time.Second)
	s.acquire(ctx, time.Second)
	s.acquire(ctx, time.Second)
	s.acquire(ctx, time.Second) // refused
	s.release()
	s.release()
	// A third overload while that release is pending adds none.
	s.acquire(ctx, time.Second)
	s.acquire(ctx, time.Second)
	s.acquire(ctx, time.Second) // refused
	s.release()
	s.release()
	if p := f.pending(); len(p) != 1 || p[0] != memReleaseGap-2*time.Second {
		t.Fatalf("overloads within the gap: pending releases %v, want [%v]", p, memReleaseGap-2*time.Second)
	}
	f.fire(t)
	if f.freed != 2 {
		t.Fatalf("freed %d times, want 2", f.freed)
	}
	if p := f.pending(); len(p) != 0 {
		t.Fatalf("releases left pending: %v", p)
	}
}

// TestStreamSlotsReleaseMemoryWhenWaitersLeave: a crowd whose last
// members are waiters that leave (their clients close) or time out, not
// streams that end, schedules the release too: the overload is seen at
// the refusal, the idle state at the last waiter's leaving.
func TestStreamSlotsReleaseMemoryWhenWaitersLeave(t *testing.T) {
	f := newFakeReleaser()
	s := newStreamSlots(1, 2)
	s.mem = f.memReleaser
	if !s.acquire(context.Background(), time.Second) {
		t.Fatal("no slot")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); s.acquire(ctx, time.Minute) }()
	}
	for s.waiting.Load() != 2 {
		time.Sleep(time.Millisecond)
	}
	if s.acquire(context.Background(), time.Minute) {
		t.Fatal("a stream got past a full waiting list")
	}
	s.release() // one waiter takes the slot (or both are still waiting)
	cancel()
	wg.Wait()
	for s.taken() != 0 {
		s.release() // the waiter that got the slot ends its stream
	}
	if p := f.pending(); len(p) != 1 {
		t.Fatalf("the crowd left: pending releases %v, want one", p)
	}

	// A waiter that times out is an overload of its own.
	f.fire(t)
	f.clock = f.clock.Add(time.Minute)
	s.acquire(context.Background(), time.Second)
	if s.acquire(context.Background(), 10*time.Millisecond) {
		t.Fatal("a waiter got a taken slot")
	}
	s.release()
	if p := f.pending(); len(p) != 1 || p[0] != memReleaseDelay {
		t.Fatalf("after a wait that timed out: pending releases %v, want [%v]", p, memReleaseDelay)
	}
}
