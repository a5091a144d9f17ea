// Package sqlite reads the segment store a Syncular sync server keeps in
// one SQLite file (protocol §5.1): records, publications and segment
// bytes, read-only, beside a live writer. Open returns a *Store, which
// implements store.Store; its faults wrap the core's errors (package
// store), so the cache above it never names this package.
package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// Options configures Open. The zero value is ready to use.
type Options struct {
	// BusyTimeout is how long one read waits for a lock the writer holds
	// (rollback-journal files, WAL recovery) before it fails with a fault.
	// Zero means DefaultTimeout (5s): a read waiting longer than a store
	// call may take is a fault anyway. Rounded up to whole milliseconds.
	BusyTimeout time.Duration

	// MaxOpenConns caps the pool of read-only connections. Zero means 4.
	MaxOpenConns int

	// JournalMode, when set, is told the file's journal mode (PRAGMA
	// journal_mode: "wal", or a rollback mode such as "delete") each time
	// the store opens the file: at Open and when it reopens a file
	// replaced at its path. It runs before Open returns or the
	// reopened file serves a call, and must not call the store.
	JournalMode func(path, mode string)

	noBusyHandler bool // Blobs: no busy timeout (the caller retries)
}

// withDefaults is o with every zero field at its documented default.
func (o Options) withDefaults() Options {
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = store.DefaultTimeout
	}
	if o.MaxOpenConns <= 0 {
		o.MaxOpenConns = defaultSQLiteConns
	}
	return o
}

const (
	defaultSQLiteConns  = 4
	maxSchemaRedetects  = 4
	sqliteMaxBlobLength = 1 << 31 // above SQLITE_MAX_LENGTH: clamps Open's range
)

// Store reads the segment store a Syncular sync server keeps in one SQLite
// file (protocol §5.1), read-only, while the server writes it. All three
// schema generations are read, and a file migrated by the writer while it
// is open is read in its new shape without a restart. If the file at the
// path is replaced (a restore moved over it), the next call reopens it; if
// it is removed, calls fail with a fault. Safe for concurrent use.
type Store struct {
	path     string // absolute
	dsn      string // with the busy timeout (Describe)
	readDSN  string // without a busy handler: the pool's (retryBusy waits instead)
	busy     time.Duration
	maxConns int
	blobOpts Options // for the blob pools (stream.go)

	onJournal func(path, mode string) // Options.JournalMode

	cur      atomic.Pointer[sqliteHandle] // nil once closed
	reopenMu sync.Mutex

	lockFreeCounters   // lockfree.go
	recordReadCounters // records.go
}

var errSQLiteClosed = errors.New("store: sqlite store is closed")

