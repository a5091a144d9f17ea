package sqlite_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// lookupExpiry looks id up and returns its first publication's expiry.
func lookupExpiry(t *testing.T, s *sqlite.Store, id string) int64 {
	t.Helper()
	rec, err := s.Lookup(context.Background(), idOf(id))
	return storetest.Expiry(t, rec, err)
}

// setExpiry rewrites a segment's expiry in both tables a gen-3 record
// reads from.
func setExpiry(db interface {
	Exec(string, ...any) (sql.Result, error)
}, id string, ms any) error {
	for _, tbl := range []string{"sync_segments", "sync_segment_publications"} {
		if _, err := db.Exec("UPDATE "+tbl+" SET expires_at_ms = ? WHERE segment_id = ?", ms, id); err != nil {
			return err
		}
	}
	return nil
}

// In a rollback journal a record read under a lock is kept and answered
// again without a lock while the file's header says nothing was
// committed; any commit (to the record or anywhere else) makes the next
// lookup read again, and a changed record is seen at once.
func TestSQLiteRecordSnapshot(t *testing.T) {
	w, s, ids, _ := storetest.JournalStore(t, "delete", storetest.Bytes(100, 1), storetest.Bytes(200, 2))
	ctx := context.Background()
	a, b := ids[0], ids[1]
	want := storetest.Pub().ExpiresAtMs

	rec, err := s.Lookup(ctx, idOf(a))
	if got := storetest.Expiry(t, rec, err); got != want {
		t.Fatalf("expiry %d, want %d", got, want)
	}
	rec2, err := s.Lookup(ctx, idOf(a))
	storetest.Expiry(t, rec2, err)
	st := s.RecordReadStats()
	if st.SnapshotHits != 1 || st.ReadTransactions() != 1 {
		t.Fatalf("after two lookups of one record, nothing committed: %+v, want 1 hit, 1 batch", st)
	}
	if rec2 != rec {
		t.Error("the snapshot answered a different record")
	}
	// Another record at the same header joins the snapshot.
	for range 2 {
		if _, err := s.Lookup(ctx, idOf(b)); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.RecordReadStats(); st.SnapshotHits != 2 || st.ReadTransactions() != 2 {
		t.Fatalf("%+v, want 2 hits, 2 batches", st)
	}

	// A commit elsewhere in the file: read again, same answer.
	if err := w.Exec("CREATE TABLE other (n INTEGER)"); err != nil {
		t.Fatal(err)
	}
	if err := w.Exec("INSERT INTO other VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	rec, err = s.Lookup(ctx, idOf(a))
	if got := storetest.Expiry(t, rec, err); got != want {
		t.Fatalf("expiry %d, want %d", got, want)
	}
	if st := s.RecordReadStats(); st.SnapshotHits != 2 || st.ReadTransactions() != 3 {
		t.Fatalf("after a commit: %+v, want no new hit and a new batch", st)
	}

	// The record itself changes: the next lookup sees it.
	for _, ms := range []int64{5, 6, 7} {
		if err := w.Exec("UPDATE sync_segments SET expires_at_ms = ? WHERE segment_id = ?", ms, a); err != nil {
			t.Fatal(err)
		}
		if err := w.Exec("UPDATE sync_segment_publications SET expires_at_ms = ? WHERE segment_id = ?", ms, a); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			rec, err := s.Lookup(ctx, idOf(a))
			if got := storetest.Expiry(t, rec, err); got != ms {
				t.Fatalf("expiry %d after the writer set %d", got, ms)
			}
		}
	}
}

// A WAL file's records are never answered from a snapshot (its commits
// do not change the database file's header).
func TestSQLiteRecordSnapshotNotInWAL(t *testing.T) {
	w, s, ids, _ := storetest.JournalStore(t, "wal", storetest.Bytes(100, 1))
	ctx := context.Background()
	for _, ms := range []int64{5, 6} {
		if err := w.Exec("UPDATE sync_segments SET expires_at_ms = ? WHERE segment_id = ?", ms, ids[0]); err != nil {
			t.Fatal(err)
		}
		if err := w.Exec("UPDATE sync_segment_publications SET expires_at_ms = ? WHERE segment_id = ?", ms, ids[0]); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			rec, err := s.Lookup(ctx, idOf(ids[0]))
			if got := storetest.Expiry(t, rec, err); got != ms {
				t.Fatalf("expiry %d after the writer set %d", got, ms)
			}
		}
	}
	if st := s.RecordReadStats(); st != (sqlite.RecordReadStats{}) {
		t.Fatalf("WAL: %+v, want no snapshot and no batches", st)
	}
}

