package store

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// recordLRU holds records with the time their read began: a
// golang-lru simplelru under one mutex, which also guards the entries'
// fields (fetched, served) and byAge.
type recordLRU struct {
	mu      sync.Mutex
	c       *simplelru.LRU[string, *recordEntry] // nil: max <= 0, holds nothing
	evicted atomic.Int64
	// byAge lists the entries by fetched, oldest first (expiring), except
	// those a scan found too old to list (a put lists them again).
	byAge list.List
}

type recordEntry struct {
	id      string
	age     *list.Element // in byAge; nil: not listed
	rec     *Record
	fetched time.Time
	served  bool // returned by a cache hit at least once
	// refused holds a bit per Reason of the refusals decided on rec
	// while it was fresh (RememberRefusal); cleared when rec is replaced.
	refused uint16
}

func newRecordLRU(max int) *recordLRU {
	l := &recordLRU{}
	if max > 0 {
		l.c, _ = simplelru.NewLRU[string, *recordEntry](max, l.unlist) // only fails for max <= 0
	}
	return l
}

// unlist takes an evicted entry off byAge (under mu: simplelru calls it
// from Add).
func (l *recordLRU) unlist(_ string, ent *recordEntry) {
	if ent.age != nil {
		l.byAge.Remove(ent.age)
		ent.age = nil
	}
}

// enlist puts ent in byAge by its fetched time. Reads end in about the
// order they began, so the place is found within a few steps of the
// back; past 8 the entry goes there (expiring is a heuristic).
func (l *recordLRU) enlist(ent *recordEntry) {
	l.unlist("", ent)
	at := l.byAge.Back()
	for i := 0; at != nil && i < 8 && at.Value.(*recordEntry).fetched.After(ent.fetched); i++ {
		at = at.Prev()
	}
	if at == nil {
		ent.age = l.byAge.PushFront(ent)
	} else {
		ent.age = l.byAge.InsertAfter(ent, at)
	}
}

// expiring returns up to k ids (never except) of the records read after
// from and at or before until that a cache hit has served since their
// read: the working set about to expire (or just expired). A record no
// hit asked for since its read is left to expire, so a group refresh
// keeps a record for at most one TTL after its last use. Entries read at
// or before from leave byAge as the scan passes them (each once per
// read); of the rest it looks at no more than 4k.
func (l *recordLRU) expiring(except string, from, until time.Time, k int) []string {
	if l.c == nil || k <= 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for e, looked := l.byAge.Front(), 0; e != nil && len(ids) < k && looked < 4*k; {
		ent, next := e.Value.(*recordEntry), e.Next()
		switch {
		case !ent.fetched.After(from):
			l.unlist("", ent)
		case ent.fetched.After(until):
			return ids
		default:
			looked++
			if ent.served && ent.id != except {
				ids = append(ids, ent.id)
			}
		}
		e = next
	}
	return ids
}

// refresh replaces id's record with rec, read at fetched, when id is
// cached and its record was read before fetched: a group read never
// replaces a newer read, and never adds an entry (or moves it in the
// eviction order). It reports whether it did.
func (l *recordLRU) refresh(id string, rec *Record, fetched time.Time) bool {
	if l.c == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ent, ok := l.c.Peek(id)
	if !ok || !ent.fetched.Before(fetched) {
		return false
	}
	ent.rec, ent.fetched, ent.served, ent.refused = rec, fetched, false, 0
	l.enlist(ent)
	return true
}

