package store

import (
	"database/sql"
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
