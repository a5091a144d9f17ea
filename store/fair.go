package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Bounded, fair store work. Every distinct read of the inner store that
// Cached shares between callers (a record Lookup, a bytes cache fill, a
// disk tier fill) takes one slot of a per-store gate for as long as it
// runs; callers that join a read already under way (flight.go, the disk
// tier's followers) take none. When every slot is taken a read waits in a
// list of its own, at most QueueMax reads and at most QueueWait each; past
// either it fails with ErrOverloaded (the handler's 503 edge.overloaded).
//
// Waiting reads are admitted round-robin across tenants: each tenant (the
// verified audience, WithTenant) has its own FIFO, and a freed slot goes
// to the head of the next tenant's list in turn, among the tenants that
// hold the fewest slots (a tenant holding none goes first), so a tenant
// with 400 cold segments queued delays a tenant with 2 by at most one
// read per slot freed, not by its 400. When the list is full, a newcomer whose tenant
// has fewer reads waiting than the tenant with the most pushes out that
// tenant's newest waiter (which fails ErrOverloaded) instead of being
// refused itself: a storming tenant cannot hold the whole list either.
//
// With Adaptive, Slots is a ceiling and the gate finds how many reads the
// store serves at once without queueing them inside itself (adaptive.go):
// a store that saturates (its reads slow down as more run) gets fewer at
// once, so a read admitted for another tenant runs at about the store's
// unloaded speed instead of beside 15 slowed ones; a store whose reads
// keep their latency however many run (a remote S3) keeps all of Slots.
// The limit bounds each tenant, not the others' turn: a tenant holding
// less than an equal share of it reads at once up to Slots, and one that
// had to wait (Slots reached) gets the next slot freed even while more
// than the limit run, so its read waits for about one release whatever
// another tenant queues, and no one tenant drives the store past the
// limit.
//
// Streams of the inner store (a segment served uncached) hold no slot:
// their length is the client's, not the store's (the handler caps SQLite
// streams on its own).

// ErrOverloaded is the store's answer to a read it has no capacity for
// now: every slot of the gate taken and the waiting list full, or the
// wait longer than QueueWait. It is not a store fault (Unreadable is
// false): the store was not called.
var ErrOverloaded = errors.New("store: overloaded: too many store reads waiting")

// Default gate settings (FairOptions).
const (
	// DefaultStoreSlots: distinct store reads at once. A cold S3 read is
	// latency-bound (tens of ms to its first byte): 16 reads in flight of
	// 1 MiB segments at 50 ms move 320 MB/s, more than a 1 Gbit/s link,
	// and 16 record reads at 20 ms answer 800 distinct cold lookups a
	// second, so one tenant's bootstrap of 400 cold segments (800 reads)
	// fits in the queue's wait. A SQLite read is CPU-bound: 16 already
	// keep every core of a small edge busy. Against 32, 8 and 4 in bench
	// scenario m, 32 let the storm's reads slow the other tenant's more,
	// and fewer than 16 did not shorten them consistently
	// (docs/performance.md, "DefaultStoreSlots").
	DefaultStoreSlots = 16
	// DefaultStoreQueue: reads waiting for a slot. A waiter costs a
	// goroutine and a few hundred bytes (its clients' connections are
	// the server's); 1,024 of them is a few MiB.
	DefaultStoreQueue = 1024
	// DefaultStoreQueueWait: the longest a read waits for a slot, below
	// DefaultTimeout (5s) so that a read admitted late still has time to
	// run, and short enough that a refused client retries (Retry-After 1
	// to 5 s) rather than hangs.
	DefaultStoreQueueWait = 2 * time.Second
)

