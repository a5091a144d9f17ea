package store

import (
	"database/sql"
	"sync"
	"time"
)

// SQLiteDBForTest exposes the pool of s, so a test can try to write
// through the store's own handle.
func SQLiteDBForTest(s *SQLite) *sql.DB { return s.cur.Load().db }

// SQLiteDSNForTest is the DSN OpenSQLite builds for an absolute path.
func SQLiteDSNForTest(abs string, busy time.Duration) string { return sqliteDSN(abs, busy) }

// SetLockFreeRecordsHook runs f inside every lock-free record read (after
// its reads, before its transaction ends) until the returned func runs.
func SetLockFreeRecordsHook(f func()) (restore func()) {
	lockFreeRecordsHook = f
	return func() { lockFreeRecordsHook = nil }
}

// LockFreeRecordsAsideForTest is how many nolock connections s's handle
// has set aside, and whether its lock-free record reads are off.
func LockFreeRecordsAsideForTest(s *SQLite) (int, bool) {
	h := s.cur.Load()
	if h == nil || h.records == nil || h.records.lockFree == nil {
		return 0, true
	}
	return len(h.records.lockFree.aside), h.records.lockFree.off
}

// TestClock is a settable clock for CacheOptions.Now, safe for
// concurrent use.
type TestClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewTestClock is a TestClock at t.
func NewTestClock(t time.Time) *TestClock { return &TestClock{t: t} }

// Now is the clock's time.
func (c *TestClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Add moves the clock on by d.
func (c *TestClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// SQLitePathForTest is the store's file.
func SQLitePathForTest(s *SQLite) string { return s.path }

// GroupStats counts the group reads (RecordGroupReader.LookupGroup
// calls) and the records they refreshed.
func (c *Cached) GroupStats() (reads, refreshed int64) {
	return c.groupReads.Load(), c.groupRefreshed.Load()
}

// ReadTransactions is how many read transactions answered lookups: with
// a lock (Batches) or without (LockFree).
func (st RecordReadStats) ReadTransactions() int64 { return st.Batches + st.LockFree }
