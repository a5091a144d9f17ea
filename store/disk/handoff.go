package disk

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/syncular/caddy-syncular/segid"
)

// Handoffs: a fill that fails on the disk (ENOSPC or any other write
// error, a failed close or rename) after its source sent good bytes does
// not fail the readers that were following it. Each reader with a Reopen
// (Handle.SetReopen) reads on from its descriptor what the fill wrote,
// then from a stream of the store, and holds the last byte of its range
// back until the whole segment, the fill's bytes and the store's, hashed
// to the id: a reader still never sees a clean end of bytes that were not
// verified. The hash of what the fill wrote is carried over (resumePoint),
// so a reader hashes only the bytes it reads from the store.
//
// A range that ends before the segment does still reads the store to the
// segment's end to verify it, once per reader and only after a disk
// failure. A read error on the descriptor (the disk cannot even return
// what it accepted) fails the reader.

// Reopen opens a stream of the segment's bytes from offset off to its end,
// from the store: how a reader of a fill that failed on the disk goes on.
type Reopen func(ctx context.Context, off int64) (io.ReadCloser, error)

// SetReopen lets the handle's readers continue from the store when the
// fill they follow fails on the disk. Call it before Reader. A handle on
// a complete file ignores it.
func (h *Handle) SetReopen(open Reopen) { h.reopen = open }

// resumePoint is where a fill that failed on the disk stopped: the first
// at bytes are in its file (readable through the readers' descriptors)
// and state is the SHA-256 of them.
type resumePoint struct {
	at    int64
	state []byte
}

// resumePoint returns the writer's position and hash state (nil if the
// hash cannot be carried over). A fill from a source that verifies its
// bytes itself hashed nothing: the bytes it wrote are hashed now, read
// back from its file at path, once for all its readers.
func (w *fillWriter) resumePoint(path string) *resumePoint {
	h := &w.h
	if w.f.checked {
		h = new(segid.Hasher)
		if err := hashPrefix(h, path, w.n); err != nil {
			return nil
		}
	}
	state, err := h.MarshalBinary()
	if err != nil {
		return nil
	}
	return &resumePoint{at: w.n, state: state}
}

