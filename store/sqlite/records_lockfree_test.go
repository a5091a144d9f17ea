package sqlite_test

import (
	"context"
	"database/sql"
	"runtime"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// lockFreeStore is a store on a rollback-journal file of one segment,
// with a writer beside it that has no busy handler.
func lockFreeStore(t *testing.T) (*sqlite.Store, *sql.DB, string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("lock-free record reads need F_OFD_GETLK (Linux)")
	}
	w, s, ids, _ := storetest.JournalStore(t, "delete", storetest.Bytes(100, 1))
	return s, busyFreeWriter(t, w.Path()), ids[0]
}

// A record read of a rollback-journal file holds no lock: a writer with
// no busy handler commits in the middle of it. The commit makes that read
// decide nothing (the header moved), and the lookup answers what the
// writer committed, from a second lock-free read.
func TestSQLiteRecordLockFreeBesideCommit(t *testing.T) {
	s, writer, id := lockFreeStore(t)
	calls := 0
	var werr error
	restore := sqlite.SetLockFreeRecordsHook(func() {
		if calls++; calls == 1 {
			werr = setExpiry(writer, id, int64(4242))
		}
	})
	defer restore()

	if got := lookupExpiry(t, s, id); got != 4242 {
		t.Errorf("expiry %d, want 4242: a read the writer committed during was trusted", got)
	}
	if werr != nil {
		t.Fatalf("the writer's commits during the read failed (a lock was held): %v", werr)
	}
	// (A read the machine stalls past its 20 ms window is a miss too,
	// so misses are counted at least, not exactly.)
	st := s.RecordReadStats()
	if st.LockFree != 1 || st.LockFreeMiss < 1 || st.Batches != 0 {
		t.Errorf("%+v, want 1 lock-free read, a miss, no locked read", st)
	}
	aside1, off := sqlite.LockFreeRecordsAsideForTest(s)
	if n := aside1; n < 1 || off {
		// The first read on a connection loads the schema: a miss there
		// sets the connection aside.
		t.Errorf("set aside %d (off %v), want the first connection set aside", n, off)
	}

	// A miss on a connection that has verified a read, with the schema
	// unchanged, keeps the connection (its page cache dropped).
	calls = 0
	if err := setExpiry(writer, id, int64(4343)); err != nil {
		t.Fatal(err)
	}
	if got := lookupExpiry(t, s, id); got != 4242 {
		// The hook committed 4242 again during the first read.
		t.Errorf("expiry %d, want 4242", got)
	}
	if werr != nil {
		t.Fatal(werr)
	}
	if n, _ := sqlite.LockFreeRecordsAsideForTest(s); n != aside1 {
		t.Errorf("set aside %d, want still %d", n, aside1)
	}
	if st2 := s.RecordReadStats(); st2.LockFree != 2 || st2.LockFreeMiss <= st.LockFreeMiss || st2.Batches != 0 {
		t.Errorf("%+v, want 2 lock-free reads, another miss, no locked read", st2)
	}
}

// A schema change during a lock-free read sets the connection aside;
// past a few such connections the handle reads with locks only.
func TestSQLiteRecordLockFreeSchemaChangeSetsAside(t *testing.T) {
	s, writer, id := lockFreeStore(t)
	lookupExpiry(t, s, id) // a verified read: the first connection is trusted
	n := 0
	var werr error
	restore := sqlite.SetLockFreeRecordsHook(func() {
		n++
		if _, err := writer.Exec("CREATE TABLE IF NOT EXISTS t" + string(rune('a'+n)) + " (x INTEGER)"); err != nil {
			werr = err
		}
	})
	defer restore()
	before := s.RecordReadStats()
	for range 2 {
		if err := setExpiry(writer, id, int64(5000+n)); err != nil { // the snapshot no longer answers
			t.Fatal(err)
		}
		lookupExpiry(t, s, id)
	}
	if werr != nil {
		t.Fatalf("a schema change during the read failed: %v", werr)
	}
	aside, off := sqlite.LockFreeRecordsAsideForTest(s)
	if !off || aside < 4 {
		t.Errorf("set aside %d, off %v: want reads with locks after 4 connections set aside", aside, off)
	}
	st := s.RecordReadStats()
	if st.LockFree != before.LockFree || st.Batches-before.Batches != 2 {
		t.Errorf("%+v (before %+v): want the two lookups read with locks", st, before)
	}
}