// A writer's transaction that spilled its change of the record into the
// database file and then rolled back: while it is open the change is
// never answered, and after the rollback (which restores the header) the
// kept record, the committed one, is.
func TestSQLiteRecordSnapshotSpilledRollback(t *testing.T) {
	w, _, ids, _ := storetest.JournalStore(t, "delete", storetest.Bytes(100, 1))
	s, err := sqlite.Open(w.Path(), sqlite.Options{BusyTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	a, want := ids[0], storetest.Pub().ExpiresAtMs
	if got := lookupExpiry(t, s, a); got != want {
		t.Fatalf("expiry %d, want %d", got, want)
	}

	db, err := sql.Open("sqlite", "file:"+w.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec("PRAGMA cache_size = 10"); err != nil { // pages: spill early
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if err := setExpiry(tx, a, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("CREATE TABLE filler (b BLOB)"); err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		if _, err := tx.Exec("INSERT INTO filler VALUES (?)", storetest.Bytes(16<<10, uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		rec, err := s.Lookup(ctx, idOf(a))
		if err == nil && storetest.Expiry(t, rec, nil) != want {
			t.Fatalf("an uncommitted, spilled change was answered: expiry %d", storetest.Expiry(t, rec, nil))
		}
		t.Logf("lookup during the spilled transaction: %v", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	before := s.RecordReadStats()
	if got := lookupExpiry(t, s, a); got != want {
		t.Fatalf("after the rollback: expiry %d, want %d", got, want)
	}
	t.Logf("after the rollback: %+v (was %+v)", s.RecordReadStats(), before)
}

// A record that does not decode is never kept: every lookup reads it
// again (and fails) until the writer fixes it.
func TestSQLiteRecordUndecodableNotKept(t *testing.T) {
	w, s, ids, _ := storetest.JournalStore(t, "delete", storetest.Bytes(100, 1))
	ctx := context.Background()
	a := ids[0]
	if err := w.Exec("UPDATE sync_segment_publications SET expires_at_ms = 'soon' WHERE segment_id = ?", a); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if rec, err := s.Lookup(ctx, idOf(a)); err == nil {
			t.Fatalf("lookup %d of an undecodable record: %+v, want an error", i, rec)
		}
	}
	if st := s.RecordReadStats(); st.SnapshotHits != 0 {
		t.Fatalf("%+v: an undecodable record was answered from the snapshot", st)
	}
	if err := w.Exec("UPDATE sync_segment_publications SET expires_at_ms = 9 WHERE segment_id = ?", a); err != nil {
		t.Fatal(err)
	}
	if got := lookupExpiry(t, s, a); got != 9 {
		t.Fatalf("expiry %d, want 9", got)
	}
}

// Lookups that arrive while a record read waits for the writer are read
// together: one read transaction for all of them, not one each.
func TestSQLiteRecordLookupsBatch(t *testing.T) {
	const n = 8
	segs := storetest.SmallBlobs(n)
	w, s, ids, _ := storetest.JournalStore(t, "delete", segs...)
	db, err := sql.Open("sqlite", "file:"+w.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Lookup(context.Background(), idOf(id))
		}()
	}
	time.Sleep(300 * time.Millisecond) // every lookup queued behind the lock
	if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("lookup %d: %v", i, err)
		}
	}
	st := s.RecordReadStats()
	if st.Batched != n || st.ReadTransactions() > 2 {
		t.Fatalf("%d concurrent lookups: %+v, want all %d in at most 2 read transactions", n, st, n)
	}
	t.Logf("%+v", st)
}