// FairOptions bounds the store work of a Cached (CacheOptions.Fair).
type FairOptions struct {
	// Slots is the most distinct store reads running at once; 0: no cap
	// (and no waiting list).
	Slots int
	// QueueMax is the most reads waiting for a slot; 0: none wait (a
	// read that finds every slot taken fails ErrOverloaded at once).
	QueueMax int
	// QueueWait is the longest a read waits; 0: DefaultStoreQueueWait.
	QueueWait time.Duration
	// Adaptive makes Slots a ceiling: the reads admitted at once follow
	// the store's read latency (adaptive.go), between
	// min(Slots, AdaptiveFloor) and Slots, starting at the floor.
	Adaptive bool
}

// DefaultFairOptions returns the defaults of a remote store: 16 slots,
// 1,024 waiting, 2s.
func DefaultFairOptions() FairOptions {
	return FairOptions{Slots: DefaultStoreSlots, QueueMax: DefaultStoreQueue, QueueWait: DefaultStoreQueueWait}
}

// FairStats is the gate's state: slots in use, reads waiting (gauges) and
// reads refused ErrOverloaded since the store was built; Limit is how
// many reads it admits at once now (Slots, or the adaptive limit).
type FairStats struct {
	InUse, Waiting, Refused int64
	Limit                   int64
}

// fairGate is the slots and the waiting list. A nil *fairGate admits
// everything.
type fairGate struct {
	slots, queueMax int
	wait            time.Duration
	// timer returns a channel that fires after d and its stop function
	// (injected by tests; time.NewTimer otherwise).
	timer func(d time.Duration) (<-chan time.Time, func() bool)
	// now times the reads of the adaptive limit (injected by tests).
	now func() time.Time

	mu      sync.Mutex
	limit   int       // reads admitted at once: slots, or the adaptive limit
	adapt   *adaptive // nil: limit is slots
	inUse   int
	waiting int
	tenants map[string]*tenantQueue // tenants with waiters
	held    map[string]int          // slots in use, by tenant
	ring    []*tenantQueue          // the same, in admission order

	inUseG, waitingG, refused, limitG atomic.Int64
}

type tenantQueue struct {
	key string
	q   []*waiter
}

// waiter is one read waiting; ready is closed when it is admitted
// (granted) or pushed out (refused).
type waiter struct {
	tq      *tenantQueue
	ready   chan struct{}
	granted bool
}

func newFairGate(o FairOptions) *fairGate {
	if o.Slots <= 0 {
		return nil
	}
	if o.QueueWait <= 0 {
		o.QueueWait = DefaultStoreQueueWait
	}
	g := &fairGate{
		slots: o.Slots, queueMax: max(o.QueueMax, 0), wait: o.QueueWait,
		timer: func(d time.Duration) (<-chan time.Time, func() bool) {
			t := time.NewTimer(d)
			return t.C, t.Stop
		},
		now:     time.Now,
		limit:   o.Slots,
		tenants: map[string]*tenantQueue{},
		held:    map[string]int{},
	}
	if o.Adaptive {
		g.adapt = newAdaptive(o.Slots)
		g.limit = g.adapt.limit
	}
	g.limitG.Store(int64(g.limit))
	return g
}