// hashPrefix hashes the first n bytes of the file at path into h.
func hashPrefix(h *segid.Hasher, path string, n int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := io.CopyBuffer(h, io.LimitReader(f, n), make([]byte, copyBufSize))
	if err == nil && m != n {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// handoff is one reader's continuation after the disk failed.
type handoff struct {
	rp       *resumePoint
	h        segid.Hasher  // [0, rp.at) and then the store's bytes up to next
	next     int64         // offset of the store stream's next byte
	rc       io.ReadCloser // the store's bytes from rp.at, opened when first needed
	buf      []byte        // for bytes hashed but not returned
	last     []byte        // the range's last byte, when it came from the store
	verified bool
	err      error // sticky
}

func newHandoff(rp *resumePoint) (*handoff, error) {
	ho := &handoff{rp: rp, next: rp.at}
	if err := ho.h.UnmarshalBinary(rp.state); err != nil {
		return nil, err
	}
	return ho, nil
}

// handoffRead is fillReader.Read once the fill failed on the disk.
func (r *fillReader) handoffRead(p []byte) (int, error) {
	ho := r.ho
	if ho.err != nil {
		return 0, ho.err
	}
	n, err := r.handoffStep(p)
	if err != nil && err != io.EOF {
		ho.err = err
	}
	return n, err
}

func (r *fillReader) handoffStep(p []byte) (int, error) {
	ho, size := r.ho, r.h.size
	// Every byte of the range but the last, from the file, then the store.
	if r.pos < r.end-1 {
		want := min(int64(len(p)), r.end-1-r.pos)
		if r.pos < ho.rp.at {
			want = min(want, ho.rp.at-r.pos)
			m, err := r.h.file.ReadAt(p[:want], r.pos)
			r.pos += int64(m)
			if m > 0 {
				return m, nil
			}
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF // written bytes must be there
			}
			return 0, unavailable(err)
		}
		if err := r.skipTo(r.pos); err != nil {
			return 0, err
		}
		m, err := r.storeRead(p[:want])
		r.pos += int64(m)
		if m > 0 {
			return m, nil
		}
		return 0, err
	}
	// The last byte waits for the whole segment to verify.
	if !ho.verified {
		keep := r.end - 1 // the byte to keep when the store sends it
		if r.pos >= r.end {
			keep = -1
		}
		if err := r.skipTo(size); err != nil {
			return 0, err
		}
		if keep >= ho.rp.at && ho.last == nil {
			return 0, fmt.Errorf("disk cache: continuing from the store: lost byte %d", keep)
		}
		if err := ho.verify(r, size); err != nil {
			return 0, err
		}
	}
	if r.pos >= r.end {
		return 0, io.EOF
	}
	if r.pos < ho.rp.at {
		m, err := r.h.file.ReadAt(p[:1], r.pos)
		if m == 1 {
			r.pos++
			return 1, nil
		}
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, unavailable(err)
	}
	p[0] = ho.last[0]
	r.pos++
	return 1, nil
}

// open starts the store's stream at the resume point.
func (r *fillReader) open() error {
	ho := r.ho
	if ho.rc != nil {
		return nil
	}
	if ho.rp.at >= r.h.size {
		return nil // every byte is in the file
	}
	rc, err := r.h.reopen(r.ctx, ho.rp.at)
	if err != nil {
		return fmt.Errorf("disk cache: continuing from the store: %w", err)
	}
	ho.rc = rc
	r.h.stream = rc
	return nil
}

// storeRead reads the store's next bytes into p, hashing them.
func (r *fillReader) storeRead(p []byte) (int, error) {
	ho := r.ho
	if err := r.open(); err != nil {
		return 0, err
	}
	if rem := r.h.size - ho.next; int64(len(p)) > rem {
		p = p[:rem]
	}
	if len(p) == 0 {
		return 0, nil
	}
	m, err := ho.rc.Read(p)
	ho.h.Write(p[:m])
	if k := r.end - 1 - ho.next; m > 0 && k >= 0 && k < int64(m) && ho.last == nil {
		ho.last = []byte{p[k]}
	}
	ho.next += int64(m)
	switch {
	case m > 0:
		return m, nil
	case err == io.EOF:
		return 0, fmt.Errorf("%w: the store sent %d of %d bytes", ErrSizeMismatch, ho.next, r.h.size)
	case err != nil:
		return 0, fmt.Errorf("disk cache: continuing from the store: %w", err)
	}
	return 0, nil
}

// skipTo reads (and hashes) the store's stream up to offset to.
func (r *fillReader) skipTo(to int64) error {
	ho := r.ho
	for zero := 0; ho.next < to; {
		if ho.buf == nil {
			ho.buf = make([]byte, 32<<10)
		}
		m, err := r.storeRead(ho.buf[:min(int64(len(ho.buf)), to-ho.next)])
		if err != nil {
			return err
		}
		if m == 0 {
			if zero++; zero > 100 {
				return fmt.Errorf("disk cache: continuing from the store: %w", io.ErrNoProgress)
			}
		}
		if err := r.ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// verify checks, at the segment's end, that the store sends no more bytes
// and that the whole hashed to the id.
func (ho *handoff) verify(r *fillReader, size int64) error {
	if ho.rc != nil {
		var extra [1]byte
		for range 3 { // a reader may return 0, nil; bounded
			k, err := ho.rc.Read(extra[:])
			if k > 0 {
				return fmt.Errorf("%w: the store sent more than %d bytes", ErrSizeMismatch, size)
			}
			if err != nil {
				break // io.EOF, or a failure after every byte arrived
			}
		}
	}
	if !ho.h.Matches(r.h.fill.want) {
		return ErrHashMismatch
	}
	ho.verified = true
	return nil
}
