package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"zombiezen.com/go/sqlite"
	"zombiezen.com/go/sqlite/sqlitex"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// Reading beside a live writer without making its writes fail.
//
// In a rollback-journal file (any journal mode but WAL) a reader holds a
// SHARED lock for as long as its read transaction lasts, and a writer that
// commits meanwhile, with no busy handler (the reference sync server sets
// none), fails at once with SQLITE_BUSY ("database is locked"). So every
// read here holds its lock only as long as it reads: records are short
// statements, several to one read transaction and kept while the file is
// unchanged (records.go), a client's stream reads one chunk per transaction
// (stream.go), and a locked fill (disk or memory tier) copies
// [lockedChunk] bytes per transaction.
//
// A fill of a rollback-journal file first tries a lock-free read: a
// separate read-only connection opened with SQLite's nolock=1 URI
// parameter takes no file lock at all, so the writer never sees it. Such a
// read is not isolated from the writer's commits, and that is acceptable
// only because the bytes are content-addressed and checked whole: the
// fill's bytes are hashed as they are read and the last chunk is handed
// over only after the hash matched the segment id. A read that saw a page
// the writer was rewriting (a torn page, a row deleted and its pages
// reused) fails the hash or errors on the way; it then falls back to the
// locked, chunked read when nothing was handed over yet, and otherwise
// ends the fill with a transient fault (never a corruption verdict: a
// locked re-read decides that). The record (publications, expiry, fences)
// is never read lock-free: grants need a consistent snapshot (one read
// under a lock may be answered again while the file's header shows no
// commit since, records.go).
//
// A WAL file cannot be read with nolock (WAL needs the shared-memory
// index, which nolock turns off): there readers never block the writer,
// and a fill copies the blob in one read transaction (a chunked copy
// would walk the overflow chain again for every chunk).

// JournalWAL is what PRAGMA journal_mode answers for a WAL file.
const JournalWAL = "wal"

// lockedChunk is how many bytes a locked fill reads per read transaction.
// The lock is held for the chunk's copy and the walk down the blob's
// overflow chain to it (longer the further into the blob, as each
// transaction starts the walk again); 1 MiB keeps both in the low
// milliseconds for a 24 MiB blob while the walks stay few.
const lockedChunk = 1 << 20

// lockFreeAttempts is how many lock-free reads a fill tries at least,
// each in a gap between the writer's transactions, before it reads with
// locks; it goes on trying for up to the busy timeout.
const lockFreeAttempts = 4

// errLockFreeSkipped: the lock-free read handed nothing over and the
// locked read should answer (the file is WAL, the read errored or did not
// verify before its last chunk, the row is not a whole-body read).
var errLockFreeSkipped = errors.New("store: sqlite: lock-free read not used")

// errLockFreeTorn: the lock-free read handed bytes over and then did not
// verify, while a locked re-read of the same row did: the store is sound,
// the fill saw the writer mid-change. Transient: a retry reads again.
var errLockFreeTorn = errors.New("store: sqlite copy: the lock-free read saw the file change mid-read; retry")

// rollbackJournal reports whether a journal mode is a rollback journal
// (a reader's lock blocks the writer's commit).
func rollbackJournal(mode string) bool { return mode != JournalWAL }

// readJournalMode asks the file's journal mode on the pool. A read-only
// connection answers "wal" for a WAL file and "delete" otherwise (the
// other rollback modes are the writer's connection setting, not the
// file's).
func readJournalMode(ctx context.Context, h *sqliteHandle) (string, error) {
	var m string
	if err := h.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&m); err != nil {
		return "", err
	}
	return strings.ToLower(m), nil
}

// JournalMode is the journal mode of the file the store has open, as
// PRAGMA journal_mode answered when it opened it: "wal", or a rollback
// mode ("delete"), in which the edge's reads can make a writer without a
// busy handler fail. "" once closed.
func (s *Store) JournalMode() string {
	h := s.cur.Load()
	if h == nil {
		return ""
	}
	return h.journal
}

