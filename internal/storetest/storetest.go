// Package storetest opens the segment store backends for tests: a seeded
// SQLite store file in a chosen journal mode, an S3 store on a local
// versitygw (internal/s3test), and the small segments and publications
// those tests put in them. The backends' own tests (store/sqlite,
// store/s3) and the tests of the cache in front of them (store) share
// it, since a test package cannot import another's test files. It is
// imported by tests only.
package storetest

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// OpenSQLite opens the store file at path with default options, closed
// when the test ends.
func OpenSQLite(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// JournalStore seeds a store file in journal mode mode ("wal" or
// "delete") with segs, each under Pub(), and opens it with SQLite. It
// returns the writer (still open, for writes during the test), the
// store, the segments' ids in order, and the journal modes the store
// reported at open.
func JournalStore(t testing.TB, mode string, segs ...[]byte) (*seed.Writer, *sqlite.Store, []string, []string) {
	t.Helper()
	w, err := seed.Create(filepath.Join(t.TempDir(), "segments.sqlite"), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if err := w.Exec("PRAGMA journal_mode=" + mode); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, b := range segs {
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: Pub()})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var seen []string
	s, err := sqlite.Open(w.Path(), sqlite.Options{
		JournalMode: func(_, m string) { seen = append(seen, m) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return w, s, ids, seen
}

// Bytes is n pseudo-random bytes, the same for the same seed s.
func Bytes(n int, s uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// Pub is a live publication (partition p1, scope digest d) that expires
// far in the future.
func Pub() store.Publication {
	return store.Publication{Partition: "p1", LogEpoch: "e1", Table: "t", SchemaVersion: 1,
		ScopeDigest: "d", AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: 1, ExpiresAtMs: 1 << 50}
}

// Expiry is the ExpiresAtMs of rec's first publication, failing the
// test when the lookup that returned rec failed or found none.
func Expiry(t testing.TB, rec *store.Record, err error) int64 {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Publications) == 0 {
		t.Fatal("no publications")
	}
	return rec.Publications[0].ExpiresAtMs
}

// SmallBlobs is n distinct segments of 100, 101, ... bytes.
func SmallBlobs(n int) [][]byte {
	segs := make([][]byte, n)
	for i := range segs {
		segs[i] = Bytes(100+i, uint64(i))
	}
	return segs
}

// S3Bucket is the bucket the S3 tests create and open.
const S3Bucket = "segments"

// S3Store opens an S3 store of S3Bucket under prefix on srv, path-style,
// with a 3 s timeout, after mod (nil: none) edits the options; closed
// when the test ends.
func S3Store(t testing.TB, srv *s3test.Server, prefix string, mod func(*s3.Options)) *s3.Store {
	t.Helper()
	cfg := s3.Options{
		Bucket:          S3Bucket,
		Region:          srv.Region,
		Endpoint:        srv.Endpoint,
		Prefix:          prefix,
		AccessKeyID:     srv.AccessKey,
		SecretAccessKey: srv.SecretKey,
		PathStyle:       true,
		Timeout:         3 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	st, err := s3.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// S3RecordMap is a valid record of body as a JSON object (partition p1,
// scope digest d1, expiresAtMs 1750086400000), after edit (nil: none)
// changes its fields.
func S3RecordMap(body []byte, edit func(m map[string]any)) map[string]any {
	m := map[string]any{
		"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": "d1", "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
		"segmentId": s3test.SegmentID(body), "byteLength": len(body),
		"createdAtMs": 1750000000000, "expiresAtMs": 1750086400000,
	}
	if edit != nil {
		edit(m)
	}
	return m
}

// S3Record is S3RecordMap as a record header.
func S3Record(body []byte, edit func(m map[string]any)) string {
	return s3test.RecordHeader(S3RecordMap(body, edit))
}
