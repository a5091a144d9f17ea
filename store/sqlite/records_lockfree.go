package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"time"
)

// Record reads of a rollback-journal file that take no lock at all.
//
// A batch of record lookups (records.go) is first read on a
// connection opened with SQLite's nolock=1 URI parameter, which never
// calls the VFS's lock methods: the writer cannot see it, so it cannot
// fail the writer's commit however long the read takes (a goroutine
// descheduled on a loaded machine). Such a read is not isolated from the
// writer, so it is trusted only when nothing wrote the file while it ran,
// as a seqlock's reader is. The evidence, taken before the read (in this
// order) and again after it (in the reverse order), is:
//
//   - no process holds a write lock on the file's SQLite lock bytes
//     (F_OFD_GETLK, which takes no lock; the edge itself never takes
//     a write lock): a writer holds
//     RESERVED from its first write, and EXCLUSIVE while it writes the
//     database file, in every journal mode including MEMORY and OFF;
//   - no journal with a live header beside the file (a writer
//     mid-transaction, or a crashed one's hot journal);
//   - the database header's bytes 24..43 (the file change counter, page
//     count, freelist fields and schema cookie): every commit rewrites
//     page 1 with the counter incremented, and page 1 is the first page
//     it writes;
//   - the file's size, modification and change times (fstat): any write
//     moves them, on kernels with fine-grained timestamps even within one
//     clock tick.
//
// A commit whose writing overlapped the read either still held its lock
// when the read ended (seen) or had finished, leaving a new counter
// (seen). What this cannot see is a transaction that began after the
// read began, wrote pages to the file before its commit (a cache spill,
// which needs a transaction larger than the writer's page cache), rolled
// back and restored those pages, all within one clock tick and while one
// record read ran, on a kernel without fine-grained timestamps. The
// record would then be one that was never committed, read in the
// microseconds it was on disk. A read that took longer than
// maxLockFreeWindow is not trusted, so such a transaction must also fit
// in that window; accepted as residual, and documented.
//
// A read that fails any check, or errors in any way (a torn page may
// make the record undecodable or SQLite report corruption), decides
// nothing: its batch is read again, and after lockFreeRecordAttempts
// with locks, as before. Its connection may have kept pages (or a
// schema) read while the file changed under them, tagged with a header
// that the next transaction would find unchanged, so it is not used
// again as it is: its page cache is dropped (PRAGMA shrink_memory), and
// when the schema may have been loaded during that read (no read on the
// connection verified yet, the schema cookie moved, or could not be read
// once the writer was done) the connection is
// set aside unused. It is never closed before the handle is: closing a
// descriptor drops every POSIX lock this process holds on the file,
// other connections' SHARED locks included. Past maxSetAside such
// connections lock-free record reads stop for the handle.

// lockFreeRecordAttempts is how many lock-free reads a batch tries,
// each after the writer's transaction in progress has ended, before it
// reads with a lock.
const lockFreeRecordAttempts = 4

// maxLockFreeWindow is the longest a lock-free record read may take,
// from its first check to its last, and be trusted: the transaction it
// cannot see (see the comment at the top of this file) must begin, dirty
// more pages than the writer's cache holds, spill, and roll back inside
// that window.
const maxLockFreeWindow = 20 * time.Millisecond

// maxSetAside bounds the connections set aside per handle.
const maxSetAside = 4

// lockFreeRecordsHook, when set (tests only), runs inside every
// lock-free record read, after its reads and before its transaction
// ends.
var lockFreeRecordsHook func()

// errRecordsNotLockFree: the lock-free read decided nothing; read with a
// lock.
var errRecordsNotLockFree = errors.New("store: sqlite: lock-free record read not used")

// fileMark is the evidence a lock-free read compares before and after.
type fileMark struct {
	hdr          [20]byte // database header bytes 24..43
	size         int64
	mtime, ctime int64 // nanoseconds
}

// cookie is the schema cookie (header bytes 40..43).
func (m fileMark) cookie() [4]byte { return [4]byte(m.hdr[16:20]) }

