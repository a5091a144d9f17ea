package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/disk"
)

// TestStoreOpenRangeContract runs the same ranges, at, inside and past a
// segment's end, against a SQLite file written as the reference writes it
// and a bucket on a real versitygw, each bare and behind Cached's tiers
// (pass-through, memory, disk): every one must cut the range at the end
// and read nothing, without an error, from an offset at or past it (the
// Store.Open contract).
func TestStoreOpenRangeContract(t *testing.T) {
	// Small (one substr / one GET) and over SQLite's streaming threshold
	// (1 MiB chunks).
	segs := [][]byte{contractBytes(t, 1000), contractBytes(t, 1<<20+17)}
	ids := make([]string, len(segs))

	dbPath := filepath.Join(t.TempDir(), "segments.sqlite")
	w, err := seed.Create(dbPath, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range segs {
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: store.Publication{
			Partition: "p1", LogEpoch: "e1", Table: "t", SchemaVersion: 1, ScopeDigest: strings.Repeat("d", 64),
			CreatedAtMs: 1, ExpiresAtMs: 1 << 50,
		}})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sq := storetest.OpenSQLite(t, dbPath)

	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	for i, b := range segs {
		if id := s3test.PutSegment(t, srv.Client(), storetest.S3Bucket, "", b, storetest.S3Record(b, nil)); id != ids[i] {
			t.Fatalf("segment %d: %s in the bucket, %s in the file", i, id, ids[i])
		}
	}
	s3s := storetest.S3Store(t, srv, "", nil)

	for _, backend := range []struct {
		name  string
		inner store.Store
	}{{"sqlite", sq}, {"s3", s3s}} {
		t.Run(backend.name, func(t *testing.T) {
			checkOpenContract(t, backend.inner, ids, segs)
			for _, tier := range []string{"pass-through", "memory", "disk"} {
				t.Run(tier, func(t *testing.T) {
					checkOpenContract(t, contractCache(t, backend.inner, tier, ids), ids, segs)
				})
			}
		})
	}
}

// contractCache puts a Cached in front of inner whose Open answers from
// the named tier: no record known (pass-through), the bytes cache, or the
// disk tier (bytes cache off). The caller keeps inner open.
func contractCache(t *testing.T, inner store.Store, tier string, ids []string) *store.Cached {
	t.Helper()
	opts := store.CacheOptions{RecordTTL: time.Hour, MaxRecords: 100}
	switch tier {
	case "memory":
		opts.MaxBytes, opts.MaxEntry = 8<<20, 8<<20
	case "disk":
		d, err := disk.New(disk.Options{Dir: t.TempDir(), MaxBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		opts.Disk = d
	}
	c := store.NewCached(inner, opts)
	t.Cleanup(c.Stop) // not Close: that would close inner
	if tier != "pass-through" {
		for _, id := range ids {
			if _, err := c.Lookup(context.Background(), idOf(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return c
}

func checkOpenContract(t *testing.T, s store.Store, ids []string, segs [][]byte) {
	t.Helper()
	ctx := context.Background()
	for i, b := range segs {
		l := int64(len(b))
		for _, c := range []struct{ off, n int64 }{
			{0, -1}, {0, 0}, {0, l}, {3, 5}, {5, 2 * l}, {l - 1, -1}, {l - 1, 7}, // inside, some cut at the end
			{l, -1}, {l, 0}, {l, 3}, // at the end
			{l + 1, -1}, {l + 10, 2}, {2*l + 5, -1}, {1 << 40, 1}, // past the end
		} {
			lo, hi := min(c.off, l), l
			if c.n >= 0 {
				hi = min(c.off+c.n, l)
			}
			want := b[lo:max(lo, hi)]
			rc, err := s.Open(ctx, idOf(ids[i]), c.off, c.n)
			if err != nil {
				t.Errorf("segment of %d bytes: Open(%d, %d): %v; want %d bytes", l, c.off, c.n, err, len(want))
				continue
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("segment of %d bytes: Open(%d, %d) read %d bytes (%v); want b[%d:%d]", l, c.off, c.n, len(got), err, lo, max(lo, hi))
			}
		}
		if rc, err := s.Open(ctx, idOf(ids[i]), -1, 1); err == nil || errors.Is(err, store.ErrNotFound) {
			if rc != nil {
				rc.Close()
			}
			t.Errorf("Open(-1, 1) = %v; want an error other than ErrNotFound", err)
		}
	}
}

func contractBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
