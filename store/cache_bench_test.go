package store_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// The grant check as the handler runs it on a warm edge: the record comes
// from the record cache (Cached.Lookup hit) and store.Grant evaluates it
// with the request's clock. One benchmark per backend behind the cache:
// a seeded SQLite file, and a real versitygw (S3).

var benchNowMs = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

func benchAud(p string) string { return "aud:" + p }

func benchGrant(b *testing.B, c *store.Cached, id, sd string) {
	ctx := context.Background()
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec, err := c.Lookup(ctx, idOf(id))
			if err != nil {
				b.Error(err)
				return
			}
			if out := store.Grant(rec, sd, "aud:p1", benchAud, benchNowMs).Outcome; out != store.Granted {
				b.Errorf("grant: %v", out)
				return
			}
		}
	})
	b.StopTimer()
	if st := c.Stats(); st.RecordMisses != 1 {
		b.Fatalf("record cache missed %d times", st.RecordMisses)
	}
}

func cachedForBench(inner store.Store) *store.Cached {
	o := store.DefaultCacheOptions()
	o.RecordTTL = time.Hour // no refetch during the run
	return store.NewCached(inner, o)
}

func BenchmarkCachedGrantSQLite(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.sqlite")
	w, err := seed.Create(path, 3)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	sd := strings.Repeat("a", 64)
	p := store.Publication{Partition: "p1", LogEpoch: "e1", Table: "tasks", ScopeDigest: sd, ExpiresAtMs: benchNowMs + 3600_000}
	id, err := w.Put(seed.SegmentInput{Bytes: bytes.Repeat([]byte{7}, 2048), Publication: p})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.SetEpoch("p1", "e1", 1); err != nil {
		b.Fatal(err)
	}
	s, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	c := cachedForBench(s)
	defer c.Close()
	benchGrant(b, c, id, sd)
}

func BenchmarkCachedGrantS3(b *testing.B) {
	srv := s3test.Start(b)
	srv.CreateBucket(b, "bench")
	body := bytes.Repeat([]byte{9}, 2048)
	sd := strings.Repeat("a", 64)
	rec := map[string]any{
		"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": sd, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
		"segmentId": s3test.SegmentID(body), "byteLength": len(body),
		"createdAtMs": benchNowMs, "expiresAtMs": benchNowMs + 3600_000,
	}
	id := s3test.PutSegment(b, srv.Client(), "bench", "", body, s3test.RecordHeader(rec))
	s, err := s3.New(context.Background(), s3.Options{
		Bucket: "bench", Region: srv.Region, Endpoint: srv.Endpoint,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, PathStyle: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	c := cachedForBench(s)
	defer c.Close()
	benchGrant(b, c, id, sd)
}