// Open opens the segment store at path read-only. It checks at once
// that the file exists, is a SQLite database and holds a sync_segments
// table, so a wrong path fails here rather than on the first request.
func Open(path string, opts Options) (*Store, error) {
	if path == "" {
		return nil, errors.New("store: sqlite: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite: %w", err)
	}
	opts = opts.withDefaults()
	busy, conns := opts.BusyTimeout, opts.MaxOpenConns
	blobOpts := opts
	blobOpts.noBusyHandler = true // the handle's reads retry themselves (retryBusy)
	s := &Store{path: abs, dsn: sqliteDSN(abs, busy), readDSN: sqliteDSN(abs, 0), busy: busy,
		maxConns: conns, blobOpts: blobOpts, onJournal: opts.JournalMode}
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

// Close releases the pool. Operations in flight finish first.
func (s *Store) Close() error {
	h := s.cur.Swap(nil)
	if h == nil {
		return nil
	}
	return h.retire()
}

// Lookup returns the record of id with its publications (§4, §5.1),
// ErrNotFound, or a fault.
func (s *Store) Lookup(ctx context.Context, id segid.ID) (*store.Record, error) {
	rec, _, err := s.LookupGroup(ctx, id, nil)
	return rec, err
}

// GroupSize is how many other records LookupGroup reads with the one
// asked for: maxGroupRead in a rollback journal (records.go), 0 in
// WAL, whose readers never fail a commit.
func (s *Store) GroupSize() int {
	if h := s.cur.Load(); h != nil && h.records != nil {
		return maxGroupRead
	}
	return 0
}

// LookupGroup is Lookup, reading in a rollback journal the records of
// also in the same read transaction (RecordGroupReader): those read at
// the schema version the answer holds at, found and decoded, are in
// group. In WAL, and for the records of a file reopened in WAL, also is
// ignored.
func (s *Store) LookupGroup(ctx context.Context, id segid.ID, also []string) (*store.Record, map[string]*store.Record, error) {
	if id.IsZero() {
		return nil, nil, fmt.Errorf("store: sqlite lookup: %w", store.ErrNotFound)
	}
	segmentID := id.String() // the rows' segment_id
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("store: sqlite lookup: %w", err)
	}
	h, err := s.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer h.use.RUnlock()

	sh := h.shape.Load()
	for attempt := 0; ; attempt++ {
		var rec *store.Record
		var ver int64
		var grp map[string]groupRec
		var err error
		if h.records != nil {
			rec, ver, grp, err = h.lookupRecord(ctx, sh, segmentID, also)
		} else {
			err = h.retryBusy(ctx, func() (err error) { rec, ver, err = h.lookup(ctx, sh.flags, segmentID); return err })
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, fmt.Errorf("store: sqlite lookup: %w", ctx.Err())
			}
			// A table the statement names may have gone, or the file
			// changed under us: re-detect, and retry if the shape moved.
			nsh, derr := h.detectWait(ctx)
			if derr != nil {
				return nil, nil, fmt.Errorf("store: sqlite lookup: %w", derr)
			}
			if nsh.flags == sh.flags || attempt >= maxSchemaRedetects {
				return nil, nil, fmt.Errorf("store: sqlite lookup: %w", err)
			}
			sh = nsh
			continue
		}
		if rec == nil {
			// No row, whatever the shape: sync_segments is in every one.
			return nil, groupAt(grp, sh.version), store.ErrNotFound
		}
		if ver == sh.version {
			return rec, groupAt(grp, ver), nil
		}
		// The schema changed since the shape was detected (the writer
		// migrated the file). The result holds if the shape is the same
		// at the version the statement ran under; otherwise run again.
		nsh, derr := h.detectWait(ctx)
		if derr != nil {
			return nil, nil, fmt.Errorf("store: sqlite lookup: %w", derr)
		}
		if nsh.version == ver && nsh.flags == sh.flags {
			return rec, groupAt(grp, ver), nil
		}
		if attempt >= maxSchemaRedetects {
			return nil, nil, errors.New("store: sqlite lookup: the schema kept changing during the lookup")
		}
		sh = nsh
	}
}

// Open returns the segment's bytes from offset off, n bytes (n < 0: to the
// end). A range past the end is empty. ErrNotFound when the row is gone.
func (s *Store) Open(ctx context.Context, id segid.ID, off, n int64) (io.ReadCloser, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("store: sqlite open: %w", store.ErrNotFound)
	}
	segmentID := id.String() // the row's segment_id
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
		err = h.retryBusy(ctx, func() error { return h.openStmt.QueryRowContext(ctx, segmentID, off+1, n).Scan(&b) })
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, store.ErrNotFound
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("store: sqlite open: %w", ctx.Err())
	case err != nil:
		if _, derr := h.detectWait(ctx); derr != nil {
			err = derr
		}
		return nil, fmt.Errorf("store: sqlite open: %w", err)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// groupAt is the records of grp read at schema version ver (nil: none).
func groupAt(grp map[string]groupRec, ver int64) map[string]*store.Record {
	var out map[string]*store.Record
	for id, g := range grp {
		if g.ver == ver && g.rec != nil {
			if out == nil {
				out = make(map[string]*store.Record, len(grp))
			}
			out[id] = g.rec
		}
	}
	return out
}

// Stats is how a SQLite store answered: its record reads
// (RecordReadStats) and its fills (LockFreeStats). Report hands it to
// the cache's FlowStats.Backend.
type Stats struct {
	Records RecordReadStats
	Fills   LockFreeStats
}

// Report returns the store's Stats (store.Reporter).
func (s *Store) Report() any {
	return Stats{Records: s.RecordReadStats(), Fills: s.LockFreeStats()}
}

// Interface guards
var (
	_ store.Store             = (*Store)(nil)
	_ store.RecordGroupReader = (*Store)(nil)
	_ store.Reporter          = (*Store)(nil)
)