// get returns the record of id when it was fetched after notBefore. An
// entry too old to answer keeps its place in the eviction order.
func (l *recordLRU) get(id string, notBefore time.Time) (*Record, bool) {
	if l.c == nil {
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ent, ok := l.c.Peek(id)
	if !ok || !ent.fetched.After(notBefore) {
		return nil, false
	}
	l.c.Get(id) // most recently used
	if !ent.served {
		ent.served = true // written once: later hits leave the entry's line clean
	}
	return ent.rec, true
}

// stale reports whether rec may be older than a read made now: it is the
// cached record of id and a cache hit has handed it out. A record just
// read by a miss (not yet served from the cache) is not stale.
func (l *recordLRU) stale(id string, rec *Record) bool {
	if l.c == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ent, ok := l.c.Peek(id)
	if !ok {
		return true
	}
	return ent.rec == rec && ent.served
}

// size returns the byte length of id's record, whatever its age: the
// length of a content address never changes.
func (l *recordLRU) size(id string) (int64, bool) {
	if l.c == nil {
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ent, ok := l.c.Peek(id); ok {
		return ent.rec.ByteLength, true
	}
	return 0, false
}

// put stores rec as id's record, read at fetched, evicting the least
// recently used record when full.
func (l *recordLRU) put(id string, rec *Record, fetched time.Time) {
	if l.c == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ent, ok := l.c.Get(id); ok {
		ent.rec, ent.fetched, ent.served, ent.refused = rec, fetched, false, 0
		l.enlist(ent)
		return
	}
	ent := &recordEntry{id: id, rec: rec, fetched: fetched}
	l.enlist(ent)
	if l.c.Add(id, ent) {
		l.evicted.Add(1)
	}
}

// grace returns the record of id, whatever its age, when it was fetched
// after notBefore, and marks it served (a caller that refuses on it must
// not take it for a fresh read).
func (l *recordLRU) grace(id string, notBefore time.Time) (*Record, bool) {
	if l.c == nil {
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ent, ok := l.c.Get(id)
	if !ok || !ent.fetched.After(notBefore) {
		return nil, false
	}
	ent.served = true
	return ent.rec, true
}

// refuse remembers a refusal for reason r decided on rec, when rec is
// still id's entry.
func (l *recordLRU) refuse(id string, rec *Record, r Reason) {
	if l.c == nil || r <= 0 || r >= 16 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ent, ok := l.c.Peek(id); ok && ent.rec == rec {
		ent.refused |= 1 << r
	}
}

// refused reports whether a refusal for reason r was remembered on rec,
// id's entry, read after notBefore.
func (l *recordLRU) refused(id string, rec *Record, r Reason, notBefore time.Time) bool {
	if l.c == nil || r <= 0 || r >= 16 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ent, ok := l.c.Peek(id)
	return ok && ent.rec == rec && ent.refused&(1<<r) != 0 && ent.fetched.After(notBefore)
}

func (l *recordLRU) len() int {
	if l.c == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.Len()
}

// blobLRU holds verified segment bytes within a byte budget that counts
// the entries and the fills in progress.
// Hand-written: golang-lru bounds a count of entries, not bytes with reservations for fills under way.
type blobLRU struct {
	mu       sync.Mutex
	max      int64
	used     int64 // entries
	inflight int64 // reserved by fills in progress
	ll       *list.List
	m        map[string]*list.Element
	evicted  atomic.Int64
}

type blobEntry struct {
	id string
	b  []byte
}

func newBlobLRU(max int64) *blobLRU {
	return &blobLRU{max: max, ll: list.New(), m: map[string]*list.Element{}}
}

func (l *blobLRU) get(id string) ([]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[id]
	if !ok {
		return nil, false
	}
	l.ll.MoveToFront(e)
	return e.Value.(*blobEntry).b, true
}

// peek is get without making id the most recently used.
func (l *blobLRU) peek(id string) ([]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.m[id]; ok {
		return e.Value.(*blobEntry).b, true
	}
	return nil, false
}

// reserve makes room for a fill of n bytes, evicting least recently used
// entries; false when fills in progress leave no room.
func (l *blobLRU) reserve(n int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight+n > l.max {
		return false
	}
	l.evictLocked(l.max - l.inflight - n)
	l.inflight += n
	return true
}

func (l *blobLRU) release(n int64) {
	l.mu.Lock()
	l.inflight -= n
	l.mu.Unlock()
}

// insert turns a reservation of len(b) bytes into an entry.
func (l *blobLRU) insert(id string, b []byte) {
	n := int64(len(b))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight -= n
	if _, ok := l.m[id]; ok {
		return
	}
	l.evictLocked(l.max - l.inflight - n)
	l.m[id] = l.ll.PushFront(&blobEntry{id: id, b: b})
	l.used += n
}

// evictLocked drops least recently used entries until used <= limit.
func (l *blobLRU) evictLocked(limit int64) {
	for l.used > limit {
		old := l.ll.Back()
		if old == nil {
			return
		}
		l.ll.Remove(old)
		ent := old.Value.(*blobEntry)
		delete(l.m, ent.id)
		l.used -= int64(len(ent.b))
		l.evicted.Add(1)
	}
}

func (l *blobLRU) usage() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used + l.inflight
}
