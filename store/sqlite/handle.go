package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// sqliteHandle is one pool opened on one file (inode).
type sqliteHandle struct {
	db   *sql.DB
	fi   os.FileInfo // the file as it was stat'ed before the pool opened it
	use  sync.RWMutex
	gone bool // set under use.Lock when retired; then db is closed

	detectStmt *sql.Stmt
	openStmt   *sql.Stmt
	sizeStmt   *sql.Stmt
	blobPool   blobPool      // incremental blob I/O (stream.go)
	lockFree   lockFreePool  // nolock reads of fills (lockfree.go)
	journal    string        // PRAGMA journal_mode when the pool opened
	busy       time.Duration // how long retryBusy retries
	probe      uint64        // the file for writerActive (sqlite_writerwait_*.go); 0: none
	shape      atomic.Pointer[sqliteShape]
	records    *recordReader // rollback journal: batched, snapshot lookups (records.go)

	stmtMu sync.Mutex
	stmts  map[shapeFlags]*sql.Stmt // lookup statements per schema shape
}

func (s *Store) openHandle(ctx context.Context) (*sqliteHandle, error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("store: sqlite: %s is not a regular file", s.path)
	}
	db, err := sql.Open("sqlite", s.readDSN)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite: open %s: %w", s.path, err)
	}
	db.SetMaxOpenConns(s.maxConns)
	db.SetMaxIdleConns(s.maxConns)
	h := &sqliteHandle{db: db, fi: fi, busy: s.busy, stmts: make(map[shapeFlags]*sql.Stmt)}
	fail := func(err error) (*sqliteHandle, error) {
		h.close()
		return nil, fmt.Errorf("store: sqlite: open %s: %w", s.path, err)
	}
	// Until the journal mode is known, reads wait for a writer as in a
	// rollback journal (a WAL file never shows one).
	h.journal = "delete"
	h.probe = writerProbe(fi)
	prep := func(st **sql.Stmt, q string) error {
		return h.retryBusy(ctx, func() (err error) { *st, err = db.PrepareContext(ctx, q); return err })
	}
	if err := prep(&h.detectStmt, detectSQL); err != nil {
		return fail(err)
	}
	if _, err := h.detectWait(ctx); err != nil {
		return fail(err)
	}
	if err := prep(&h.openStmt, openSQL); err != nil {
		return fail(err)
	}
	if err := prep(&h.sizeStmt, sizeSQL); err != nil {
		return fail(err)
	}
	var mode string
	if err := h.retryBusy(ctx, func() (err error) { mode, err = readJournalMode(ctx, h); return err }); err != nil {
		return fail(fmt.Errorf("journal mode: %w", err))
	}
	h.journal = mode
	if rollbackJournal(mode) {
		h.records = newRecordReader(s.path, &s.recordReadCounters)
	}
	if s.onJournal != nil {
		s.onJournal(s.path, h.journal)
	}
	return h, nil
}

func (h *sqliteHandle) close() error {
	h.stmtMu.Lock()
	for _, st := range h.stmts {
		st.Close()
	}
	h.stmts = nil
	h.stmtMu.Unlock()
	if h.detectStmt != nil {
		h.detectStmt.Close()
	}
	if h.openStmt != nil {
		h.openStmt.Close()
	}
	if h.sizeStmt != nil {
		h.sizeStmt.Close()
	}
	h.blobPool.close()
	h.lockFree.close()
	err := h.db.Close()
	if h.records != nil {
		h.records.close() // last: see recordReader.close
	}
	return err
}

// retire waits for the operations using h, then closes it.
func (h *sqliteHandle) retire() error {
	h.use.Lock()
	defer h.use.Unlock()
	if h.gone {
		return nil
	}
	h.gone = true
	if h.records != nil {
		h.records.wg.Wait() // batches in flight (they do not hold use)
	}
	return h.close()
}

// acquire returns the handle for the file now at the path, read-locked:
// the caller releases it with use.RUnlock. A removed file is a fault; a
// replaced one is reopened.
func (s *Store) acquire(ctx context.Context) (*sqliteHandle, error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		if s.cur.Load() == nil {
			return nil, errSQLiteClosed
		}
		return nil, fmt.Errorf("store: sqlite: database file unavailable: %w", err)
	}
	for range 3 {
		h := s.cur.Load()
		if h == nil {
			return nil, errSQLiteClosed
		}
		if !os.SameFile(fi, h.fi) {
			if err := s.reopen(ctx, fi); err != nil {
				return nil, err
			}
			continue
		}
		h.use.RLock()
		if h.gone {
			h.use.RUnlock()
			continue
		}
		return h, nil
	}
	return nil, errors.New("store: sqlite: database file keeps being replaced")
}

// reopen swaps in a pool on the file now at the path (fi) and retires the
// old one once its in-flight operations are done.
func (s *Store) reopen(ctx context.Context, fi os.FileInfo) error {
	s.reopenMu.Lock()
	defer s.reopenMu.Unlock()
	old := s.cur.Load()
	if old == nil {
		return errSQLiteClosed
	}
	if os.SameFile(fi, old.fi) {
		return nil // another caller got here first
	}
	h, err := s.openHandle(ctx)
	if err != nil {
		return err
	}
	if !s.cur.CompareAndSwap(old, h) { // closed meanwhile
		h.close()
		return errSQLiteClosed
	}
	old.retire()
	return nil
}

func (h *sqliteHandle) lookupStmt(ctx context.Context, f shapeFlags) (*sql.Stmt, error) {
	h.stmtMu.Lock()
	defer h.stmtMu.Unlock()
	if h.stmts == nil {
		return nil, errSQLiteClosed
	}
	if st := h.stmts[f]; st != nil {
		return st, nil
	}
	st, err := h.db.PrepareContext(ctx, lookupSQL(f))
	if err != nil {
		return nil, err
	}
	h.stmts[f] = st
	return st, nil
}