// markBefore takes the evidence before a read; ok is false when a writer
// is (or may be) active, or the file cannot be read as a rollback
// journal's.
func (r *recordReader) markBefore() (m fileMark, ok bool) {
	if m, ok = r.fileState(); !ok {
		return m, false
	}
	if r.journalLive() {
		return m, false
	}
	if held, known := writerLockHeld(r.hdr); held || !known {
		return m, false
	}
	return m, true
}

// markAfter takes the evidence after a read, in the reverse order.
func (r *recordReader) markAfter() (m fileMark, ok bool) {
	if held, known := writerLockHeld(r.hdr); held || !known {
		return m, false
	}
	if r.journalLive() {
		return m, false
	}
	return r.fileState()
}

// fileState reads the header bytes and the file's size and times.
func (r *recordReader) fileState() (m fileMark, ok bool) {
	b, ok := r.rawHeader()
	if !ok {
		return m, false
	}
	copy(m.hdr[:], b[24:44])
	fi, err := r.hdr.Stat()
	if err != nil || fi.Size() == 0 {
		return m, false
	}
	m.size = fi.Size()
	if m.mtime, m.ctime, ok = fileTimes(fi); !ok {
		return m, false
	}
	return m, true
}

// lockFreeRecords is a handle's nolock connection for record reads. It
// is used by one batch at a time (runBatches runs alone per handle).
type lockFreeRecords struct {
	dsn      string
	db       *sql.DB
	conn     *sql.Conn
	stmts    map[shapeFlags]*sql.Stmt
	verified bool    // a read on conn passed its checks
	cookie   [4]byte // the schema cookie of conn's last verified read
	aside    []*sql.Conn
	off      bool
}

func newLockFreeRecords(path string) *lockFreeRecords {
	// mode=ro: the connection can write nothing, in particular never
	// "roll back" a journal it takes for hot (with nolock every journal
	// looks unowned); such a read errors, and a locked read answers.
	return &lockFreeRecords{dsn: "file:" + escapeURIPath(filepath.ToSlash(path)) + "?mode=ro&nolock=1&_pragma=query_only(1)"}
}

// connection returns the connection, opening it when there is none.
func (l *lockFreeRecords) connection(ctx context.Context) (*sql.Conn, error) {
	if l.conn != nil {
		return l.conn, nil
	}
	if l.db == nil {
		db, err := sql.Open("sqlite", l.dsn)
		if err != nil {
			return nil, err
		}
		db.SetMaxIdleConns(1)
		db.SetMaxOpenConns(maxSetAside + 1)
		l.db = db
	}
	c, err := l.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	l.conn, l.stmts, l.verified = c, make(map[shapeFlags]*sql.Stmt), false
	return c, nil
}

// stmt is the record statement of shape f on the connection.
func (l *lockFreeRecords) stmt(ctx context.Context, f shapeFlags) (*sql.Stmt, error) {
	if st := l.stmts[f]; st != nil {
		return st, nil
	}
	st, err := l.conn.PrepareContext(ctx, lookupSQL(f))
	if err != nil {
		return nil, err
	}
	l.stmts[f] = st
	return st, nil
}

// distrust is what a read that decided nothing leaves behind: the
// connection's cache dropped, or the connection set aside (see the
// comment at the top of this file).
//
// slow: the checks saw no change, the read only took too long; the
// schema is then taken as unchanged too.
func (l *lockFreeRecords) distrust(ctx context.Context, before, after fileMark, afterOK, slow bool) {
	if l.conn == nil {
		return
	}
	schemaMoved := !slow && (!l.verified || before.cookie() != l.cookie || !afterOK || after.cookie() != before.cookie())
	if !schemaMoved {
		if _, err := l.conn.ExecContext(ctx, "PRAGMA shrink_memory"); err == nil {
			return
		}
	}
	for _, st := range l.stmts {
		st.Close()
	}
	l.aside = append(l.aside, l.conn)
	l.conn, l.stmts = nil, nil
	if len(l.aside) >= maxSetAside {
		l.off = true
	}
}

