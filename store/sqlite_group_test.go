package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

const groupTTL = 2 * time.Second

// groupSetup: n segments in a file in mode, a cache in front of it on a
// test clock, every record read and then served once by a hit, a commit
// (so the next read cannot be answered from the store's snapshot), and
// the clock past the records' TTL.
func groupSetup(t *testing.T, mode string, n int) (*seed.Writer, *sqlite.Store, *store.Cached, []string) {
	t.Helper()
	segs := storetest.SmallBlobs(n)
	w, s, ids, _ := storetest.JournalStore(t, mode, segs...)
	clk := store.NewTestClock(time.Unix(1000, 0))
	c := store.NewCached(s, store.CacheOptions{RecordTTL: groupTTL, MaxRecords: 100, Now: clk.Now})
	t.Cleanup(c.Stop)
	for _, id := range ids {
		for range 2 {
			if _, err := c.Lookup(context.Background(), idOf(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Exec("CREATE TABLE other (n INTEGER)"); err != nil {
		t.Fatal(err)
	}
	clk.Add(groupTTL + time.Millisecond)
	return w, s, c, ids
}

// In a rollback journal, one lookup after the TTL refreshes every record
// of the working set in one read transaction: the others are then
// answered from memory, and a record the writer changed meanwhile is
// seen with its new value.
func TestSQLiteGroupRefreshOneTransaction(t *testing.T) {
	const n = 12
	w, s, c, ids := groupSetup(t, "delete", n)
	changed := ids[n/2]
	for _, tbl := range []string{"sync_segments", "sync_segment_publications"} {
		if err := w.Exec("UPDATE "+tbl+" SET expires_at_ms = 7 WHERE segment_id = ?", changed); err != nil {
			t.Fatal(err)
		}
	}
	before, cs := s.RecordReadStats(), c.Stats()
	if _, err := c.Lookup(context.Background(), idOf(ids[0])); err != nil {
		t.Fatal(err)
	}
	st := s.RecordReadStats()
	if readTransactions(st)-readTransactions(before) != 1 || st.Grouped-before.Grouped != n-1 || st.SnapshotHits != before.SnapshotHits {
		t.Fatalf("one lookup after the TTL: %+v (was %+v), want 1 read transaction with the %d others in it", st, before, n-1)
	}
	if reads, refreshed := c.GroupStats(); reads != 1 || refreshed != n-1 {
		t.Fatalf("group reads %d, refreshed %d, want 1 and %d", reads, refreshed, n-1)
	}
	for _, id := range ids[1:] {
		rec, err := c.Lookup(context.Background(), idOf(id))
		want := storetest.Pub().ExpiresAtMs
		if id == changed {
			want = 7
		}
		if got := storetest.Expiry(t, rec, err); got != want {
			t.Fatalf("%s: expiry %d, want %d", id, got, want)
		}
	}
	if got := c.Stats().RecordMisses - cs.RecordMisses; got != 1 {
		t.Fatalf("%d store reads for %d records after the TTL, want 1", got, n)
	}
	if st2 := s.RecordReadStats(); readTransactions(st2) != readTransactions(st) {
		t.Fatalf("%+v: the refreshed records were read again", st2)
	}
}

// A group read leaves out what it cannot answer: a record removed from
// the store or one that does not decode is not refreshed (it expires and
// is read on its own), and is not remembered as a miss.
func TestSQLiteGroupRefreshSkipsMissingAndUndecodable(t *testing.T) {
	w, s, c, ids := groupSetup(t, "delete", 4)
	if err := w.DeleteSegment(ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := w.Exec("UPDATE sync_segment_publications SET expires_at_ms = 'soon' WHERE segment_id = ?", ids[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(context.Background(), idOf(ids[0])); err != nil {
		t.Fatal(err)
	}
	if _, refreshed := c.GroupStats(); refreshed != 1 {
		t.Fatalf("refreshed %d, want 1 (only %s)", refreshed, ids[3])
	}
	cs := c.Stats()
	if _, err := c.Lookup(context.Background(), idOf(ids[1])); err != store.ErrNotFound {
		t.Fatalf("deleted record: %v, want ErrNotFound", err)
	}
	if _, err := c.Lookup(context.Background(), idOf(ids[2])); err == nil {
		t.Fatal("undecodable record: answered")
	}
	if _, err := c.Lookup(context.Background(), idOf(ids[3])); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().RecordMisses - cs.RecordMisses; got != 2 {
		t.Fatalf("%d store reads, want 2 (the deleted and the undecodable record, each on its own)", got)
	}
	_ = s
}

// In WAL there are no group reads: readers never fail a commit, and each
// record is read on its own.
func TestSQLiteGroupRefreshNotInWAL(t *testing.T) {
	const n = 6
	_, s, c, ids := groupSetup(t, "wal", n)
	if s.GroupSize() != 0 {
		t.Fatalf("GroupSize %d in WAL, want 0", s.GroupSize())
	}
	cs := c.Stats()
	for _, id := range ids {
		if _, err := c.Lookup(context.Background(), idOf(id)); err != nil {
			t.Fatal(err)
		}
	}
	if reads, refreshed := c.GroupStats(); reads != 0 || refreshed != 0 {
		t.Fatalf("WAL: group reads %d, refreshed %d, want none", reads, refreshed)
	}
	if got := c.Stats().RecordMisses - cs.RecordMisses; got != n {
		t.Fatalf("WAL: %d store reads for %d expired records, want %d", got, n, n)
	}
	if st := s.RecordReadStats(); st.Grouped != 0 {
		t.Fatalf("WAL: %+v", st)
	}
}

// readTransactions is how many read transactions answered lookups: with
// a lock (Batches) or without (LockFree).
func readTransactions(st sqlite.RecordReadStats) int64 { return st.Batches + st.LockFree }
