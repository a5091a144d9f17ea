package sqlite

import (
	"context"
	"database/sql"
	"io"
	"time"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// DBForTest exposes the pool of s, so a test can try to write
// through the store's own handle.
func DBForTest(s *Store) *sql.DB { return s.cur.Load().db }

// DSNForTest is the DSN Open builds for an absolute path.
func DSNForTest(abs string, busy time.Duration) string { return sqliteDSN(abs, busy) }

// SetLockFreeRecordsHook runs f inside every lock-free record read (after
// its reads, before its transaction ends) until the returned func runs.
func SetLockFreeRecordsHook(f func()) (restore func()) {
	lockFreeRecordsHook = f
	return func() { lockFreeRecordsHook = nil }
}

// LockFreeRecordsAsideForTest is how many nolock connections s's handle
// has set aside, and whether its lock-free record reads are off.
func LockFreeRecordsAsideForTest(s *Store) (int, bool) {
	h := s.cur.Load()
	if h == nil || h.records == nil || h.records.lockFree == nil {
		return 0, true
	}
	return len(h.records.lockFree.aside), h.records.lockFree.off
}

// PathForTest is the store's file.
func PathForTest(s *Store) string { return s.path }

// ReadTransactions is how many read transactions answered lookups: with
// a lock (Batches) or without (LockFree).
func (st RecordReadStats) ReadTransactions() int64 { return st.Batches + st.LockFree }

// The optional interfaces store.Cached finds by assertion: a signature
// that drifts from them would silently turn the fast paths off.
var (
	_ interface {
		CopyBlob(context.Context, segid.ID, io.Writer) (int64, error)
		FillInto(context.Context, segid.ID, []byte) error
	} = (*Store)(nil)
	_ store.RecordGroupReader = (*Store)(nil)
	_ store.Reporter          = (*Store)(nil)
)
