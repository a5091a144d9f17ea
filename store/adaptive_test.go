package store

import (
	"context"
	"sync"
	"testing"
	"time"
)

// simulate feeds windows of reads to the limit from a store model whose
// read latency, at limit reads at once, is lat(limit): each window's
// reads start together and end together (as the gate admits a window's
// worth at once); it returns the limits seen after each window.
func simulate(a *adaptive, now *time.Time, windows int, lat func(inFlight int) time.Duration) []int {
	var seen []int
	for range windows {
		n := a.limit
		*now = now.Add(lat(n))
		for range n {
			a.sample(lat(n), *now)
		}
		seen = append(seen, a.limit)
	}
	return seen
}

// saturating is a store with parallelism p: up to p reads at once take
// base each, more slow every read in proportion.
func saturating(base time.Duration, p int) func(int) time.Duration {
	return func(n int) time.Duration {
		if n <= p {
			return base
		}
		return base * time.Duration(n) / time.Duration(p)
	}
}

// TestAdaptiveLimitFollowsStoreLatency: from the floor, a store whose
// latency does not grow with load is given the whole ceiling; one that
// saturates at 2 reads at once settles near its parallelism plus the
// allowance, never at the ceiling; a calm store's limit is cut within one
// window when a storm makes every read slow, and grows back when it ends.
func TestAdaptiveLimitFollowsStoreLatency(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	a := newAdaptive(16)
	if a.limit != AdaptiveFloor {
		t.Fatalf("starts at %d, want the floor %d", a.limit, AdaptiveFloor)
	}
	flat := func(int) time.Duration { return 20 * time.Millisecond }
	if seen := simulate(a, &now, 12, flat); seen[len(seen)-1] != 16 {
		t.Fatalf("a store of flat latency: limits %v, want the ceiling 16", seen)
	}

	b := newAdaptive(16)
	seen := simulate(b, &now, 40, saturating(5*time.Millisecond, 2))
	for _, l := range seen[10:] {
		if l < 2 || l > 2+adaptBeta+1 {
			t.Fatalf("a store saturating at 2 reads: limits %v, want between 2 and %d once settled", seen, 2+adaptBeta+1)
		}
	}

	// The calm store (at the ceiling) meets a storm: every read 8 times
	// slower at 16 at once.
	storm := saturating(20*time.Millisecond, 2)
	seen = simulate(a, &now, 1, storm)
	if seen[0] > 2+adaptAlpha {
		t.Fatalf("first window of a storm at 16: limit %d, want cut to at most %d", seen[0], 2+adaptAlpha)
	}
	seen = simulate(a, &now, 20, storm)
	for _, l := range seen {
		if l > 2+adaptBeta+1 {
			t.Fatalf("during the storm: limits %v", seen)
		}
	}
	// The storm ends: reads are fast again at any count.
	if seen := simulate(a, &now, 20, flat); seen[len(seen)-1] != 16 {
		t.Fatalf("after the storm: limits %v, want back to 16", seen)
	}
}

// TestAdaptiveBaseIsRelearned: a store that became slower for good is
// given its ceiling again within two base periods (its new latency is the
// new base), not held at the floor for ever.
func TestAdaptiveBaseIsRelearned(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	a := newAdaptive(16)
	simulate(a, &now, 12, func(int) time.Duration { return 5 * time.Millisecond })
	slower := func(int) time.Duration { return 50 * time.Millisecond }
	if seen := simulate(a, &now, 1, slower); seen[0] > 2+adaptAlpha {
		t.Fatalf("10× slower at once: limit %d, want cut", seen[0])
	}
	// A period later the slow reads are the previous period's, and the
	// old fast ones are forgotten one period after that.
	for range 2 {
		now = now.Add(adaptBasePeriod)
		simulate(a, &now, 1, slower)
	}
	if seen := simulate(a, &now, 30, slower); seen[len(seen)-1] != 16 {
		t.Fatalf("two periods later: limits %v, want the ceiling again", seen)
	}
}

