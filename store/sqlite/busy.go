package sqlite

import (
	"context"
	"errors"
	"time"

	"zombiezen.com/go/sqlite"
)

// awaitWriter holds a locked read of a rollback-journal file back while
// another process is in a write transaction (between its first write and
// the end of its commit): a SHARED lock taken then is what fails that
// commit when the writer has no busy handler. It polls (fcntl, no lock)
// for the gap between two transactions, at most for the busy timeout,
// then lets the read go on (SQLite's locks decide). WAL files, where
// readers never block the writer, do not wait.
func (h *sqliteHandle) awaitWriter(ctx context.Context) {
	if h.probe == 0 || !rollbackJournal(h.journal) || !writerActive(h.probe) {
		return
	}
	deadline := time.Now().Add(h.busy)
	for d := 50 * time.Microsecond; writerActive(h.probe); d = min(2*d, time.Millisecond) {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(d)
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY ("database is
// locked"), from either driver.
func isBusy(err error) bool {
	if err == nil {
		return false
	}
	var coded interface{ Code() int }
	if errors.As(err, &coded) && coded.Code()&0xff == 5 {
		return true
	}
	return sqlite.ErrCode(err).ToPrimary() == sqlite.ResultBusy
}

// retryBusy runs f, one locked read, until it does not fail with
// SQLITE_BUSY or the busy timeout has passed. The connections have no
// busy handler of their own: SQLite's retries take the SHARED lock the
// moment the writer's lock lapses, often mid-way through the writer's next
// transaction (which then fails its commit); these wait for the writer's
// transaction to end first (awaitWriter).
func (h *sqliteHandle) retryBusy(ctx context.Context, f func() error) error {
	var deadline time.Time
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		h.awaitWriter(ctx)
		err := f()
		if !isBusy(err) || ctx.Err() != nil {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(h.busy)
		}
		if time.Now().After(deadline) {
			return err
		}
		if h.probe == 0 || !writerActive(h.probe) {
			time.Sleep(pause) // no probe (or the lock lapsed): back off blind
		}
	}
}

// detectWait is detect under retryBusy.
func (h *sqliteHandle) detectWait(ctx context.Context) (sh *sqliteShape, err error) {
	err = h.retryBusy(ctx, func() error { sh, err = h.detect(ctx); return err })
	return sh, err
}
