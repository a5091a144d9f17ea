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
// fields (fetched, served).
type recordLRU struct {
	mu      sync.Mutex
	c       *simplelru.LRU[string, *recordEntry] // nil: max <= 0, holds nothing
	evicted atomic.Int64
}

type recordEntry struct {
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
		l.c, _ = simplelru.NewLRU[string, *recordEntry](max, nil) // only fails for max <= 0
	}
	return l
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
		return
	}
	if l.c.Add(id, &recordEntry{rec: rec, fetched: fetched}) {
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
