package disk

import (
	"context"
	"fmt"
	"io"
	"os"
)

// Handles and readers: a complete file (sendfile-friendly) or a fill
// still growing.

// Handle is one reader's access to a cached segment: a complete file, or
// a fill in progress. It holds a file descriptor until Close. Not safe for
// concurrent use; one Reader at a time.
type Handle struct {
	file *os.File
	size int64
	fill *fill  // nil for a complete file
	vf   *vfill // a growing variant (grow.go); size is then -1
	hit  bool
	// follow is the cache whose following gauge counts this handle,
	// when Get attached it to a fill another caller started; nil else.
	follow *Cache

	cache  *Cache    // for a fill: counts handoffs
	reopen Reopen    // SetReopen (handoff.go)
	stream io.Closer // the store's stream of a handoff, closed with the handle
}

// Followed reports whether Get attached the handle to a fill another
// caller had started (neither a hit nor the fill's own starter).
func (h *Handle) Followed() bool { return h.follow != nil }

// Size is the segment's length in bytes; -1 for a growing variant, whose
// length is known only at its end (Growing).
func (h *Handle) Size() int64 { return h.size }

// Growing reports whether the handle reads a variant still being encoded
// (VariantFollowing): its Reader blocks for more bytes, its length is
// unknown (Size -1) and its last byte comes only after it was verified.
func (h *Handle) Growing() bool { return h.vf != nil }

// Hit reports whether Get found the segment complete on disk (no fill
// started or joined).
func (h *Handle) Hit() bool { return h.hit }

// File returns the complete, verified file (positioned anywhere), or nil
// while the handle reads a fill in progress or a growing variant: the
// store's Body of a file range (sendfile).
func (h *Handle) File() *os.File {
	if h.fill != nil || h.vf != nil {
		return nil
	}
	return h.file
}

// Reader returns the bytes [off, off+n) (n < 0: to the end).
//
// For a complete file it is an *io.LimitedReader over the handle's
// *os.File positioned at off: io.Copy to an http.ResponseWriter then
// reaches (*net.TCPConn).ReadFrom, whose sendfile path accepts exactly
// that type, so the bytes go from the page cache to the socket without a
// copy through user space.
//
// During a fill it reads bytes as they land and blocks for more (until ctx
// is done). It returns the range's last byte, and io.EOF, only after the
// whole fill hashed to the segment id, so a failed fill or a mismatch
// reaches the reader as an error before its last byte: the caller must
// then abort the response, never end it cleanly. When the fill fails on
// the disk and the handle has a Reopen, the reader continues from the
// store instead, verified the same way (handoff.go).
//
// A growing variant is read whole only (off 0, n < 0): the reader follows
// the encoder and holds the last byte back until the variant verified;
// if the build fails it returns the error instead (abort the response).
func (h *Handle) Reader(ctx context.Context, off, n int64) (io.Reader, error) {
	if h.vf != nil {
		if off != 0 || n >= 0 {
			return nil, fmt.Errorf("disk cache: a growing variant is read whole")
		}
		return &growReader{vf: h.vf, file: h.file, ctx: ctx}, nil
	}
	if off < 0 || off > h.size {
		return nil, fmt.Errorf("disk cache: offset %d outside 0..%d", off, h.size)
	}
	if n < 0 || n > h.size-off {
		n = h.size - off
	}
	if h.fill == nil {
		if _, err := h.file.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
		return &io.LimitedReader{R: h.file, N: n}, nil
	}
	return &fillReader{h: h, ctx: ctx, pos: off, end: off + n}, nil
}

// avail is how many bytes r may return now. f.mu held. The last byte of
// the range is held back until the fill is verified: a client that got
// every byte it was promised sees a complete response, so the bytes of a
// fill that then fails must stop short of the end.
func (r *fillReader) avail(f *fill) int64 {
	lim := min(f.written, r.end)
	if !f.done && lim == r.end {
		lim--
	}
	return lim - r.pos
}

// Close releases the handle's file descriptor (and the store's stream a
// handoff opened).
func (h *Handle) Close() error {
	if c := h.follow; c != nil {
		h.follow = nil
		c.following.Add(-1)
	}
	if h.stream != nil {
		h.stream.Close()
		h.stream = nil
	}
	return h.file.Close()
}

// fillReader reads a fill in progress through its handle's descriptor.
type fillReader struct {
	h        *Handle
	ctx      context.Context
	pos, end int64
	ho       *handoff // once the fill failed on the disk (handoff.go)
}

func (r *fillReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.ho != nil {
		return r.handoffRead(p)
	}
	f := r.h.fill
	for {
		f.mu.Lock()
		if f.err != nil {
			err, rp := f.err, f.resume
			f.mu.Unlock()
			// Every byte in the file (the close or rename failed):
			// no store needed. Otherwise only with a Reopen.
			if rp == nil || (r.h.reopen == nil && rp.at < r.h.size) {
				return 0, err
			}
			ho, herr := newHandoff(rp)
			if herr != nil {
				return 0, err
			}
			if r.h.stream != nil { // an earlier reader's stream
				r.h.stream.Close()
				r.h.stream = nil
			}
			r.ho = ho
			r.h.cache.handoffs.Add(1)
			return r.handoffRead(p)
		}
		if r.pos >= r.end {
			if f.done {
				f.mu.Unlock()
				return 0, io.EOF
			}
		} else if avail := r.avail(f); avail > 0 {
			f.mu.Unlock()
			return readWritten(r.h.file, p, &r.pos, avail)
		}
		ch := f.wake
		f.mu.Unlock()
		if err := awaitWake(r.ctx, ch); err != nil {
			return 0, err
		}
	}
}

// readWritten reads into p, at most avail bytes, from file at *pos and
// advances *pos: bytes a fill or a variant build has already written, so
// they must be there (a short read is a fault, never the end).
func readWritten(file *os.File, p []byte, pos *int64, avail int64) (int, error) {
	if int64(len(p)) > avail {
		p = p[:avail]
	}
	m, err := file.ReadAt(p, *pos)
	*pos += int64(m)
	if m > 0 {
		return m, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF // written bytes must be there
	}
	return 0, unavailable(err)
}

// awaitWake waits until wake is closed (more bytes, or the end) or ctx
// ends.
func awaitWake(ctx context.Context, wake <-chan struct{}) error {
	select {
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Interface guards
var (
	_ io.Writer = (*fillWriter)(nil)
	_ io.Reader = (*fillReader)(nil)
)
