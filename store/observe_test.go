package store

import (
	"bytes"
	"context"
	"sync"
	"testing"
)

// openTier opens id whole and reads it, returning the tier.
func openTier(t *testing.T, c *Cached, id string, want []byte) Tier {
	t.Helper()
	rc, tier, err := c.openTier(context.Background(), idOf(id), 0, -1)
	got := readAll(t, rc, err)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: wrong bytes (%d of %d)", id, len(got), len(want))
	}
	return tier
}

// Every tier is named by OpenTier: a memory fill and its followers, then
// hits; a disk fill and its followers, then hits; a stream with no tier.
// While the fills are held, the flow gauges show them and their waiting
// callers; afterwards they are 0, and StoreReadBytes is exactly the bytes
// the inner store handed out.
func TestOpenTierAndFlow(t *testing.T) {
	cs := newCountingStore()
	small := seg(64<<10, 3)
	large := randomBytes(3<<20, 4)
	sid, lid := cs.add(small), cs.add(large)
	inner := &copyStore{streamStore: streamStore{cs}}
	c, d := tierCache(t, inner, t.TempDir())
	ctx := context.Background()
	for _, id := range []string{sid, lid} {
		if _, src, err := c.LookupFrom(ctx, idOf(id)); err != nil || src != RecordStore {
			t.Fatalf("first lookup: %v, source %d (want RecordStore)", err, src)
		}
		if _, src, err := c.LookupFrom(ctx, idOf(id)); err != nil || src != RecordMemory {
			t.Fatalf("second lookup: %v, source %d (want RecordMemory)", err, src)
		}
	}

	for _, tc := range []struct {
		id               string
		data             []byte
		fill, follow     Tier
		hit              Tier
		fills, followers func() int64
	}{
		{sid, small, TierMemoryFill, TierMemoryFollow, TierMemory,
			func() int64 { return c.Flow().MemoryFills }, func() int64 { return c.Flow().MemoryWaiting }},
		{lid, large, TierDiskFill, TierDiskFollow, TierDisk,
			func() int64 { return d.Stats().FillsInFlight }, func() int64 { return d.Stats().Following }},
	} {
		gate := make(chan struct{})
		started := make(chan string, 1)
		cs.mu.Lock()
		cs.gate, cs.started = gate, started
		cs.mu.Unlock()
		const n = 5
		tiers := make(chan Tier, n)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); tiers <- openTier(t, c, tc.id, tc.data) }()
		<-started // the first caller's fill reached the store
		cs.mu.Lock()
		cs.started = nil
		cs.mu.Unlock()
		if tc.fill.Disk() {
			// A disk follower attaches after the first byte: let a few
			// through by releasing the gate once the followers wait.
			for range n - 1 {
				wg.Add(1)
				go func() { defer wg.Done(); tiers <- openTier(t, c, tc.id, tc.data) }()
			}
			waitFor(t, "one disk fill in flight", func() bool { return tc.fills() == 1 })
			close(gate)
		} else {
			for range n - 1 {
				wg.Add(1)
				go func() { defer wg.Done(); tiers <- openTier(t, c, tc.id, tc.data) }()
			}
			waitFor(t, "followers waiting on the memory fill", func() bool {
				return tc.fills() == 1 && tc.followers() == n-1
			})
			close(gate)
		}
		wg.Wait()
		close(tiers)
		count := map[Tier]int{}
		for tr := range tiers {
			count[tr]++
		}
		if count[tc.fill] != 1 || count[tc.fill]+count[tc.follow]+count[tc.hit] != n {
			t.Fatalf("tiers %v: want one %d, the rest %d (or %d when it came late)", count, tc.fill, tc.follow, tc.hit)
		}
		if !tc.fill.Disk() && count[tc.follow] != n-1 {
			t.Fatalf("memory tiers %v: want %d followers", count, n-1)
		}
		waitFor(t, "gauges back to 0", func() bool { return tc.fills() == 0 && tc.followers() == 0 })
		if got := openTier(t, c, tc.id, tc.data); got != tc.hit || !got.Hit() {
			t.Fatalf("after the fill: tier %d, want %d", got, tc.hit)
		}
		cs.setGate(nil)
	}

	// A segment whose length is not known yet streams from the store.
	other := seg(10<<10, 5)
	oid := cs.add(other)
	if got := openTier(t, c, oid, other); got != TierStore {
		t.Fatalf("unknown length: tier %d, want TierStore", got)
	}
	want := int64(len(small) + len(large) + len(other))
	if got := c.Flow().StoreReadBytes; got != want {
		t.Fatalf("StoreReadBytes = %d, want %d (each segment read from the store once)", got, want)
	}
	b, err := NewCached(cs, CacheOptions{}).OpenBody(context.Background(), idOf(oid), Want{N: int64(len(other)), Size: int64(len(other))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := b.Tier(); got != TierStore || !b.Streamed() {
		t.Fatalf("a body of a store without the cache: tier %d, streamed %v", got, b.Streamed())
	}
}
