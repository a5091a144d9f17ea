package store

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

// groupStore is an in-memory RecordGroupReader: each record carries a
// version in ByteLength; LookupGroup returns the current record of the
// id and of each id of also, and a test may hook into it.
type groupStore struct {
	mu      sync.Mutex
	recs    map[string]*Record
	lookups map[string]int      // reads of an id asked for (Lookup or LookupGroup)
	alsos   [][]string          // the also of each LookupGroup
	groupOf map[string][]string // the also of the last LookupGroup of an id
	size    int
	hook    func(id string) // called inside LookupGroup, before it answers
	stale   map[string]*Record
}

func newGroupStore(ids ...string) *groupStore {
	g := &groupStore{recs: map[string]*Record{}, lookups: map[string]int{}, groupOf: map[string][]string{}, size: 64, stale: map[string]*Record{}}
	for _, id := range ids {
		g.set(id, 1)
	}
	return g
}

func (g *groupStore) set(id string, v int64) {
	g.mu.Lock()
	g.recs[id] = &Record{SegmentID: id, ByteLength: v, MediaType: MediaRows}
	g.mu.Unlock()
}

func (g *groupStore) reads(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lookups[id]
}

func (g *groupStore) Lookup(ctx context.Context, id string) (*Record, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lookups[id]++
	if r, ok := g.recs[id]; ok {
		return r, nil
	}
	return nil, ErrNotFound
}

func (g *groupStore) GroupSize() int { return g.size }

func (g *groupStore) LookupGroup(ctx context.Context, id string, also []string) (*Record, map[string]*Record, error) {
	g.mu.Lock()
	g.alsos = append(g.alsos, append([]string(nil), also...))
	g.groupOf[id] = g.alsos[len(g.alsos)-1]
	grp := map[string]*Record{}
	for _, a := range also {
		if r, ok := g.stale[a]; ok { // an older read of a, for the race
			grp[a] = r
		} else if r, ok := g.recs[a]; ok {
			grp[a] = r
		}
	}
	hook := g.hook
	g.mu.Unlock()
	if hook != nil {
		hook(id)
	}
	rec, err := g.Lookup(ctx, id)
	return rec, grp, err
}

func (g *groupStore) Open(context.Context, string, int64, int64) (io.ReadCloser, error) {
	return nil, ErrNotFound
}
func (g *groupStore) Close() error { return nil }

func version(t *testing.T, c *Cached, id string) int64 {
	t.Helper()
	rec, err := c.Lookup(context.Background(), id)
	if err != nil {
		t.Fatalf("lookup %s: %v", id, err)
	}
	return rec.ByteLength
}

// A group refresh makes a record fresh for one TTL from the miss's start,
// not longer: the record is answered from memory until then and read
// again from the store at that instant. Only records a hit served since
// their read join a group, and a group's (older) read never replaces a
// record read after the group's read began.
func TestCacheGroupRefreshNeverOlderThanTTL(t *testing.T) {
	const ttl = 2 * time.Second
	g := newGroupStore("a", "b", "c", "d")
	clk := NewTestClock(time.Unix(1000, 0))
	c := NewCached(g, CacheOptions{RecordTTL: ttl, MaxRecords: 100, Now: clk.Now})
	defer c.Stop()

	for _, id := range []string{"a", "b", "d"} { // read, then served by a hit
		version(t, c, id)
		version(t, c, id)
	}
	version(t, c, "c") // read, never served
	g.set("b", 2)

	clk.Add(ttl + time.Millisecond)
	t1 := clk.Now()
	if v := version(t, c, "a"); v != 1 {
		t.Fatalf("a: version %d", v)
	}
	if len(g.alsos) != 1 {
		t.Fatalf("group reads %v, want 1", g.alsos)
	}
	also := map[string]bool{}
	for _, id := range g.alsos[0] {
		also[id] = true
	}
	if !also["b"] || !also["d"] || also["c"] || also["a"] {
		t.Fatalf("group %v: want b and d (served), not c (never served) nor a (asked for)", g.alsos[0])
	}
	if _, refreshed := c.GroupStats(); refreshed != 2 {
		t.Fatalf("refreshed %d, want 2", refreshed)
	}
	// b's group read is its read: fresh, the new version, no store read.
	readsB := g.reads("b")
	if v := version(t, c, "b"); v != 2 {
		t.Fatalf("b after the group read: version %d, want 2", v)
	}
	clk.Add(ttl - time.Millisecond) // t1 + TTL - 1ms
	if v := version(t, c, "b"); v != 2 || g.reads("b") != readsB {
		t.Fatalf("b within TTL of its group read: version %d, store reads %d (was %d)", v, g.reads("b"), readsB)
	}
	g.set("b", 3)
	clk.Add(time.Millisecond) // t1 + TTL: expired
	if !clk.Now().Equal(t1.Add(ttl)) {
		t.Fatal("clock arithmetic")
	}
	if v := version(t, c, "b"); v != 3 || g.reads("b") != readsB+1 {
		t.Fatalf("b a TTL after its group read: version %d, store reads %d (was %d): served past its TTL", v, g.reads("b"), readsB)
	}

	// The race: d's group read (of an older d) ends after d was read on
	// its own: the newer read stays.
	for _, id := range []string{"a", "d", "a", "d"} { // read again and served: d joins a's group below
		version(t, c, id)
	}
	clk.Add(ttl + time.Millisecond)
	g.mu.Lock()
	g.stale["d"] = &Record{SegmentID: "d", ByteLength: 4, MediaType: MediaRows}
	g.hook = func(id string) {
		if id != "a" {
			return
		}
		clk.Add(time.Millisecond)
		if v := version(t, c, "d"); v != 5 { // d's own read, inside a's group read
			t.Errorf("d's own read: version %d, want 5", v)
		}
	}
	g.mu.Unlock()
	g.set("d", 5)
	version(t, c, "a")
	g.mu.Lock()
	g.hook = nil
	last := g.groupOf["a"]
	g.mu.Unlock()
	inGroup := false
	for _, id := range last {
		inGroup = inGroup || id == "d"
	}
	if !inGroup {
		t.Fatalf("a's group %v: want d in it", last)
	}
	if v := version(t, c, "d"); v != 5 {
		t.Fatalf("d: version %d: an older group read replaced a newer read", v)
	}
}

// A store without group reads (GroupSize 0) is read one record at a time.
func TestCacheGroupOffWhenStoreSaysNone(t *testing.T) {
	const ttl = time.Second
	g := newGroupStore("a", "b")
	g.size = 0
	clk := NewTestClock(time.Unix(1000, 0))
	c := NewCached(g, CacheOptions{RecordTTL: ttl, MaxRecords: 100, Now: clk.Now})
	defer c.Stop()
	for _, id := range []string{"a", "b", "a", "b"} {
		version(t, c, id)
	}
	clk.Add(ttl + time.Millisecond)
	version(t, c, "a")
	version(t, c, "b")
	if len(g.alsos) != 0 || g.reads("b") != 2 {
		t.Fatalf("group reads %v, b read %d times, want none and 2", g.alsos, g.reads("b"))
	}
}
