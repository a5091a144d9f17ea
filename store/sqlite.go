package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// SQLiteOptions configures OpenSQLite. The zero value is ready to use.
type SQLiteOptions struct {
	// BusyTimeout is how long one read waits for a lock the writer holds
	// (rollback-journal files, WAL recovery) before it fails with a fault.
	// Zero means 5s. Rounded up to whole milliseconds.
	BusyTimeout time.Duration

	// MaxOpenConns caps the pool of read-only connections. Zero means 4.
	MaxOpenConns int
}

const (
	defaultBusyTimeout  = 5 * time.Second
	defaultSQLiteConns  = 4
	maxSchemaRedetects  = 4
	sqliteMaxBlobLength = 1 << 31 // above SQLITE_MAX_LENGTH: clamps Open's range
)

// SQLite reads the segment store a Syncular sync server keeps in one SQLite
// file (PROTOCOL.md §5.1), read-only, while the server writes it. All three
// schema generations are read, and a file migrated by the writer while it
// is open is read in its new shape without a restart. If the file at the
// path is replaced (a restore moved over it), the next call reopens it; if
// it is removed, calls fail with a fault. Safe for concurrent use.
type SQLite struct {
	path     string // absolute
	dsn      string
	maxConns int
	blobOpts SQLiteOptions // for the blob pools (sqlite_stream.go)

	cur      atomic.Pointer[sqliteHandle] // nil once closed
	reopenMu sync.Mutex
}

// sqliteHandle is one pool opened on one file (inode).
type sqliteHandle struct {
	db   *sql.DB
	fi   os.FileInfo // the file as it was stat'ed before the pool opened it
	use  sync.RWMutex
	gone bool // set under use.Lock when retired; then db is closed

	detectStmt *sql.Stmt
	openStmt   *sql.Stmt
	sizeStmt   *sql.Stmt
	blobPool   blobPool // incremental blob I/O (sqlite_stream.go)
	shape      atomic.Pointer[sqliteShape]

	stmtMu sync.Mutex
	stmts  map[shapeFlags]*sql.Stmt // lookup statements per schema shape
}

// shapeFlags is what the lookup query depends on.
type shapeFlags struct {
	logEpoch bool // sync_segments.log_epoch (gen 2+)
	scopes   bool // sync_segment_scopes (gen 3)
	pubs     bool // sync_segment_publications (gen 3)
	registry bool // sync_partition_registry (epoch fencing)
	ckpts    bool // sync_backfill_checkpoints (overtaken publications)
}

// sqliteShape is the schema as detected at one schema_version.
type sqliteShape struct {
	version int64
	flags   shapeFlags
}

var errSQLiteClosed = errors.New("store: sqlite store is closed")

// OpenSQLite opens the segment store at path read-only. It checks at once
// that the file exists, is a SQLite database and holds a sync_segments
// table, so a wrong path fails here rather than on the first request.
func OpenSQLite(path string, opts SQLiteOptions) (*SQLite, error) {
	if path == "" {
		return nil, errors.New("store: sqlite: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite: %w", err)
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = defaultBusyTimeout
	}
	conns := opts.MaxOpenConns
	if conns <= 0 {
		conns = defaultSQLiteConns
	}
	s := &SQLite{path: abs, dsn: sqliteDSN(abs, busy), maxConns: conns,
		blobOpts: SQLiteOptions{BusyTimeout: busy, MaxOpenConns: conns}}
	h, err := s.openHandle(context.Background())
	if err != nil {
		return nil, err
	}
	s.cur.Store(h)
	return s, nil
}

// sqliteDSN is the read-only URI for path. The file: prefix is what makes
// modernc hand mode=ro to SQLite; the path is escaped so '?', '#' and '%'
// in a file name stay part of the name.
func sqliteDSN(abs string, busy time.Duration) string {
	ms := (busy + time.Millisecond - 1) / time.Millisecond
	return "file:" + escapeURIPath(filepath.ToSlash(abs)) +
		fmt.Sprintf("?mode=ro&_pragma=busy_timeout(%d)&_pragma=query_only(1)", ms)
}

// escapeURIPath percent-encodes what SQLite's URI parser (and the driver,
// which splits the DSN at the first '?') would otherwise take as syntax.
func escapeURIPath(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '%', '?', '#':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	if vol := filepath.VolumeName(p); vol != "" { // Windows: file:/C:/dir/x.db
		return "/" + b.String()
	}
	return b.String()
}

