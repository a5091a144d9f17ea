package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// manualTimers replaces the gate's timers: fire ends every wait started.
type manualTimers struct {
	ch chan time.Time
}

func (m *manualTimers) install(g *fairGate) {
	m.ch = make(chan time.Time)
	g.timer = func(time.Duration) (<-chan time.Time, func() bool) {
		return m.ch, func() bool { return true }
	}
}

func (m *manualTimers) fire() { close(m.ch) }

// queueWaiter starts acquire for tenant on a goroutine and returns once it
// is in the waiting list; the result arrives on the channel.
type acquired struct {
	release func()
	err     error
}

func queueWaiter(t *testing.T, g *fairGate, ctx context.Context, tenant string) <-chan acquired {
	t.Helper()
	before := g.stats().Waiting
	ch := make(chan acquired, 1)
	go func() {
		rel, err := g.acquire(WithTenant(ctx, tenant))
		ch <- acquired{rel, err}
	}()
	waitFor(t, "waiter queued", func() bool { return g.stats().Waiting > before })
	return ch
}

func TestFairGateRoundRobinAcrossTenants(t *testing.T) {
	g := newFairGate(FairOptions{Slots: 1, QueueMax: 100, QueueWait: time.Minute})
	hold, err := g.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	add := func(tenant string, i int) {
		ch := queueWaiter(t, g, context.Background(), tenant)
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := <-ch
			if a.err != nil {
				t.Errorf("%s%d: %v", tenant, i, a.err)
				return
			}
			mu.Lock()
			order = append(order, fmt.Sprintf("%s%d", tenant, i))
			mu.Unlock()
			a.release()
		}()
	}
	// Tenant A queues 5 reads first, then B 2 and C 1.
	for i := 1; i <= 5; i++ {
		add("A", i)
	}
	add("B", 1)
	add("B", 2)
	add("C", 1)
	hold()
	wg.Wait()
	want := "[A1 B1 C1 A2 B2 A3 A4 A5]"
	if got := fmt.Sprint(order); got != want {
		t.Fatalf("admission order %s, want %s (round-robin by tenant)", got, want)
	}
	if s := g.stats(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("after all released: %+v", s)
	}
}

func TestFairGateQueueCapRefuses(t *testing.T) {
	g := newFairGate(FairOptions{Slots: 2, QueueMax: 2, QueueWait: time.Minute})
	var holds []func()
	for range 2 {
		rel, err := g.acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, rel)
	}
	w1 := queueWaiter(t, g, context.Background(), "A")
	w2 := queueWaiter(t, g, context.Background(), "A")
	if _, err := g.acquire(WithTenant(context.Background(), "A")); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third waiter of a full list: %v, want ErrOverloaded", err)
	}
	if s := g.stats(); s.InUse != 2 || s.Waiting != 2 || s.Refused != 1 {
		t.Fatalf("stats %+v, want 2 in use, 2 waiting, 1 refused", s)
	}
	for _, h := range holds {
		h()
	}
	for _, w := range []<-chan acquired{w1, w2} {
		a := <-w
		if a.err != nil {
			t.Fatal(a.err)
		}
		a.release()
		a.release() // idempotent: no second slot returned
	}
	if s := g.stats(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("after release: %+v", s)
	}
}

func TestFairGateFullListPushesOutTheLargestTenant(t *testing.T) {
	g := newFairGate(FairOptions{Slots: 1, QueueMax: 3, QueueWait: time.Minute})
	hold, _ := g.acquire(context.Background())
	a1 := queueWaiter(t, g, context.Background(), "A")
	a2 := queueWaiter(t, g, context.Background(), "A")
	a3 := queueWaiter(t, g, context.Background(), "A")
	b1 := make(chan acquired, 1)
	go func() { // pushes out a3: the list stays at 3
		rel, err := g.acquire(WithTenant(context.Background(), "B"))
		b1 <- acquired{rel, err}
	}()
	if a := <-a3; !errors.Is(a.err, ErrOverloaded) {
		t.Fatalf("A's newest waiter: %v, want pushed out (ErrOverloaded)", a.err)
	}
	// A has 2 waiting, B 1: A's next read is refused, not B's.
	if _, err := g.acquire(WithTenant(context.Background(), "A")); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("A's fourth read: %v, want ErrOverloaded", err)
	}
	if s := g.stats(); s.Waiting != 3 || s.Refused != 2 {
		t.Fatalf("stats %+v, want 3 waiting, 2 refused", s)
	}
	hold()
	var got []string
	for _, w := range []struct {
		n  string
		ch <-chan acquired
	}{{"a1", a1}, {"b1", b1}, {"a2", a2}} {
		// Each is admitted in turn as the previous one releases.
		a := <-w.ch
		if a.err != nil {
			t.Fatalf("%s: %v", w.n, a.err)
		}
		got = append(got, w.n)
		a.release()
	}
	if s := g.stats(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("after release: %+v (%v)", s, got)
	}
}