// LockFreeStats counts the fills read without a lock and why others were
// not, since the store opened.
type LockFreeStats struct {
	Reads     int64 // lock-free reads that verified and served a fill
	Fallbacks int64 // lock-free reads that gave way to a locked read
	Torn      int64 // lock-free reads that failed after handing bytes over
}

// LockFreeStats returns the counters.
func (s *Store) LockFreeStats() LockFreeStats {
	return LockFreeStats{Reads: s.lfReads.Load(), Fallbacks: s.lfFallbacks.Load(), Torn: s.lfTorn.Load()}
}

// lockFreeCounters are SQLite's counters of LockFreeStats.
type lockFreeCounters struct {
	lfReads, lfFallbacks, lfTorn atomic.Int64
}

// lockFreePool is the handle's nolock connections, opened on first use.
type lockFreePool struct {
	mu     sync.Mutex
	pool   *sqlitex.Pool
	closed bool
}

func (p *lockFreePool) get(path string, conns int) (*sqlitex.Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errSQLiteClosed
	}
	if p.pool == nil {
		// mode=ro: the connection can write nothing, in particular never
		// "roll back" a journal it takes for hot (with nolock every
		// journal looks unowned); such a read fails, and falls back.
		pool, err := sqlitex.NewPool("file:"+escapeURIPath(filepath.ToSlash(path))+"?mode=ro&nolock=1", sqlitex.PoolOptions{
			Flags:    sqlite.OpenReadOnly | sqlite.OpenURI,
			PoolSize: conns,
			PrepareConn: func(conn *sqlite.Conn) error {
				return sqlitex.ExecuteTransient(conn, "PRAGMA query_only = 1", nil)
			},
		})
		if err != nil {
			return nil, err
		}
		p.pool = pool
	}
	return p.pool, nil
}

func (p *lockFreePool) close() {
	p.mu.Lock()
	pool := p.pool
	p.pool, p.closed = nil, true
	p.mu.Unlock()
	if pool != nil {
		pool.Close()
	}
}

// copyLockFree is CopyBlob's lock-free read. errLockFreeSkipped, with
// nothing written to w, when the locked read should answer instead.
func (s *Store) copyLockFree(ctx context.Context, h *sqliteHandle, segmentID string, want segid.Digest, w io.Writer) (int64, error) {
	// With nolock a zero-page file with a journal beside it is taken
	// for a leftover and the journal deleted: read only the non-empty
	// file the handle opened.
	if fi, err := os.Stat(s.path); err != nil || fi.Size() == 0 || !os.SameFile(fi, h.fi) {
		s.lfFallbacks.Add(1)
		return 0, errLockFreeSkipped
	}
	pool, err := h.lockFree.get(s.path, s.maxConns)
	if err != nil {
		s.lfFallbacks.Add(1)
		return 0, errLockFreeSkipped
	}
	// A read transaction that starts while the writer's journal is on
	// disk takes it for a hot journal and fails (a read-only connection
	// never rolls one back): start in the gap between the writer's
	// transactions, and try again a few times before the locked read.
	var pw *pendingWriter
	deadline := time.Now().Add(h.busy)
	for attempt := 1; ; attempt++ {
		h.awaitWriter(ctx)
		pw = &pendingWriter{w: w, want: want}
		err = lockFreeRead(ctx, pool, segmentID, pw)
		if err == nil || pw.written > 0 || ctx.Err() != nil || errors.Is(err, store.ErrNotFound) {
			break
		}
		// Past the first few, only the journal's refusal is worth
		// waiting out (SQLITE_READONLY_ROLLBACK), for the busy timeout.
		hot := sqlite.ErrCode(err).ToPrimary() == sqlite.ResultReadOnly
		if attempt >= lockFreeAttempts && (!hot || time.Now().After(deadline)) {
			break
		}
		if !writerActive(h.probe) {
			time.Sleep(time.Millisecond) // the journal outlived the lock: do not spin
		}
	}
	n := pw.written
	switch {
	case err == nil:
		s.lfReads.Add(1)
		return n, nil
	case pw.werr != nil:
		return n, pw.werr // w's own error
	case ctx.Err() != nil:
		return n, fmt.Errorf("store: sqlite copy: %w", ctx.Err())
	case pw.written == 0:
		s.lfFallbacks.Add(1)
		return 0, errLockFreeSkipped
	}
	// Bytes were handed over and the rest did not verify: decide, with
	// a locked read of the same row, whether the store is corrupt.
	s.lfTorn.Add(1)
	if _, verr := s.copyChecked(ctx, h, segmentID, want, io.Discard); verr != nil {
		return n, verr // ErrCorruptSegment when the locked read does not verify either
	}
	return n, errLockFreeTorn
}