func (s *SQLite) openHandle(ctx context.Context) (*sqliteHandle, error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("store: sqlite: %s is not a regular file", s.path)
	}
	db, err := sql.Open("sqlite", s.dsn)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite: open %s: %w", s.path, err)
	}
	db.SetMaxOpenConns(s.maxConns)
	db.SetMaxIdleConns(s.maxConns)
	h := &sqliteHandle{db: db, fi: fi, stmts: make(map[shapeFlags]*sql.Stmt)}
	fail := func(err error) (*sqliteHandle, error) {
		h.close()
		return nil, fmt.Errorf("store: sqlite: open %s: %w", s.path, err)
	}
	if h.detectStmt, err = db.PrepareContext(ctx, detectSQL); err != nil {
		return fail(err)
	}
	if _, err := h.detect(ctx); err != nil {
		return fail(err)
	}
	if h.openStmt, err = db.PrepareContext(ctx, openSQL); err != nil {
		return fail(err)
	}
	if h.sizeStmt, err = db.PrepareContext(ctx, sizeSQL); err != nil {
		return fail(err)
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
	return h.db.Close()
}

// retire waits for the operations using h, then closes it.
func (h *sqliteHandle) retire() error {
	h.use.Lock()
	defer h.use.Unlock()
	if h.gone {
		return nil
	}
	h.gone = true
	return h.close()
}

// acquire returns the handle for the file now at the path, read-locked:
// the caller releases it with use.RUnlock. A removed file is a fault; a
// replaced one is reopened.
func (s *SQLite) acquire(ctx context.Context) (*sqliteHandle, error) {
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
func (s *SQLite) reopen(ctx context.Context, fi os.FileInfo) error {
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

// Close releases the pool. Operations in flight finish first.
func (s *SQLite) Close() error {
	h := s.cur.Swap(nil)
	if h == nil {
		return nil
	}
	return h.retire()
}

// The schema facts the lookup query depends on, read in one statement so
// they belong to one schema_version. Identifiers are case-insensitive in
// SQLite, so the names are compared that way.
const detectSQL = `SELECT
 (SELECT schema_version FROM pragma_schema_version),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_segments' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM pragma_table_info('sync_segments') WHERE name = 'log_epoch' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_segment_scopes' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_segment_publications' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_partition_registry' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_backfill_checkpoints' COLLATE NOCASE)`

// detect reads the schema shape and caches it.
func (h *sqliteHandle) detect(ctx context.Context) (*sqliteShape, error) {
	var sh sqliteShape
	var segments bool
	err := h.detectStmt.QueryRowContext(ctx).Scan(&sh.version, &segments,
		&sh.flags.logEpoch, &sh.flags.scopes, &sh.flags.pubs, &sh.flags.registry, &sh.flags.ckpts)
	if err != nil {
		return nil, err
	}
	if !segments {
		return nil, errors.New("no sync_segments table: not a Syncular segment store")
	}
	h.shape.Store(&sh)
	return &sh, nil
}

// lookupSQL builds the one statement that reads a segment's record. One
// statement is one read transaction, so the row, its publications, its
// scope digests, the registry epochs, the partitions' highest backfill
// checkpoint schema_version and the schema_version it ran under are one
// consistent snapshot even while the writer commits. Result rows: kind 0
// the sync_segments row, 1 a publication row, 2 a scope digest (in the
// key column).
func lookupSQL(f shapeFlags) string {
	var b strings.Builder
	epoch, reg, join := "''", "NULL", ""
	if f.logEpoch {
		epoch = "s.log_epoch"
	}
	if f.registry {
		reg, join = "r.log_epoch", " LEFT JOIN sync_partition_registry r ON r.partition = s.partition"
	}
	// The checkpoint table's primary key starts with partition, so this
	// is an index range scan per row.
	ckpt := func(alias string) string {
		if !f.ckpts {
			return "NULL"
		}
		return "(SELECT max(k.schema_version) FROM sync_backfill_checkpoints k WHERE k.partition = " + alias + ".partition)"
	}
	fmt.Fprintf(&b, "SELECT 0, NULL, s.partition, %s, s.tbl, s.schema_version, s.media_type,"+
		" s.scope_digest, s.as_of_commit_seq, s.row_count, s.row_cursor, s.next_row_cursor,"+
		" s.byte_length, s.created_at_ms, s.expires_at_ms, %s,"+
		" (SELECT schema_version FROM pragma_schema_version), %s"+
		" FROM sync_segments s%s WHERE s.segment_id = ?1", epoch, reg, ckpt("s"), join)
	if f.pubs {
		reg, join = "NULL", ""
		if f.registry {
			reg, join = "r.log_epoch", " LEFT JOIN sync_partition_registry r ON r.partition = p.partition"
		}
		fmt.Fprintf(&b, " UNION ALL SELECT 1, p.pub_key, p.partition, p.log_epoch, p.tbl,"+
			" p.schema_version, p.media_type, p.scope_digest, p.as_of_commit_seq, p.row_count,"+
			" p.row_cursor, p.next_row_cursor, p.byte_length, p.created_at_ms, p.expires_at_ms, %s, NULL, %s"+
			" FROM sync_segment_publications p%s WHERE p.segment_id = ?1", reg, ckpt("p"), join)
	}
	if f.scopes {
		// Scope rows only matter when there are no publication rows.
		b.WriteString(" UNION ALL SELECT 2, c.scope_digest" + strings.Repeat(", NULL", 16) +
			" FROM sync_segment_scopes c WHERE c.segment_id = ?1")
		if f.pubs {
			b.WriteString(" AND NOT EXISTS (SELECT 1 FROM sync_segment_publications x WHERE x.segment_id = ?1)")
		}
	}
	// No ORDER BY: nothing depends on the order of the arms, and each
	// arm walks its primary-key index, so publications come in pub_key
	// order and scope digests sorted.
	return b.String()
}

// openSQL reads a byte range. CAST keeps substr counting bytes even if a
// writer stored the bytes as TEXT. substr of an empty blob is NULL.
const openSQL = `SELECT substr(CAST(bytes AS BLOB), ?2, ?3) FROM sync_segments WHERE segment_id = ?1`

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

// Lookup returns the record of segmentID with its publications (§4, §5.1),
// ErrNotFound, or a fault.
func (s *SQLite) Lookup(ctx context.Context, segmentID string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: sqlite lookup: %w", err)
	}
	h, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer h.use.RUnlock()

	sh := h.shape.Load()
	for attempt := 0; ; attempt++ {
		rec, ver, err := h.lookup(ctx, sh.flags, segmentID)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("store: sqlite lookup: %w", ctx.Err())
			}
			// A table the statement names may have gone, or the file
			// changed under us: re-detect, and retry if the shape moved.
			nsh, derr := h.detect(ctx)
			if derr != nil {
				return nil, fmt.Errorf("store: sqlite lookup: %w", derr)
			}
			if nsh.flags == sh.flags || attempt >= maxSchemaRedetects {
				return nil, fmt.Errorf("store: sqlite lookup: %w", err)
			}
			sh = nsh
			continue
		}
		if rec == nil {
			// No row, whatever the shape: sync_segments is in every one.
			return nil, ErrNotFound
		}
		if ver == sh.version {
			return rec, nil
		}
		// The schema changed since the shape was detected (the writer
		// migrated the file). The result holds if the shape is the same
		// at the version the statement ran under; otherwise run again.
		nsh, derr := h.detect(ctx)
		if derr != nil {
			return nil, fmt.Errorf("store: sqlite lookup: %w", derr)
		}
		if nsh.version == ver && nsh.flags == sh.flags {
			return rec, nil
		}
		if attempt >= maxSchemaRedetects {
			return nil, errors.New("store: sqlite lookup: the schema kept changing during the lookup")
		}
		sh = nsh
	}
}