func TestFairGateDeadline(t *testing.T) {
	g := newFairGate(FairOptions{Slots: 1, QueueMax: 10, QueueWait: time.Second})
	var m manualTimers
	m.install(g)
	hold, _ := g.acquire(context.Background())
	w := queueWaiter(t, g, context.Background(), "A")
	select {
	case a := <-w:
		t.Fatalf("admitted before its deadline or a slot: %v", a.err)
	case <-time.After(20 * time.Millisecond):
	}
	m.fire()
	if a := <-w; !errors.Is(a.err, ErrOverloaded) {
		t.Fatalf("past the wait: %v, want ErrOverloaded", a.err)
	}
	if s := g.stats(); s.Waiting != 0 || s.Refused != 1 || s.InUse != 1 {
		t.Fatalf("stats %+v", s)
	}
	hold()
	if s := g.stats(); s.InUse != 0 {
		t.Fatalf("slot leaked: %+v", s)
	}
	// A shared read's own deadline ending in the list is an overload too:
	// the store was never called.
	hold, _ = g.acquire(context.Background())
	defer hold()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := g.acquire(ctx); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("deadline of the read's context: %v, want ErrOverloaded", err)
	}
}

func TestFairGateCancelReleases(t *testing.T) {
	g := newFairGate(FairOptions{Slots: 1, QueueMax: 10, QueueWait: time.Minute})
	hold, _ := g.acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	w := queueWaiter(t, g, ctx, "A")
	b := queueWaiter(t, g, context.Background(), "B")
	cancel()
	if a := <-w; !errors.Is(a.err, context.Canceled) || errors.Is(a.err, ErrOverloaded) {
		t.Fatalf("canceled waiter: %v, want context.Canceled", a.err)
	}
	if s := g.stats(); s.Waiting != 1 || s.Refused != 0 {
		t.Fatalf("stats after cancel: %+v", s)
	}
	hold() // goes to B, not to the canceled waiter
	a := <-b
	if a.err != nil {
		t.Fatal(a.err)
	}
	if s := g.stats(); s.InUse != 1 {
		t.Fatalf("B holds the only slot: %+v", s)
	}
	a.release()
	if s := g.stats(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("slot leaked: %+v", s)
	}
	if _, err := g.acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire on an ended context: %v", err)
	}
}

// Many tenants, random cancels and short waits: the cap holds and every
// slot comes back (run with -race).
func TestFairGateNoLeakUnderChurn(t *testing.T) {
	const slots = 4
	g := newFairGate(FairOptions{Slots: slots, QueueMax: 16, QueueWait: 5 * time.Millisecond})
	var running, peak atomic.Int64
	var ok, refused, canceled atomic.Int64
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			ctx, cancel := context.WithCancel(WithTenant(context.Background(), fmt.Sprint("t", i%5)))
			defer cancel()
			if r.IntN(4) == 0 {
				d := time.Duration(r.IntN(3)) * time.Millisecond
				go func() { time.Sleep(d); cancel() }()
			}
			rel, err := g.acquire(ctx)
			switch {
			case errors.Is(err, ErrOverloaded):
				refused.Add(1)
				return
			case err != nil:
				canceled.Add(1)
				return
			}
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond)
			running.Add(-1)
			ok.Add(1)
			rel()
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > slots {
		t.Fatalf("%d reads ran at once, cap %d", p, slots)
	}
	s := g.stats()
	if s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("leak after churn: %+v", s)
	}
	if ok.Load() == 0 || s.Refused != refused.Load() {
		t.Fatalf("ok %d refused %d (counter %d) canceled %d", ok.Load(), refused.Load(), s.Refused, canceled.Load())
	}
}

// The gate in Cached: callers joining a read under way take no slot; a
// distinct read finding the slots taken and no room to wait is refused
// without calling the store, and is not a store fault.
func TestCachedGateFollowersCostNoSlot(t *testing.T) {
	inner := newCountingStore()
	a := inner.add(seg(1000, 1))
	b := inner.add(seg(1000, 2))
	gate := make(chan struct{})
	inner.setGate(gate)
	opts := DefaultCacheOptions()
	opts.Fair = FairOptions{Slots: 1, QueueMax: 0}
	c := NewCached(inner, opts)
	defer c.Close()

	const n = 20
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Lookup(WithTenant(context.Background(), "A"), idOf(a))
			errs <- err
		}()
	}
	waitFor(t, "one shared lookup", func() bool { return c.Flow().Gate.InUse == 1 && c.lookups.waiting(a) == n })
	if _, err := c.Lookup(WithTenant(context.Background(), "B"), idOf(b)); !errors.Is(err, ErrOverloaded) || Unreadable(err) {
		t.Fatalf("distinct lookup with every slot taken: %v, want ErrOverloaded (not Unreadable)", err)
	}
	close(gate)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if l, _ := inner.counts(); l != 1 {
		t.Fatalf("%d inner lookups, want 1 (the refused one never reached the store)", l)
	}
	if s := c.Flow().Gate; s.InUse != 0 || s.Refused != 1 {
		t.Fatalf("gate %+v", s)
	}
	if c.BreakerOpen() || c.brk.fails.Load() != 0 {
		t.Fatal("an overload counted against the store")
	}
	// The fill of a's bytes takes the slot in turn, and gives it back.
	if got := openAll(t, c, context.Background(), a, 0, -1); len(got) != 1000 {
		t.Fatalf("read %d bytes", len(got))
	}
	if s := c.Flow().Gate; s.InUse != 0 {
		t.Fatalf("slot leaked by a fill: %+v", s)
	}
}