// TestFairGateAdaptiveLimit: through the gate, with an injected clock. A
// fresh adaptive gate admits the floor; reads that hold their slots much
// longer than the fastest seen cut the limit, and a release while more
// run than the limit frees the slot instead of passing it on (in use
// falls to the limit, a waiter keeps waiting); fast reads raise it again
// and a release then admits several waiters at once. Stats report the
// limit; in use never exceeds it once it has settled.
func TestFairGateAdaptiveLimit(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1_700_000_000, 0)
	g := newFairGate(FairOptions{Slots: 8, QueueMax: 100, QueueWait: time.Minute, Adaptive: true})
	g.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	ctx := WithTenant(context.Background(), "A")

	if s := g.stats(); s.Limit != AdaptiveFloor {
		t.Fatalf("fresh adaptive gate: limit %d, want %d", s.Limit, AdaptiveFloor)
	}
	// Fast reads, one after another: slow start to the ceiling (windows
	// of 2, 4, 6 and 8 reads).
	for range 20 {
		rel, err := g.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		advance(time.Millisecond)
		rel()
	}
	if s := g.stats(); s.Limit != 8 {
		t.Fatalf("after fast reads: limit %d, want the ceiling 8", s.Limit)
	}
	// 8 reads at once, each held 40 times longer than the fastest seen;
	// 2 more wait.
	var rels []func()
	for range 8 {
		rel, err := g.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, rel)
	}
	w1 := queueWaiter(t, g, context.Background(), "B")
	w2 := queueWaiter(t, g, context.Background(), "B")
	advance(40 * time.Millisecond)
	for _, rel := range rels {
		rel()
	}
	s := g.stats()
	if s.Limit > 2+adaptAlpha || s.Limit < AdaptiveFloor {
		t.Fatalf("after a window of slow reads: %+v, want the limit cut to at most %d", s, 2+adaptAlpha)
	}
	// The last release ended the window and cut the limit; B's two
	// waiters were admitted by the releases before it, so at most the
	// old limit's worth runs.
	var admitted []func()
	for _, w := range []<-chan acquired{w1, w2} {
		a := <-w
		if a.err != nil {
			t.Fatal(a.err)
		}
		admitted = append(admitted, a.release)
	}
	if s := g.stats(); s.InUse != 2 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want B's 2 in use", s)
	}
	advance(time.Millisecond)
	for _, r := range admitted {
		r()
	}

	// Now fill to the cut limit and queue more: a release passes the
	// slot on only while in use is within the limit.
	limit := int(g.stats().Limit)
	rels = rels[:0]
	for range limit {
		rel, err := g.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, rel)
	}
	var waiters []<-chan acquired
	for range 6 { // A's own: a tenant at its share waits (underShareLocked)
		waiters = append(waiters, queueWaiter(t, g, context.Background(), "A"))
	}
	if s := g.stats(); s.InUse != int64(limit) || s.Waiting != 6 {
		t.Fatalf("stats %+v, want %d in use (the limit), 6 waiting", s, limit)
	}
	// Fast reads again: the window's releases raise the limit, and the
	// waiters are admitted, more than one per release once it grew.
	advance(time.Millisecond)
	for _, rel := range rels {
		rel()
	}
	var got []func()
	var still []<-chan acquired
	for _, w := range waiters {
		select {
		case a := <-w:
			if a.err != nil {
				t.Fatal(a.err)
			}
			got = append(got, a.release)
		case <-time.After(100 * time.Millisecond):
			still = append(still, w)
		}
	}
	s = g.stats()
	if s.Limit <= int64(limit) {
		t.Fatalf("after fast reads: limit %d, want above %d", s.Limit, limit)
	}
	if len(got) <= limit || s.InUse != int64(len(got)) || s.InUse > s.Limit {
		t.Fatalf("%d waiters admitted for %d released slots: %+v (a grown limit admits more)", len(got), limit, s)
	}
	for _, r := range got {
		r()
	}
	for _, w := range still { // admitted as the others released
		a := <-w
		if a.err != nil {
			t.Fatal(a.err)
		}
		a.release()
	}
	waitFor(t, "every slot back", func() bool { s := g.stats(); return s.InUse == 0 && s.Waiting == 0 })
}

// TestFairGateFixedIgnoresLatency: without Adaptive the gate admits its
// Slots whatever the reads' latency (the rule above is what cuts it).
func TestFairGateFixedIgnoresLatency(t *testing.T) {
	var clock time.Time
	g := newFairGate(FairOptions{Slots: 8, QueueMax: 10, QueueWait: time.Minute})
	g.now = func() time.Time { return clock }
	for round := range 3 {
		var rels []func()
		for range 8 {
			rel, err := g.acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			rels = append(rels, rel)
		}
		clock = clock.Add(time.Duration(round+1) * time.Second)
		for _, r := range rels {
			r()
		}
	}
	if s := g.stats(); s.Limit != 8 || s.InUse != 0 {
		t.Fatalf("fixed gate: %+v", s)
	}
}

// TestFairGateTenantHoldingNoneGoesFirst: a freed slot goes to the
// waiting tenant holding the fewest slots, not to the ring's next: A
// holds both slots and has waited longer, yet B (holding none) is admitted
// at the first release; A's waiter at the second, when B holds as many.
// Plain round-robin would admit A's first.
func TestFairGateTenantHoldingNoneGoesFirst(t *testing.T) {
	g := newFairGate(FairOptions{Slots: 2, QueueMax: 10, QueueWait: time.Minute})
	a := WithTenant(context.Background(), "A")
	h1, err := g.acquire(a)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := g.acquire(a)
	if err != nil {
		t.Fatal(err)
	}
	wa := queueWaiter(t, g, context.Background(), "A")
	wb := queueWaiter(t, g, context.Background(), "B")
	h1()
	select {
	case got := <-wb:
		if got.err != nil {
			t.Fatal(got.err)
		}
		defer got.release()
	case <-wa:
		t.Fatal("A's waiter was admitted before B's, though A held the other slot and B none")
	case <-time.After(5 * time.Second):
		t.Fatal("nobody admitted")
	}
	h2()
	got := <-wa
	if got.err != nil {
		t.Fatal(got.err)
	}
	got.release()
	if s := g.stats(); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want B's 1 in use", s)
	}
}

