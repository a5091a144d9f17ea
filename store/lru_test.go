package store

import (
	"testing"
	"time"
)

func TestRecordLRU(t *testing.T) {
	t0 := time.Unix(1_750_000_000, 0)
	l := newRecordLRU(2)
	a, b, c := &Record{ByteLength: 1}, &Record{ByteLength: 2}, &Record{ByteLength: 3}
	l.put("a", a, t0)
	l.put("b", b, t0.Add(time.Second))

	if got, ok := l.get("b", t0); !ok || got != b {
		t.Fatal("fresh record missed")
	}
	// Too old to answer: a miss, and "a" keeps its place (oldest).
	if _, ok := l.get("a", t0); ok {
		t.Fatal("a record fetched at notBefore answered")
	}
	if !l.stale("b", b) || l.stale("a", a) {
		t.Fatal("stale: want true only for a record a hit handed out")
	}
	if n, ok := l.size("a"); !ok || n != 1 {
		t.Fatalf("size(a) = %d, %v (an old record still knows its length)", n, ok)
	}
	l.put("c", c, t0) // evicts the least recently used: a
	if _, ok := l.size("a"); ok || l.len() != 2 || l.evicted.Load() != 1 {
		t.Fatalf("after eviction: a present %v, len %d, evicted %d", ok, l.len(), l.evicted.Load())
	}
	// A re-put replaces the record in place, not yet served, no eviction.
	b2 := &Record{ByteLength: 2}
	l.put("b", b2, t0.Add(2*time.Second))
	if l.stale("b", b2) || l.evicted.Load() != 1 {
		t.Fatal("re-put: the new record is not stale, nothing evicted")
	}
	if got, ok := l.get("b", t0); !ok || got != b2 || !l.stale("b", b2) {
		t.Fatal("re-put record: a hit hands it out and makes it stale")
	}

	off := newRecordLRU(0)
	off.put("a", a, t0)
	if _, ok := off.get("a", t0.Add(-time.Hour)); ok || off.len() != 0 || !off.stale("a", a) {
		t.Fatal("a zero-size record LRU holds something")
	}
}

func TestBlobLRUBudget(t *testing.T) {
	l := newBlobLRU(10)
	if !l.reserve(6) {
		t.Fatal("reserve within budget refused")
	}
	if l.reserve(5) {
		t.Fatal("fills in progress over the budget")
	}
	l.insert("x", make([]byte, 6))
	if !l.reserve(5) { // evicts x
		t.Fatal("reserve refused though an entry can be evicted")
	}
	if _, ok := l.get("x"); ok || l.evicted.Load() != 1 || l.usage() != 5 {
		t.Fatalf("x present %v, evicted %d, usage %d", ok, l.evicted.Load(), l.usage())
	}
	l.release(5)
	if l.usage() != 0 {
		t.Fatalf("usage %d after release", l.usage())
	}
}
