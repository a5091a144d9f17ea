package store

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/segid"
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

func (g *groupStore) Lookup(ctx context.Context, pid segid.ID) (*Record, error) {
	id := pid.String()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lookups[id]++
	if r, ok := g.recs[id]; ok {
		return r, nil
	}
	return nil, ErrNotFound
}

func (g *groupStore) GroupSize() int { return g.size }

func (g *groupStore) LookupGroup(ctx context.Context, pid segid.ID, also []string) (*Record, map[string]*Record, error) {
	id := pid.String()
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
	rec, err := g.Lookup(ctx, idOf(id))
	return rec, grp, err
}

func (g *groupStore) Open(context.Context, segid.ID, int64, int64) (io.ReadCloser, error) {
	return nil, ErrNotFound
}
func (g *groupStore) Close() error { return nil }

// Ids of four segments, one hex digit repeated: a test reads them as a,
// b, c and d.
var (
	idA = "sha256:" + strings.Repeat("a", 64)
	idB = "sha256:" + strings.Repeat("b", 64)
	idC = "sha256:" + strings.Repeat("c", 64)
	idD = "sha256:" + strings.Repeat("d", 64)
)

func version(t *testing.T, c *Cached, id string) int64 {
	t.Helper()
	rec, err := c.Lookup(context.Background(), idOf(id))
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
	g := newGroupStore(idA, idB, idC, idD)
	clk := NewTestClock(time.Unix(1000, 0))
	c := NewCached(g, CacheOptions{RecordTTL: ttl, MaxRecords: 100, Now: clk.Now})
	defer c.Stop()

	for _, id := range []string{idA, idB, idD} { // read, then served by a hit
		version(t, c, id)
		version(t, c, id)
	}
	version(t, c, idC) // read, never served
	g.set(idB, 2)

	clk.Add(ttl + time.Millisecond)
	t1 := clk.Now()
	if v := version(t, c, idA); v != 1 {
		t.Fatalf("a: version %d", v)
	}
	if len(g.alsos) != 1 {
		t.Fatalf("group reads %v, want 1", g.alsos)
	}
	also := map[string]bool{}
	for _, id := range g.alsos[0] {
		also[id] = true
	}
	if !also[idB] || !also[idD] || also[idC] || also[idA] {
		t.Fatalf("group %v: want b and d (served), not c (never served) nor a (asked for)", g.alsos[0])
	}
	if _, refreshed := c.GroupStats(); refreshed != 2 {
		t.Fatalf("refreshed %d, want 2", refreshed)
	}
	// b's group read is its read: fresh, the new version, no store read.
	readsB := g.reads(idB)
	if v := version(t, c, idB); v != 2 {
		t.Fatalf("b after the group read: version %d, want 2", v)
	}
	clk.Add(ttl - time.Millisecond) // t1 + TTL - 1ms
	if v := version(t, c, idB); v != 2 || g.reads(idB) != readsB {
		t.Fatalf("b within TTL of its group read: version %d, store reads %d (was %d)", v, g.reads(idB), readsB)
	}
	g.set(idB, 3)
	clk.Add(time.Millisecond) // t1 + TTL: expired
	if !clk.Now().Equal(t1.Add(ttl)) {
		t.Fatal("clock arithmetic")
	}
	if v := version(t, c, idB); v != 3 || g.reads(idB) != readsB+1 {
		t.Fatalf("b a TTL after its group read: version %d, store reads %d (was %d): served past its TTL", v, g.reads(idB), readsB)
	}

	// The race: d's group read (of an older d) ends after d was read on
	// its own: the newer read stays.
	for _, id := range []string{idA, idD, idA, idD} { // read again and served: d joins a's group below
		version(t, c, id)
	}
	clk.Add(ttl + time.Millisecond)
	g.mu.Lock()
	g.stale[idD] = &Record{SegmentID: idD, ByteLength: 4, MediaType: MediaRows}
	g.hook = func(id string) {
		if id != idA {
			return
		}
		clk.Add(time.Millisecond)
		if v := version(t, c, idD); v != 5 { // d's own read, inside a's group read
			t.Errorf("d's own read: version %d, want 5", v)
		}
	}
	g.mu.Unlock()
	g.set(idD, 5)
	version(t, c, idA)
	g.mu.Lock()
	g.hook = nil
	last := g.groupOf[idA]
	g.mu.Unlock()
	inGroup := false
	for _, id := range last {
		inGroup = inGroup || id == idD
	}
	if !inGroup {
		t.Fatalf("a's group %v: want d in it", last)
	}
	if v := version(t, c, idD); v != 5 {
		t.Fatalf("d: version %d: an older group read replaced a newer read", v)
	}
}

// A store without group reads (GroupSize 0) is read one record at a time.
func TestCacheGroupOffWhenStoreSaysNone(t *testing.T) {
	const ttl = time.Second
	g := newGroupStore(idA, idB)
	g.size = 0
	clk := NewTestClock(time.Unix(1000, 0))
	c := NewCached(g, CacheOptions{RecordTTL: ttl, MaxRecords: 100, Now: clk.Now})
	defer c.Stop()
	for _, id := range []string{idA, idB, idA, idB} {
		version(t, c, id)
	}
	clk.Add(ttl + time.Millisecond)
	version(t, c, idA)
	version(t, c, idB)
	if len(g.alsos) != 0 || g.reads(idB) != 2 {
		t.Fatalf("group reads %v, b read %d times, want none and 2", g.alsos, g.reads(idB))
	}
}
