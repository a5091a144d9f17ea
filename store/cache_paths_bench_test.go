package store

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"
)

// Benchmarks of the cache's own paths against an in-memory inner store, so
// the numbers are the cache's cost alone: the record LRU (hit, and churn
// with evictions), the shared call every miss goes through, and the bytes
// LRU (hit, and fills that evict).

func benchCached(b *testing.B, opts CacheOptions, ids int, size int) (*Cached, []string) {
	b.Helper()
	inner := newCountingStore()
	list := make([]string, ids)
	for i := range list {
		data := seg(size, byte(i))
		copy(data, fmt.Sprint(i)) // distinct contents, distinct ids
		list[i] = inner.add(data)
	}
	return NewCached(inner, opts), list
}

// BenchmarkCachedLookupHit: a record LRU hit.
func BenchmarkCachedLookupHit(b *testing.B) {
	o := DefaultCacheOptions()
	o.RecordTTL = time.Hour
	c, ids := benchCached(b, o, 64, 16)
	ctx := context.Background()
	for _, id := range ids {
		if _, err := c.Lookup(ctx, idOf(id)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := c.Lookup(ctx, idOf(ids[i%len(ids)])); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCachedLookupShared: record TTL 0, so every Lookup is a shared
// (coalesced) call to the inner store.
func BenchmarkCachedLookupShared(b *testing.B) {
	o := DefaultCacheOptions()
	o.RecordTTL = 0
	c, ids := benchCached(b, o, 8, 16)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := c.Lookup(ctx, idOf(ids[i%len(ids)])); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCachedRecordChurn: more ids than MaxRecords, so every Lookup
// misses, stores its record and evicts the least recently used one.
func BenchmarkCachedRecordChurn(b *testing.B) {
	o := DefaultCacheOptions()
	o.RecordTTL = time.Hour
	o.MaxRecords = 64
	c, ids := benchCached(b, o, 1024, 16)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Lookup(ctx, idOf(ids[i%len(ids)])); err != nil {
			b.Fatal(err)
		}
	}
	if c.Stats().RecordEvictions == 0 && b.N > len(ids) {
		b.Fatal("no record evictions")
	}
}

// BenchmarkCachedOpenHit: a 2 KiB segment served from the bytes LRU.
func BenchmarkCachedOpenHit(b *testing.B) {
	c, ids := benchCached(b, DefaultCacheOptions(), 16, 2048)
	ctx := context.Background()
	for _, id := range ids {
		if _, err := c.Lookup(ctx, idOf(id)); err != nil {
			b.Fatal(err)
		}
		rc, err := c.Open(ctx, idOf(id), 0, -1)
		if err != nil {
			b.Fatal(err)
		}
		rc.Close()
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			rc, err := c.Open(ctx, idOf(ids[i%len(ids)]), 0, -1)
			if err != nil {
				b.Error(err)
				return
			}
			rc.Close()
		}
	})
	b.StopTimer()
	if st := c.Stats(); st.ByteMisses != int64(len(ids)) {
		b.Fatalf("bytes cache missed %d times, want %d", st.ByteMisses, len(ids))
	}
}

// BenchmarkCachedOpenFill: a bytes budget of 4 segments cycled over 16,
// so every Open is a shared fill (read, hash, insert) that evicts one.
func BenchmarkCachedOpenFill(b *testing.B) {
	o := DefaultCacheOptions()
	o.MaxBytes = 4 * 2048
	c, ids := benchCached(b, o, 16, 2048)
	ctx := context.Background()
	for _, id := range ids {
		if _, err := c.Lookup(ctx, idOf(id)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rc, err := c.Open(ctx, idOf(ids[i%len(ids)]), 0, -1)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, rc); err != nil {
			b.Fatal(err)
		}
		rc.Close()
	}
	b.StopTimer()
	if st := c.Stats(); st.PassThrough != 0 || (b.N > len(ids) && st.ByteEvictions == 0) {
		b.Fatalf("fills: %+v", st)
	}
}
