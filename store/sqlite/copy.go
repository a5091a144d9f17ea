package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	"zombiezen.com/go/sqlite"
)

// The fills' copy: CopyBlob (the disk tier's source) and FillInto (the
// memory tier's), verified in the one pass that copies, whichever read
// answers: the lock-free read (lockfree.go) or the locked, chunked one.

// CopyBlob writes the bytes of id to w with bounded memory on the
// file now at the store's path, and verifies them as it copies: the disk
// tier's fill source. It returns nil only when the bytes it wrote hash to
// the id, so its caller hashes them no more; the bytes reach w before
// that is known (except the lock-free read's last chunk), so w must not
// take them for the segment's until CopyBlob returned nil. ErrNotFound
// when there is no row (or id is the zero ID);
// ErrCorruptSegment when the blob is not the row's byte_length long or
// its bytes do not hash to the id. An error from w is returned as is. No
// read lock is held across writes to w for longer than one chunk
// (lockedChunk), and none at all on a rollback-journal file when the
// lock-free read verifies.
func (s *Store) CopyBlob(ctx context.Context, id segid.ID, w io.Writer) (int64, error) {
	n, _, err := s.copyBlob(ctx, id, w, true)
	return n, err
}

// copyBlob is CopyBlob. With hashLocked false the locked read does not
// hash what it copies, and verified says whether the bytes were (by the
// lock-free read): FillInto hashes its whole buffer once instead, which
// is cheaper than hashing it piece by piece inside the copy.
func (s *Store) copyBlob(ctx context.Context, id segid.ID, w io.Writer, hashLocked bool) (n int64, verified bool, err error) {
	if id.IsZero() {
		return 0, false, fmt.Errorf("store: sqlite copy: %w", store.ErrNotFound) // no segment has it
	}
	segmentID, want := id.String(), id.Digest()
	h, err := s.acquire(ctx)
	if err != nil {
		return 0, false, err
	}
	defer h.use.RUnlock()
	if rollbackJournal(h.journal) {
		n, err := s.copyLockFree(ctx, h, segmentID, want, w)
		if !errors.Is(err, errLockFreeSkipped) {
			return n, true, err
		}
	}
	if !hashLocked {
		n, err := s.copyLocked(ctx, h, segmentID, w)
		return n, false, err
	}
	n, err = s.copyChecked(ctx, h, segmentID, want, w)
	return n, true, err
}

// copyChecked is copyLocked, hashing the bytes as w accepts them: an
// error matching ErrCorruptSegment when they do not hash to want.
func (s *Store) copyChecked(ctx context.Context, h *sqliteHandle, segmentID string, want segid.Digest, w io.Writer) (int64, error) {
	hw := &hashingWriter{w: w}
	n, err := s.copyLocked(ctx, h, segmentID, hw)
	if err == nil && !hw.h.Matches(want) {
		err = fmt.Errorf("store: sqlite copy: %s: %w", segmentID, store.ErrCorruptSegment)
	}
	return n, err
}

// hashingWriter hashes what w accepts.
type hashingWriter struct {
	w io.Writer
	h segid.Hasher
}

func (hw *hashingWriter) Write(p []byte) (int, error) {
	n, err := hw.w.Write(p)
	hw.h.Write(p[:n])
	return n, err
}

// copyLocked copies the blob of segmentID to w in read transactions of
// lockedChunk bytes each, none open while w is written: the first finds
// the row and checks its length, each later one finds the row again and
// checks it still holds a blob of that length.
func (s *Store) copyLocked(ctx context.Context, h *sqliteHandle, segmentID string, w io.Writer) (int64, error) {
	b, err := h.blobPool.get(s.path, s.blobOpts)
	if err != nil {
		return 0, fmt.Errorf("store: sqlite copy: %w", err)
	}
	if !rollbackJournal(h.journal) {
		// In WAL a reader never makes the writer's commit fail or wait:
		// its snapshot only holds back checkpoints, for as long as the
		// copy (a local file write, never a client's pace). One
		// transaction walks the blob's overflow chain once; chunks would
		// walk it again from the start each (far slower for a large blob:
		// docs/performance.md, "One transaction per WAL blob copy").
		return b.CopyBlob(ctx, segmentID, w)
	}
	var size int64
	err = h.retryBusy(ctx, func() (err error) { size, err = b.blobSize(ctx, segmentID); return err })
	if err != nil {
		return 0, err
	}
	buf := make([]byte, min(lockedChunk, max(size, 1)))
	var n int64
	for n < size {
		p := buf[:min(int64(len(buf)), size-n)]
		if err := h.retryBusy(ctx, func() error { return b.readChunk(ctx, segmentID, size, n, p) }); err != nil {
			return n, err
		}
		wm, werr := w.Write(p)
		n += int64(wm)
		if werr != nil {
			return n, werr
		}
	}
	return n, nil
}

// blobSize is the length of segmentID's blob, read in one short
// transaction. ErrNotFound without a row; ErrCorruptSegment when the blob
// is not byte_length long.
func (b *Blobs) blobSize(ctx context.Context, segmentID string) (size int64, err error) {
	err = b.readTx(ctx, "sqlite copy", func(conn *sqlite.Conn) error {
		blob, length, err := b.openSizedBlob(ctx, conn, segmentID)
		if err != nil {
			return err
		}
		size = length
		return blob.Close()
	})
	return size, err
}

// FillInto reads id whole into buf, which is its record's
// byteLength long, as CopyBlob does (so without holding a lock across the
// read where the file allows), and verifies it in one pass: the lock-free
// read's, or one over buf once it is full: the memory tier's fill. ErrCorruptSegment when the blob is not len(buf) bytes or
// does not hash to the id.
func (s *Store) FillInto(ctx context.Context, id segid.ID, buf []byte) error {
	fw := &fixedWriter{buf: buf}
	n, verified, err := s.copyBlob(ctx, id, fw, false)
	if err != nil {
		return err
	}
	if fw.long || n != int64(len(buf)) {
		return fmt.Errorf("store: %s: %w (%d bytes, its record's byteLength %d)", id, store.ErrCorruptSegment, n, len(buf))
	}
	if !verified && !id.Matches(buf) {
		return fmt.Errorf("store: sqlite copy: %s: %w", id, store.ErrCorruptSegment)
	}
	return nil
}

// fixedWriter fills buf and refuses more.
type fixedWriter struct {
	buf  []byte
	n    int
	long bool
}

var errFixedFull = errors.New("store: the blob is longer than its record's byteLength")

func (f *fixedWriter) Write(p []byte) (int, error) {
	m := copy(f.buf[f.n:], p)
	f.n += m
	if m < len(p) {
		f.long = true
		return m, fmt.Errorf("%w: %w", store.ErrCorruptSegment, errFixedFull)
	}
	return m, nil
}