// acquire takes a slot for the tenant of ctx, waiting for one if need be
// (in that tenant's turn), until QueueWait or ctx ends. release gives the
// slot back (to the next tenant's waiter); it must be called once.
func (g *fairGate) acquire(ctx context.Context) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	tenant := TenantOf(ctx)
	g.mu.Lock()
	if (g.inUse < g.limit && g.waiting == 0) || g.underShareLocked(tenant) {
		g.inUse++
		g.inUseG.Store(int64(g.inUse))
		g.held[tenant]++
		g.mu.Unlock()
		return g.releaser(tenant), nil
	}
	w, ok := g.enqueueLocked(tenant)
	g.mu.Unlock()
	if !ok {
		g.refused.Add(1)
		return nil, fmt.Errorf("%w (%d reads running, %d waiting)", ErrOverloaded, g.slots, g.queueMax)
	}
	fire, stop := g.timer(g.wait)
	defer stop()
	var cause error
	select {
	case <-w.ready:
	case <-fire:
		cause = ErrOverloaded
	case <-ctx.Done():
		cause = ctx.Err()
		if errors.Is(cause, context.DeadlineExceeded) {
			// The shared read's own bound ended while it waited:
			// the store was never called.
			cause = ErrOverloaded
		}
	}
	g.mu.Lock()
	if cause != nil && !g.settledLocked(w) {
		g.removeLocked(w)
		g.mu.Unlock()
		if errors.Is(cause, ErrOverloaded) {
			g.refused.Add(1)
			return nil, fmt.Errorf("%w (waited for a read slot)", ErrOverloaded)
		}
		return nil, fmt.Errorf("store: %w", cause)
	}
	g.mu.Unlock()
	<-w.ready // settled: closed before the lock was taken
	if !w.granted {
		g.refused.Add(1)
		return nil, fmt.Errorf("%w (pushed out of the waiting list)", ErrOverloaded)
	}
	if err := ctx.Err(); err != nil {
		// Admitted as ctx ended: the read would fail at once (and
		// count against the store), so the slot goes on to the next
		// waiter.
		g.release(time.Time{}, tenant)
		if errors.Is(err, context.DeadlineExceeded) {
			g.refused.Add(1)
			return nil, fmt.Errorf("%w (waited for a read slot)", ErrOverloaded)
		}
		return nil, fmt.Errorf("store: %w", err)
	}
	return g.releaser(tenant), nil
}

// underShareLocked reports whether tenant may take a slot at once above
// the adaptive limit: it has no read waiting (its own reads stay in
// order), fewer than the ceiling (store_concurrency) run in all, and it
// holds less than an equal share of the limit among the tenants holding
// or waiting for slots, itself included. A tenant whose clients arrive
// beside another tenant's storm then reads at once instead of after the
// storm's next release, while the storming tenant, above its share,
// waits; the store never runs more than the ceiling's reads.
func (g *fairGate) underShareLocked(tenant string) bool {
	if g.inUse >= g.slots || g.tenants[tenant] != nil {
		return false
	}
	return g.heldBelowShareLocked(tenant)
}

// heldBelowShareLocked reports whether tenant holds less than an equal
// share of the limit among the tenants holding or waiting for slots,
// itself included.
func (g *fairGate) heldBelowShareLocked(tenant string) bool {
	active := len(g.tenants)
	for k := range g.held {
		if g.tenants[k] == nil {
			active++
		}
	}
	if g.held[tenant] == 0 && g.tenants[tenant] == nil {
		active++ // the tenant itself, holding nothing yet
	}
	return g.held[tenant]*active < g.limit
}

// settledLocked reports whether w was admitted or pushed out already.
func (g *fairGate) settledLocked(w *waiter) bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

// releaser returns the release function of one slot (idempotent); the
// time it held the slot is the read's latency of the adaptive limit.
func (g *fairGate) releaser(tenant string) func() {
	var once sync.Once
	var start time.Time
	if g.adapt != nil {
		start = g.now()
	}
	return func() { once.Do(func() { g.release(start, tenant) }) }
}

