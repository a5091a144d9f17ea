package sqlite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/syncular/caddy-syncular/store"
	"zombiezen.com/go/sqlite"
)

// sqliteChunk is the most bytes SQLite.Open holds per reader. A read of a
// blob no longer than this is one substr query, as before; a longer blob
// streams in chunks of this size, each read with incremental blob I/O in
// its own short read transaction. (substr of a blob makes SQLite load the
// whole blob, so chunked substr would cost the blob's size per chunk.)
const sqliteChunk = 1 << 20

// sizeSQL reads a blob's length without loading it (length() of a column
// that holds a BLOB reads only the record header). typeof tells a TEXT
// value, whose length() counts characters, from a BLOB.
const sizeSQL = `SELECT typeof(bytes), length(bytes) FROM sync_segments WHERE segment_id = ?1`

// blobPool is the handle's pool of zombiezen connections for incremental
// blob I/O, opened on first use (a store of small segments never opens
// it) and closed with the handle.
type blobPool struct {
	mu     sync.Mutex
	blobs  *Blobs
	closed bool
}

func (p *blobPool) get(path string, opts Options) (*Blobs, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errSQLiteClosed
	}
	if p.blobs == nil {
		b, err := OpenBlobs(path, opts)
		if err != nil {
			return nil, err
		}
		p.blobs = b
	}
	return p.blobs, nil
}

func (p *blobPool) close() {
	p.mu.Lock()
	b := p.blobs
	p.blobs, p.closed = nil, true
	p.mu.Unlock()
	if b != nil {
		b.Close()
	}
}

// openStream answers Open for a blob longer than sqliteChunk: the range
// [off, end) streams in chunks; nil, nil when the value is small (or TEXT)
// and the substr query should answer.
func (s *Store) openStream(ctx context.Context, h *sqliteHandle, segmentID string, off, n int64) (io.ReadCloser, error) {
	var typ string
	var size int64
	err := h.retryBusy(ctx, func() error { return h.sizeStmt.QueryRowContext(ctx, segmentID).Scan(&typ, &size) })
	if err != nil {
		return nil, err // sql.ErrNoRows included: Open maps it
	}
	if typ != "blob" || size <= sqliteChunk {
		return nil, nil
	}
	off = min(off, size)
	end := size
	if n >= 0 && n < size-off {
		end = off + n
	}
	if off == end {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	return &sqliteStream{s: s, ctx: ctx, id: segmentID, size: size, pos: off, end: end}, nil
}

// sqliteStream reads [pos, end) of a blob of size bytes one chunk at a
// time. Each chunk is its own read transaction that finds the row again
// and checks it still holds a blob of the same length, so a slow client
// never pins a WAL snapshot, and a row deleted or rewritten mid-stream
// ends the stream with an error, never with other bytes.
type sqliteStream struct {
	s        *Store
	ctx      context.Context
	id       string
	size     int64
	pos, end int64
	buf      []byte
	r        int // unread bytes are buf[r:]
	err      error
}

func (st *sqliteStream) Read(p []byte) (int, error) {
	if st.r == len(st.buf) {
		if st.err != nil {
			return 0, st.err
		}
		if st.pos >= st.end {
			return 0, io.EOF
		}
		if err := st.fill(); err != nil {
			st.err = err
			return 0, err
		}
	}
	m := copy(p, st.buf[st.r:])
	st.r += m
	return m, nil
}

func (st *sqliteStream) fill() error {
	want := min(int64(sqliteChunk), st.end-st.pos)
	if cap(st.buf) < int(want) {
		st.buf = make([]byte, sqliteChunk)
	}
	st.buf = st.buf[:want]
	h, err := st.s.acquire(st.ctx)
	if err != nil {
		return err
	}
	defer h.use.RUnlock()
	b, err := h.blobPool.get(st.s.path, st.s.blobOpts)
	if err != nil {
		return fmt.Errorf("store: sqlite open: %w", err)
	}
	if err := h.retryBusy(st.ctx, func() error { return b.readChunk(st.ctx, st.id, st.size, st.pos, st.buf) }); err != nil {
		return err
	}
	st.pos += want
	st.r = 0
	return nil
}

func (st *sqliteStream) Close() error {
	st.buf, st.r = nil, 0
	if st.err == nil {
		st.err = errors.New("store: sqlite open: read after close")
	}
	return nil
}

// readChunk fills p with the bytes of segmentID from off, in one read
// transaction, after checking the row's blob is still size bytes long.
func (b *Blobs) readChunk(ctx context.Context, segmentID string, size, off int64, p []byte) error {
	return b.readTx(ctx, "sqlite open", func(conn *sqlite.Conn) error {
		blob, _, found, err := b.openRowBlob(ctx, conn, segmentID)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("store: sqlite open: the segment's row was removed mid-stream")
		}
		defer blob.Close()
		if blob.Size() != size {
			return fmt.Errorf("store: sqlite open: %w: blob changed from %d to %d bytes mid-stream",
				store.ErrCorruptSegment, size, blob.Size())
		}
		if _, err := blob.Seek(off, io.SeekStart); err != nil {
			return b.fault(ctx, err)
		}
		if _, err := io.ReadFull(blob, p); err != nil {
			return b.fault(ctx, err)
		}
		return nil
	})
}
