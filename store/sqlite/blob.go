package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/syncular/caddy-syncular/store"
	"zombiezen.com/go/sqlite"
	"zombiezen.com/go/sqlite/sqlitex"
)

// blobCopyBuf is the chunk CopyBlob hands its writer: large enough that a
// file write per chunk is cheap, small enough that a copy of any size
// holds only this much in memory.
const blobCopyBuf = 128 << 10

// Blobs copies segment bytes out of a SQLite segment store with
// SQLite's incremental blob I/O, in chunks, so a segment of any size costs
// one fixed buffer rather than a copy of the whole blob (which is what
// SQLite.Open's substr read allocates). It opens the file read-only with
// its own pool of zombiezen.com/go/sqlite connections; SQLite keeps one
// per handle for its chunked reads (readChunk, blobSize).
//
// Each CopyBlob is one read transaction: it pins the WAL snapshot (and so
// holds back the writer's checkpoints) for as long as the copy takes, and
// in a rollback-journal file its SHARED lock fails a writer without a busy
// handler for as long: the edge's fills use SQLite.CopyBlob instead
// (lockfree.go). Unlike Store it does not reopen a file replaced
// at its path. Safe for concurrent use.
type Blobs struct {
	path string
	pool *sqlitex.Pool
}

// OpenBlobs opens the store at path read-only. opts is read as by
// Open: BusyTimeout per read, MaxOpenConns connections. It checks at
// once that the file holds a sync_segments table.
func OpenBlobs(path string, opts Options) (*Blobs, error) {
	if path == "" {
		return nil, errors.New("store: sqlite blobs: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite blobs: %w", err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite blobs: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("store: sqlite blobs: %s is not a regular file", abs)
	}
	opts = opts.withDefaults()
	busy, conns := opts.BusyTimeout, opts.MaxOpenConns
	// The file: URI with mode=ro is what makes SQLite itself refuse
	// writes; query_only is a second lock on the same door.
	pool, err := sqlitex.NewPool("file:"+escapeURIPath(filepath.ToSlash(abs))+"?mode=ro", sqlitex.PoolOptions{
		Flags:    sqlite.OpenReadOnly | sqlite.OpenURI,
		PoolSize: conns,
		PrepareConn: func(conn *sqlite.Conn) error {
			if !opts.noBusyHandler {
				conn.SetBusyTimeout(busy)
			}
			return sqlitex.ExecuteTransient(conn, "PRAGMA query_only = 1", nil)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("store: sqlite blobs: open %s: %w", abs, err)
	}
	b := &Blobs{path: abs, pool: pool}
	if err := b.check(context.Background()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: sqlite blobs: open %s: %w", abs, err)
	}
	return b, nil
}

func (b *Blobs) check(ctx context.Context) error {
	conn, err := b.pool.Take(ctx)
	if err != nil {
		return err
	}
	defer b.pool.Put(conn)
	found := false
	err = sqlitex.Execute(conn, `SELECT 1 FROM sqlite_master
 WHERE type = 'table' AND name = 'sync_segments' COLLATE NOCASE`, &sqlitex.ExecOptions{
		ResultFunc: func(*sqlite.Stmt) error { found = true; return nil },
	})
	if err != nil {
		return err
	}
	if !found {
		return errors.New("no sync_segments table: not a Syncular segment store")
	}
	return nil
}

// readTx runs fn on a pooled connection inside one read transaction
// (inReadTx). op names the operation in errors ("sqlite copy", "sqlite
// open").
func (b *Blobs) readTx(ctx context.Context, op string, fn func(conn *sqlite.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: %s: %w", op, err)
	}
	if err := inReadTx(ctx, b.pool, fn); err != nil {
		return fmt.Errorf("store: %s: %w", op, err)
	}
	return nil
}

// inReadTx runs fn on a connection of pool inside one read transaction,
// which it ends before the connection goes back to the pool. Every blob
// read of the edge (readTx, the lock-free fill) goes through here, so
// none holds its lock past fn. Errors are fn's, the pool's, or ctx's when
// it ended, unwrapped, except a failed end of the transaction.
func inReadTx(ctx context.Context, pool *sqlitex.Pool, fn func(conn *sqlite.Conn) error) (err error) {
	conn, err := pool.Take(ctx) // interrupts the connection when ctx ends
	if err != nil {
		return err
	}
	defer pool.Put(conn)
	if err := sqlitex.Execute(conn, "BEGIN", nil); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return err
	}
	defer func() {
		// An interrupted connection refuses every statement: lift the
		// interrupt so the transaction ends before the connection goes
		// back to the pool (an open one would pin the snapshot, and in a
		// rollback journal hold the writer off).
		conn.SetInterrupt(nil)
		if rerr := sqlitex.Execute(conn, "ROLLBACK", nil); rerr != nil && err == nil {
			err = fmt.Errorf("end transaction: %w", rerr)
		}
	}()
	return fn(conn)
}

// segmentRow reads the rowid and byte_length of segmentID's row on conn;
// found is false without a row.
func segmentRow(conn *sqlite.Conn, segmentID string) (rowid, length int64, found bool, err error) {
	err = sqlitex.Execute(conn, `SELECT rowid, byte_length FROM sync_segments WHERE segment_id = ?1`,
		&sqlitex.ExecOptions{
			Args: []any{segmentID},
			ResultFunc: func(st *sqlite.Stmt) error {
				rowid, length, found = st.ColumnInt64(0), st.ColumnInt64(1), true
				return nil
			},
		})
	return rowid, length, found, err
}

// openRowBlob opens the bytes of segmentID's row on conn (inside readTx)
// and returns the blob and the row's byte_length. found is false without
// a row; the caller closes the blob.
func (b *Blobs) openRowBlob(ctx context.Context, conn *sqlite.Conn, segmentID string) (blob *sqlite.Blob, length int64, found bool, err error) {
	rowid, length, found, err := segmentRow(conn, segmentID)
	if err != nil {
		return nil, 0, false, b.fault(ctx, err)
	}
	if !found {
		return nil, 0, false, nil
	}
	blob, err = conn.OpenBlob("", "sync_segments", "bytes", rowid, false)
	if err != nil {
		return nil, 0, true, b.fault(ctx, err)
	}
	return blob, length, true, nil
}

// CopyBlob writes the bytes of segmentID to w and returns how many it
// wrote. ErrNotFound when there is no row; ErrCorruptSegment when the blob
// is not the row's byte_length long. The row lookup and the whole copy
// are one read transaction, so the bytes are one snapshot even while the
// writer replaces or deletes the row. An error from w is returned as is.
func (b *Blobs) CopyBlob(ctx context.Context, segmentID string, w io.Writer) (n int64, err error) {
	err = b.readTx(ctx, "sqlite copy", func(conn *sqlite.Conn) error {
		blob, length, err := b.openSizedBlob(ctx, conn, segmentID)
		if err != nil {
			return err
		}
		defer blob.Close()
		buf := make([]byte, min(blobCopyBuf, max(length, 1)))
		for n < length {
			m, rerr := blob.Read(buf)
			if m > 0 {
				wm, werr := w.Write(buf[:m])
				n += int64(wm)
				if werr != nil {
					return werr
				}
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				return b.fault(ctx, rerr)
			}
		}
		return nil
	})
	return n, err
}

// openSizedBlob is openRowBlob with its two refusals: ErrNotFound without
// a row, ErrCorruptSegment when the blob is not byte_length long.
func (b *Blobs) openSizedBlob(ctx context.Context, conn *sqlite.Conn, segmentID string) (*sqlite.Blob, int64, error) {
	blob, length, found, err := b.openRowBlob(ctx, conn, segmentID)
	switch {
	case err != nil:
		return nil, 0, err
	case !found:
		return nil, 0, store.ErrNotFound
	}
	if blob.Size() != length {
		blob.Close()
		return nil, 0, fmt.Errorf("store: sqlite copy: %w: blob is %d bytes, byte_length %d",
			store.ErrCorruptSegment, blob.Size(), length)
	}
	return blob, length, nil
}

// fault wraps a database error, preferring the context's when it ended.
func (b *Blobs) fault(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("store: sqlite copy: %w", ctx.Err())
	}
	return fmt.Errorf("store: sqlite copy: %w", err)
}

// Close closes the pool, waiting for copies in progress.
func (b *Blobs) Close() error { return b.pool.Close() }