// close closes every connection, the ones set aside included. Call it
// only when no other connection of the process reads the file.
func (l *lockFreeRecords) close() {
	for _, st := range l.stmts {
		st.Close()
	}
	if l.conn != nil {
		l.conn.Close()
	}
	for _, c := range l.aside {
		c.Close()
	}
	if l.db != nil {
		l.db.Close()
	}
	l.conn, l.stmts, l.aside, l.db = nil, nil, nil, nil
}

// readBatchLockFree reads calls' records (and their group ids) on the
// nolock connection. nil: every call has its answer, read at vers, and
// grp its group records. errRecordsNotLockFree: nothing was decided
// (the calls' fields may have been written; readBatch writes them all
// again).
func (h *sqliteHandle) readBatchLockFree(ctx context.Context, f shapeFlags, calls []*recordCall) (vers [16]byte, grp map[string]groupRec, err error) {
	r := h.records
	l := r.lockFree
	if l == nil || l.off {
		return vers, nil, errRecordsNotLockFree
	}
	began := time.Now()
	before, ok := r.markBefore()
	if !ok {
		return vers, nil, errRecordsNotLockFree
	}
	conn, err := l.connection(ctx)
	if err != nil {
		l.off = true // cannot be opened here: locked reads only
		return vers, nil, errRecordsNotLockFree
	}
	read := func() error {
		st, err := l.stmt(ctx, f)
		if err != nil {
			return err
		}
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		tst := tx.StmtContext(ctx, st)
		for _, c := range calls {
			if c.rec, c.ver, c.err = scanLookup(ctx, tst, f, c.id); c.err != nil {
				return c.err // undecodable may be torn: a locked read decides
			}
		}
		grp = h.readGroup(ctx, tst, f, calls, false)
		if lockFreeRecordsHook != nil {
			lockFreeRecordsHook()
		}
		return tx.Commit()
	}
	rerr := read()
	after, afterOK := r.markAfter()
	if rerr != nil || !afterOK || after != before {
		r.stats.rrLockFreeMissed.Add(1)
		if !afterOK {
			// A writer was still at work: its schema cookie, which says
			// whether the schema may have loaded mid-change, is known
			// only once it is done.
			h.settle(ctx)
			after, afterOK = r.markAfter()
		}
		l.distrust(ctx, before, after, afterOK, false)
		return vers, nil, errRecordsNotLockFree
	}
	if time.Since(began) > maxLockFreeWindow {
		// Too long to rule out what the checks cannot see. Nothing was
		// seen to change, so only the pages it read are not kept.
		r.stats.rrLockFreeMissed.Add(1)
		l.distrust(ctx, before, after, afterOK, true)
		return vers, nil, errRecordsNotLockFree
	}
	l.verified, l.cookie = true, before.cookie()
	r.stats.rrLockFree.Add(1)
	copy(vers[:], before.hdr[:16])
	return vers, grp, nil
}

// readLockFree is runBatches' lock-free read of a batch, tried up to
// lockFreeRecordAttempts times, each after the writer's transaction in
// progress (if any) has ended. ok: every call has its answer.
func (h *sqliteHandle) readLockFree(ctx context.Context, f shapeFlags, calls []*recordCall) bool {
	r := h.records
	if r.lockFree == nil {
		return false
	}
	for attempt := range lockFreeRecordAttempts {
		if attempt > 0 || r.journalLive() {
			h.settle(ctx)
		}
		if ctx.Err() != nil || r.lockFree.off {
			return false
		}
		vers, grp, err := h.readBatchLockFree(ctx, f, calls)
		if err != nil {
			continue
		}
		r.stats.rrBatched.Add(int64(len(calls)))
		r.stats.rrGrouped.Add(int64(len(grp)))
		for _, c := range calls {
			if len(c.also) > 0 {
				c.group = grp // read-only from here on
			}
		}
		r.keep(vers, calls, f, grp)
		return true
	}
	return false
}

// settle waits for the writer's transaction in progress to end: its lock
// (awaitWriter) and then its journal, at most about 20 ms for the latter.
func (h *sqliteHandle) settle(ctx context.Context) {
	h.awaitWriter(ctx)
	for d := 50 * time.Microsecond; h.records.journalLive() && d < 20*time.Millisecond; d *= 2 {
		time.Sleep(d)
	}
}