// release hands the slot to the next tenant's oldest waiter, or frees it
// (when none waits, or the adaptive limit is now below the slots in
// use). start is when the read took the slot (zero: no read ran);
// tenant is whose read it was.
func (g *fairGate) release(start time.Time, tenant string) {
	var held time.Duration
	if g.adapt != nil && !start.IsZero() {
		held = max(g.now().Sub(start), 1)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[tenant]--; g.held[tenant] <= 0 {
		delete(g.held, tenant)
	}
	if held > 0 {
		if l := g.adapt.sample(held, g.now()); l != g.limit {
			g.limit = l
			g.limitG.Store(int64(l))
		}
	}
	if len(g.ring) == 0 {
		g.inUse--
		g.inUseG.Store(int64(g.inUse))
		return
	}
	if g.inUse > g.limit {
		// Above the limit (it was cut, or tenants under their share
		// read above it) a slot is freed, not passed on, except to a
		// waiting tenant still under its share: its read waits for one
		// release, not for every read above the limit to end first.
		if i := g.fewestHeldLocked(); g.heldBelowShareLocked(g.ring[i].key) {
			g.grantLocked(i)
			return
		}
		g.inUse--
		g.inUseG.Store(int64(g.inUse))
		return
	}
	g.grantLocked(g.fewestHeldLocked())
	// A limit that grew admits more waiters at once.
	for len(g.ring) > 0 && g.inUse < g.limit {
		g.inUse++
		g.inUseG.Store(int64(g.inUse))
		g.grantLocked(g.fewestHeldLocked())
	}
}

// fewestHeldLocked is the ring index of the next tenant in turn: the
// first in the ring among the tenants holding the fewest slots, so a
// tenant that holds none (one arriving beside a storm) is served at the
// next release, and a tenant whose reads run one at a time is not made to
// alternate with one holding every slot. Among tenants holding as many,
// the order is the ring's (round-robin). The ring must not be empty.
func (g *fairGate) fewestHeldLocked() int {
	i := 0
	for j, t := range g.ring {
		if g.held[t.key] < g.held[g.ring[i].key] {
			i = j
		}
	}
	return i
}

// grantLocked passes a slot already counted in inUse to the oldest
// waiter of the tenant at ring index i.
func (g *fairGate) grantLocked(i int) {
	tq := g.ring[i]
	w := tq.q[0]
	tq.q[0] = nil
	tq.q = tq.q[1:]
	copy(g.ring[i:], g.ring[i+1:])
	g.ring[len(g.ring)-1] = nil
	g.ring = g.ring[:len(g.ring)-1]
	g.held[tq.key]++
	if len(tq.q) > 0 {
		g.ring = append(g.ring, tq) // its next read waits for its next turn
	} else {
		delete(g.tenants, tq.key)
	}
	g.waiting--
	g.waitingG.Store(int64(g.waiting))
	w.granted = true
	close(w.ready) // the slot passes to w
}

// enqueueLocked adds a waiter for tenant, pushing out the newest waiter
// of the tenant with the most when the list is full and tenant has fewer;
// ok is false when there is no room for it.
func (g *fairGate) enqueueLocked(tenant string) (w *waiter, ok bool) {
	tq := g.tenants[tenant]
	if g.waiting >= g.queueMax {
		var most *tenantQueue
		for _, t := range g.ring {
			if most == nil || len(t.q) > len(most.q) {
				most = t
			}
		}
		mine := 0
		if tq != nil {
			mine = len(tq.q)
		}
		if most == nil || len(most.q) <= mine+1 {
			return nil, false
		}
		out := most.q[len(most.q)-1]
		g.removeLocked(out)
		close(out.ready) // pushed out: not granted
	}
	if tq = g.tenants[tenant]; tq == nil {
		tq = &tenantQueue{key: tenant}
		g.tenants[tenant] = tq
		g.ring = append(g.ring, tq)
	}
	w = &waiter{tq: tq, ready: make(chan struct{})}
	tq.q = append(tq.q, w)
	g.waiting++
	g.waitingG.Store(int64(g.waiting))
	return w, true
}

// removeLocked takes w out of the list (it gave up or was pushed out).
func (g *fairGate) removeLocked(w *waiter) {
	tq := w.tq
	for i, x := range tq.q {
		if x == w {
			tq.q = append(tq.q[:i], tq.q[i+1:]...)
			g.waiting--
			g.waitingG.Store(int64(g.waiting))
			break
		}
	}
	if len(tq.q) > 0 {
		return
	}
	delete(g.tenants, tq.key)
	for i, t := range g.ring {
		if t == tq {
			g.ring = append(g.ring[:i], g.ring[i+1:]...)
			break
		}
	}
}

// stats reads the gauges and the refusal counter.
func (g *fairGate) stats() FairStats {
	if g == nil {
		return FairStats{}
	}
	return FairStats{InUse: g.inUseG.Load(), Waiting: g.waitingG.Load(), Refused: g.refused.Load(), Limit: g.limitG.Load()}
}