// lookupRow is one result row of lookupSQL.
type lookupRow struct {
	kind                             int64
	key, partition, epoch, table     sql.NullString
	schemaVersion                    sql.NullInt64
	media, digest                    sql.NullString
	asOf, rowCount                   sql.NullInt64
	rowCursor, nextRowCursor         sql.NullString
	byteLength, createdAt, expiresAt sql.NullInt64
	registryEpoch                    sql.NullString
	schemaVer                        sql.NullInt64
	checkpoint                       sql.NullInt64 // max schema_version of the partition's checkpoints
}

// lookup runs the record statement. rec is nil when there is no
// sync_segments row; ver is the schema_version the statement ran under.
func (h *sqliteHandle) lookup(ctx context.Context, f shapeFlags, id string) (rec *Record, ver int64, err error) {
	st, err := h.lookupStmt(ctx, f)
	if err != nil {
		return nil, 0, err
	}
	rows, err := st.QueryContext(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()

	var (
		top     *Publication
		topReg  sql.NullString
		topCkpt sql.NullInt64
		pubs    []Publication
		regs    []sql.NullString
		ckpts   []sql.NullInt64
		digests []string
		r       lookupRow
	)
	for rows.Next() {
		if err := rows.Scan(&r.kind, &r.key, &r.partition, &r.epoch, &r.table, &r.schemaVersion,
			&r.media, &r.digest, &r.asOf, &r.rowCount, &r.rowCursor, &r.nextRowCursor,
			&r.byteLength, &r.createdAt, &r.expiresAt, &r.registryEpoch, &r.schemaVer, &r.checkpoint); err != nil {
			// database/sql's scan errors quote the stored value, which
			// may be a partition id: never pass them on.
			return nil, 0, errors.New("a stored value has an unexpected type")
		}
		switch r.kind {
		case 0:
			p, err := r.publication("sync_segments")
			if err != nil {
				return nil, 0, err
			}
			top, topReg, topCkpt, ver = &p, r.registryEpoch, r.checkpoint, r.schemaVer.Int64
		case 1:
			p, err := r.publication("sync_segment_publications")
			if err != nil {
				return nil, 0, err
			}
			pubs = append(pubs, p)
			regs = append(regs, r.registryEpoch)
			ckpts = append(ckpts, r.checkpoint)
		case 2:
			if !r.key.Valid {
				return nil, 0, errors.New("NULL scope_digest in sync_segment_scopes")
			}
			digests = append(digests, r.key.String)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	if top == nil {
		return nil, 0, nil
	}

	rec = &Record{
		SegmentID:  id,
		ByteLength: top.ByteLength,
		MediaType:  top.MediaType,
	}
	if len(pubs) == 0 {
		// Derived (§4): the row's own fields once per digest in the union
		// of its scope_digest and its sync_segment_scopes rows.
		pubs = make([]Publication, 0, 1+len(digests))
		pubs = append(pubs, *top)
		regs = append(regs, topReg)
		ckpts = append(ckpts, topCkpt)
		for _, d := range digests {
			if d == top.ScopeDigest {
				continue
			}
			p := *top
			p.ScopeDigest = d
			pubs = append(pubs, p)
			regs = append(regs, topReg)
			ckpts = append(ckpts, topCkpt)
		}
	}
	rec.Publications = pubs
	if f.registry {
		rec.Fenced = true
		rec.Epochs = make(map[string]string, len(pubs))
		for i, reg := range regs {
			if reg.Valid {
				rec.Epochs[pubs[i].Partition] = reg.String
			}
		}
	}
	if f.ckpts {
		rec.Checkpoints = make(map[string]int64)
		for i, c := range ckpts {
			if c.Valid {
				rec.Checkpoints[pubs[i].Partition] = c.Int64
			}
		}
	}
	return rec, ver, nil
}

// publication converts a kind 0 or 1 row. A NULL where the DDL says NOT
// NULL is a fault: when in doubt, refuse.
func (r *lookupRow) publication(table string) (Publication, error) {
	if !r.partition.Valid || !r.epoch.Valid || !r.table.Valid || !r.schemaVersion.Valid ||
		!r.media.Valid || !r.digest.Valid || !r.asOf.Valid || !r.rowCount.Valid ||
		!r.byteLength.Valid || !r.createdAt.Valid || !r.expiresAt.Valid {
		return Publication{}, fmt.Errorf("NULL in a NOT NULL column of %s", table)
	}
	p := Publication{
		Partition:     r.partition.String,
		LogEpoch:      r.epoch.String,
		Table:         r.table.String,
		SchemaVersion: r.schemaVersion.Int64,
		MediaType:     mediaType(r.media.String),
		ScopeDigest:   r.digest.String,
		AsOfCommitSeq: r.asOf.Int64,
		RowCount:      r.rowCount.Int64,
		ByteLength:    r.byteLength.Int64,
		CreatedAtMs:   r.createdAt.Int64,
		ExpiresAtMs:   r.expiresAt.Int64,
	}
	if r.rowCursor.Valid {
		c := r.rowCursor.String
		p.RowCursor = &c
	}
	if r.nextRowCursor.Valid {
		c := r.nextRowCursor.String
		p.NextRowCursor = &c
	}
	return p, nil
}

// mediaType maps the stored text the way the reference get() does.
func mediaType(s string) string {
	if s == MediaSQLite {
		return MediaSQLite
	}
	return MediaRows
}

// Open returns the segment's bytes from offset off, n bytes (n < 0: to the
// end). A range past the end is empty. ErrNotFound when the row is gone.
func (s *SQLite) Open(ctx context.Context, segmentID string, off, n int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, fmt.Errorf("store: sqlite open: negative offset %d", off)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: sqlite open: %w", err)
	}
	h, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer h.use.RUnlock()
	if n < 0 || n > sqliteMaxBlobLength {
		n = sqliteMaxBlobLength
	}
	if off > sqliteMaxBlobLength {
		off = sqliteMaxBlobLength
	}
	// A large blob streams in chunks (bounded memory); the rest is one
	// substr query.
	rc, err := s.openStream(ctx, h, segmentID, off, n)
	if rc != nil {
		return rc, nil
	}
	var b []byte
	if err == nil {
		err = h.openStmt.QueryRowContext(ctx, segmentID, off+1, n).Scan(&b)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, ErrNotFound
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("store: sqlite open: %w", ctx.Err())
	case err != nil:
		if _, derr := h.detect(ctx); derr != nil {
			err = derr
		}
		return nil, fmt.Errorf("store: sqlite open: %w", err)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// Interface guards
var _ Store = (*SQLite)(nil)
