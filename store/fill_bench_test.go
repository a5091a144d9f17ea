package store_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
)

// BenchmarkCachedFillSQLite is one fill per Open from a SQLite file, in
// each journal mode, of the memory tier (4 MiB segments) and of the disk
// tier (16 MiB): two segments alternate in a tier with room for one, so
// every Open reads the store, verifies the bytes and serves them. The
// cost per fill is the copy and the SHA-256 of its bytes; a
// rollback-journal file's lock-free read hashes them as it reads.
func BenchmarkCachedFillSQLite(b *testing.B) {
	for _, tier := range []struct {
		name string
		size int
	}{{"memory", 4 << 20}, {"disk", 16 << 20}} {
		for _, mode := range []string{"delete", "wal"} {
			b.Run(tier.name+"/"+mode, func(b *testing.B) {
				_, s, ids, _ := storetest.JournalStore(b, mode, storetest.Bytes(tier.size, 1), storetest.Bytes(tier.size, 2))
				o := store.DefaultCacheOptions()
				o.RecordTTL = time.Hour
				if tier.name == "memory" {
					o.MaxBytes, o.MaxEntry = int64(tier.size), int64(tier.size)
				} else {
					o.MaxBytes = 0
					d, err := store.NewDiskTier(store.DiskOptions{Dir: b.TempDir(), MaxBytes: int64(tier.size)})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { d.Close() })
					o.Disk = d
				}
				c := store.NewCached(s, o)
				b.Cleanup(c.Stop)
				ctx := context.Background()
				for _, id := range ids {
					if _, err := c.Lookup(ctx, idOf(id)); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(tier.size))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					rc, err := c.Open(ctx, idOf(ids[i%2]), 0, -1)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := io.Copy(io.Discard, rc); err != nil {
						b.Fatal(err)
					}
					rc.Close()
					i++
				}
			})
		}
	}
}