// lockFreeRead copies the blob of segmentID to pw on a nolock
// connection. Any error is the caller's to classify.
func lockFreeRead(ctx context.Context, pool *sqlitex.Pool, segmentID string, pw *pendingWriter) error {
	// One transaction: the connection's page cache is checked against
	// the file's change counter once, at its start.
	return inReadTx(ctx, pool, func(conn *sqlite.Conn) error { return lockFreeCopy(conn, segmentID, pw) })
}

// lockFreeCopy is lockFreeRead's copy, inside its transaction.
func lockFreeCopy(conn *sqlite.Conn, segmentID string, pw *pendingWriter) (err error) {
	rowid, length, found, err := segmentRow(conn, segmentID)
	if err != nil {
		return err
	}
	if !found {
		return store.ErrNotFound // the locked read says so authoritatively
	}
	blob, err := conn.OpenBlob("", "sync_segments", "bytes", rowid, false)
	if err != nil {
		return err
	}
	defer blob.Close()
	if blob.Size() != length {
		return errors.New("blob length differs from byte_length")
	}
	pw.size = length
	buf := make([]byte, min(blobCopyBuf, max(length, 1)))
	var n int64
	for n < length {
		m, rerr := blob.Read(buf[:min(int64(len(buf)), length-n)])
		if m > 0 {
			if werr := pw.write(buf[:m]); werr != nil {
				return werr
			}
			n += int64(m)
		}
		if rerr == io.EOF && n < length {
			return io.ErrUnexpectedEOF
		}
		if rerr != nil && rerr != io.EOF {
			return rerr
		}
	}
	return pw.finish()
}

// pendingWriter hashes what it is given and passes it to w one chunk
// late: the last chunk reaches w only once the whole hashed to want, so a
// read that does not verify never hands over a complete body, and one
// that fails in its first chunk hands over nothing.
type pendingWriter struct {
	w       io.Writer
	h       segid.Hasher
	want    segid.Digest
	size    int64
	pend    []byte
	seen    int64
	written int64
	werr    error
}

var errLockFreeMismatch = errors.New("lock-free read did not hash to the segment id")

func (p *pendingWriter) write(b []byte) error {
	if len(p.pend) > 0 {
		if err := p.flush(); err != nil {
			return err
		}
	}
	p.h.Write(b)
	p.seen += int64(len(b))
	p.pend = append(p.pend[:0], b...)
	return nil
}

func (p *pendingWriter) flush() error {
	m, err := p.w.Write(p.pend)
	p.written += int64(m)
	p.pend = p.pend[:0]
	if err != nil {
		p.werr = err
	}
	return err
}

// finish verifies the whole and hands the held chunk over.
func (p *pendingWriter) finish() error {
	if p.seen != p.size || !p.h.Matches(p.want) {
		return errLockFreeMismatch
	}
	if len(p.pend) == 0 {
		return nil
	}
	return p.flush()
}