// A writer that holds its RESERVED lock in a journal mode without a
// journal file (MEMORY) is seen by its lock alone: the lookup is not
// read lock-free (a locked read, which RESERVED allows, answers).
func TestSQLiteRecordLockFreeSeesWriterLock(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("lock-free record reads need F_OFD_GETLK (Linux)")
	}
	w, s, ids, _ := storetest.JournalStore(t, "delete", storetest.Bytes(100, 1))
	writer := busyFreeWriter(t, w.Path())
	ctx := context.Background()
	conn, err := writer.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{"PRAGMA journal_mode=MEMORY", "BEGIN IMMEDIATE", "INSERT INTO ticks (n) VALUES (2)"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got, want := lookupExpiry(t, s, ids[0]), storetest.Pub().ExpiresAtMs; got != want {
		t.Errorf("expiry %d, want %d", got, want)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if st := s.RecordReadStats(); st.LockFree != 0 || st.Batches != 1 {
		t.Errorf("%+v: want no lock-free read while the writer held RESERVED, 1 locked read", st)
	}
	lookupExpiry(t, s, ids[0]) // the snapshot, or a lock-free read now
	if st := s.RecordReadStats(); st.Batches != 1 {
		t.Errorf("%+v: want no second locked read once the writer is gone", st)
	}
}

// A lock-free read that took longer than its window (20 ms) is not
// trusted even though nothing changed: it is read again. Its connection
// is kept (the checks saw no change, so no schema moved).
func TestSQLiteRecordLockFreeSlowReadIsReadAgain(t *testing.T) {
	s, _, id := lockFreeStore(t)
	calls := 0
	restore := sqlite.SetLockFreeRecordsHook(func() {
		if calls++; calls == 1 {
			time.Sleep(30 * time.Millisecond)
		}
	})
	defer restore()
	if got, want := lookupExpiry(t, s, id), storetest.Pub().ExpiresAtMs; got != want {
		t.Errorf("expiry %d, want %d", got, want)
	}
	if st := s.RecordReadStats(); st.LockFree+st.Batches != 1 || st.LockFreeMiss < 1 {
		t.Errorf("%+v: want the slow read discarded and the record read again", st)
	}
	if n, off := sqlite.LockFreeRecordsAsideForTest(s); n != 0 || off {
		t.Errorf("set aside %d (off %v), want none", n, off)
	}
}

// A schema change whose writer still holds its lock when the read ends
// is seen once the writer is done: the connection, which may have loaded
// the schema mid-change, is set aside.
func TestSQLiteRecordLockFreeSchemaChangeInProgressSetsAside(t *testing.T) {
	s, writer, id := lockFreeStore(t)
	lookupExpiry(t, s, id) // a verified read: the first connection is trusted
	aside0, _ := sqlite.LockFreeRecordsAsideForTest(s)
	if err := setExpiry(writer, id, int64(777)); err != nil { // past the snapshot
		t.Fatal(err)
	}
	// The schema change comes from another process, as a sync server's
	// does: the edge waits for a writer it can see (writerproc_test.go).
	// With the writer in this process the lookup, once its lock-free
	// reads were spent, took a SHARED lock the writer's COMMIT then met
	// (SQLITE_BUSY on a loaded machine).
	wp := startWriterProc(t, sqlite.PathForTest(s))
	calls := 0
	var werr error
	done := make(chan struct{})
	restore := sqlite.SetLockFreeRecordsHook(func() {
		if calls++; calls != 1 {
			return
		}
		// The writer begins a schema change during the read and commits
		// it a moment after the read has ended.
		for _, q := range []string{"BEGIN IMMEDIATE", "CREATE TABLE mid (x INTEGER)"} {
			if werr = wp.exec(q); werr != nil {
				close(done)
				return
			}
		}
		go func() {
			defer close(done)
			time.Sleep(5 * time.Millisecond)
			werr = wp.exec("COMMIT")
		}()
	})
	defer restore()
	if got := lookupExpiry(t, s, id); got != 777 {
		t.Errorf("expiry %d, want 777", got)
	}
	<-done
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	if n, _ := sqlite.LockFreeRecordsAsideForTest(s); n != aside0+1 {
		t.Errorf("set aside %d, want %d: a schema change in progress at the read's end was not seen", n, aside0+1)
	}
}