// TestFairGateUnderShareAboveLimit: while the adaptive limit is cut, a
// tenant holding less than an equal share of it (and with no read
// waiting) reads at once, up to the ceiling; one that had to wait (the
// ceiling reached) is admitted at the next release, not after every read
// above the limit ended; the tenant above its share waits, and nobody
// passes the ceiling.
func TestFairGateUnderShareAboveLimit(t *testing.T) {
	// A fixed gate with its limit set below its ceiling, as the adaptive
	// limit leaves it after a window of slow reads (and here stays).
	g := newFairGate(FairOptions{Slots: 4, QueueMax: 100, QueueWait: time.Minute})
	g.mu.Lock()
	g.limit = 2
	g.mu.Unlock()
	take := func(tenant string) func() {
		t.Helper()
		done := make(chan acquired, 1)
		go func() {
			rel, err := g.acquire(WithTenant(context.Background(), tenant))
			done <- acquired{rel, err}
		}()
		select {
		case a := <-done:
			if a.err != nil {
				t.Fatal(a.err)
			}
			return a.release
		case <-time.After(5 * time.Second):
			t.Fatalf("tenant %s was not admitted at once (%+v)", tenant, g.stats())
			return nil
		}
	}
	a1, a2 := take("A"), take("A") // the limit
	wa := queueWaiter(t, g, context.Background(), "A")
	b1 := take("B") // holds none of 2 tenants' share: at once, above the limit
	if s := g.stats(); s.InUse != 3 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want 3 in use (above the limit 2), A's 1 waiting", s)
	}
	wb := queueWaiter(t, g, context.Background(), "B") // B holds 1 of 3 tenants' share of 2: waits
	c1 := take("C")                                    // the ceiling's last slot
	wd := queueWaiter(t, g, context.Background(), "D") // at the ceiling: waits
	if s := g.stats(); s.InUse != 4 || s.Waiting != 3 {
		t.Fatalf("stats %+v, want the ceiling 4 in use, 3 waiting", s)
	}
	// A release above the limit passes its slot on only to a waiting
	// tenant under its share: C's release goes to D (holding none, its
	// turn before B's, who holds 1), B's own release to B's waiter; A,
	// holding the whole limit, waits.
	admitted := func(who string, w <-chan acquired) func() {
		t.Helper()
		select {
		case got := <-w:
			if got.err != nil {
				t.Fatal(got.err)
			}
			return got.release
		case <-time.After(5 * time.Second):
			t.Fatalf("%s's waiter was not admitted at the release (%+v)", who, g.stats())
			return nil
		}
	}
	c1()
	rd := admitted("D", wd)
	b1()
	rb := admitted("B", wb)
	if s := g.stats(); s.InUse != 4 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want 4 in use (the ceiling), A's 1 waiting", s)
	}
	// A's first release: A still holds 1, at its share of 3 tenants:
	// the slot is freed. Its second: A holds none and is admitted.
	a1()
	if s := g.stats(); s.InUse != 3 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want 3 in use, A's 1 waiting", s)
	}
	a2()
	rd()
	rb()
	admitted("A", wa)()
	waitFor(t, "every slot back", func() bool { s := g.stats(); return s.InUse == 0 && s.Waiting == 0 })
}

// TestAdaptiveWindowIsTheCurrentLimits: reads admitted under an earlier
// limit end after it changed, slow because as many ran as that limit let
// in. They must not make a second cut: the window after a cut is of reads
// admitted under the cut limit. Counting them (the earlier rule) cut a
// limit of 16 to the floor from one burst of slow reads.
func TestAdaptiveWindowIsTheCurrentLimits(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	a := newAdaptive(16)
	flat := func(int) time.Duration { return 10 * time.Millisecond }
	if seen := simulate(a, &now, 12, flat); seen[len(seen)-1] != 16 {
		t.Fatalf("flat store: limits %v, want 16", seen)
	}
	// 16 reads admitted together, each 3× the base: the first window's
	// end cuts the limit.
	start := now
	now = now.Add(30 * time.Millisecond)
	for range 16 {
		a.sample(30*time.Millisecond, now)
	}
	cut := a.limit
	if cut >= 16 {
		t.Fatalf("a window of 3× slower reads: limit %d, want a cut", cut)
	}
	// 16 more reads of the same burst (admitted at start, before the
	// cut) end a little later: they are not the cut limit's window.
	now = now.Add(time.Millisecond)
	for range 16 {
		a.sample(now.Sub(start), now)
	}
	if a.limit != cut {
		t.Fatalf("reads admitted before the cut changed the limit: %d, want %d kept", a.limit, cut)
	}
	// Reads admitted under the cut limit, at the base latency, grow it.
	if seen := simulate(a, &now, 1, flat); seen[0] <= cut {
		t.Fatalf("fast reads under the cut limit: %d, want above %d", seen[0], cut)
	}
}
