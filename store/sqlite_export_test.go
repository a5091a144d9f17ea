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
