package store_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// The tests of Cached in front of a real backend (open_contract_test.go,
// grant_sqlite_test.go, sqlite_group_test.go) open it with these: copies
// of the backends' own test helpers (store/sqlite, store/s3), since a
// test package cannot import another's tests.

func openStore(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// journalStore seeds a store file in journal mode mode ("wal" or
// "delete") with segs and opens it with SQLite.
func journalStore(t testing.TB, mode string, segs ...[]byte) (*seed.Writer, *sqlite.Store, []string, []string) {
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
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: blobPub()})
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

func blobBytes(n int, s uint64) []byte {
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

func blobPub() store.Publication {
	return store.Publication{Partition: "p1", LogEpoch: "e1", Table: "t", SchemaVersion: 1,
		ScopeDigest: "d", AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: 1, ExpiresAtMs: 1 << 50}
}

// smallBlobs is n distinct segments of 100, 101, ... bytes.
func smallBlobs(n int) [][]byte {
	segs := make([][]byte, n)
	for i := range segs {
		segs[i] = blobBytes(100+i, uint64(i))
	}
	return segs
}

// expiry is the ExpiresAtMs of rec's first publication.
func expiry(t *testing.T, rec *store.Record, err error) int64 {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Publications) == 0 {
		t.Fatal("no publications")
	}
	return rec.Publications[0].ExpiresAtMs
}

const s3Bucket = "segments"

func s3NewStore(t testing.TB, srv *s3test.Server, prefix string, mod func(*s3.Options)) *s3.Store {
	t.Helper()
	cfg := s3.Options{
		Bucket:          s3Bucket,
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

// s3RecordFor is a valid record header for body.
func s3RecordFor(body []byte, edit func(m map[string]any)) string {
	m := map[string]any{
		"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": "d1", "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
		"segmentId": s3test.SegmentID(body), "byteLength": len(body),
		"createdAtMs": 1750000000000, "expiresAtMs": 1750086400000,
	}
	if edit != nil {
		edit(m)
	}
	return s3test.RecordHeader(m)
}

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
