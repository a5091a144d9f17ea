package store

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/disk"
)

// The large-segment step of Cached.Open: a segment whose length is known
// (from the record cache) but that the memory tier does not hold (larger
// than MaxEntry, or no room) is served from the disk tier
// (CacheOptions.Disk): filled once from the store, however many callers
// ask at once, hashed while written, and read from the file. When there
// is no disk tier or it declines (too large, no room, directory unusable)
// the bytes stream from the store with bounded memory; a whole body is
// then hashed as it streams and ends in ErrCorruptSegment, before its last
// byte, when it does not match its id.

// blobCopier is a store that can copy a segment's bytes into a local
// writer in one short read and verifies them as it copies (the SQLite
// store's CopyBlob): the disk tier's fill source. CopyBlob returns nil
// only when the bytes it wrote are the segment's (an error matching
// ErrCorruptSegment when the store's are not), so the disk tier does not
// hash them again (disk.Cache.GetVerified).
type blobCopier interface {
	CopyBlob(ctx context.Context, id segid.ID, w io.Writer) (int64, error)
}

// openLarge serves [off, off+n) of a segment of size bytes that the
// memory tier does not serve.
func (c *Cached) openLarge(ctx context.Context, id segid.ID, size, off, n int64) (*Body, error) {
	// Bytes that failed verification are not read again for a while
	// (outage.go), whatever the tier that would read them.
	if err := c.backingOff(id); err != nil {
		return nil, err
	}
	if d := c.opts.Disk; d != nil {
		get := d.Get
		if c.copier != nil { // the copy verifies its bytes (blobCopier)
			get = d.GetVerified
		}
		h, err := get(ctx, id, size, c.diskSource(ctx, id))
		if err == nil {
			t := diskTier(h)
			// A fill that fails on the disk hands its readers over
			// to the store, verified to the end (disk/handoff.go).
			h.SetReopen(func(ctx context.Context, at int64) (io.ReadCloser, error) {
				rc, _, err := c.openInner(ctx, id, at, -1) // behind the breaker
				return rc, err
			})
			b, err := diskBody(ctx, h, t, min(off, size), n, c.endOf(id))
			if err != nil {
				h.Close()
				return nil, fmt.Errorf("store: disk tier: %w", err)
			}
			c.diskReads.Add(1)
			if h.Hit() {
				c.clearCorrupt(id) // a complete file verified
			}
			return b, nil
		}
		if !diskDeclined(err) {
			// The fill failed before its first byte: the store's
			// answer (ErrNotFound, a fault, corrupt bytes) is every
			// caller's, rather than one more store read each.
			err = corruptErr(err)
			c.verified(id, err)
			return nil, err
		}
	}
	c.passThrough.Add(1)
	rc, t, err := c.openInner(ctx, id, off, n)
	if err != nil {
		return nil, err
	}
	b := streamBody(rc, t)
	if off == 0 && (n < 0 || n >= size) {
		v := newVerifyReader(rc, id, size, c.endOf(id))
		b.r, b.closer, b.verified = v, v, true
	}
	return b, nil
}

// endOf is the end hook of a verified read of id (Cached.verified).
func (c *Cached) endOf(id segid.ID) func(error) {
	return func(err error) { c.verified(id, err) }
}

// diskSource is how the disk tier fills id: a streaming copy from
// the inner store, in one short read where the store offers one. The fill
// holds a slot of the gate (fair.go) in the turn of the tenant of ctx,
// the request that started it (the disk tier runs it under a context of
// its own).
func (c *Cached) diskSource(ctx context.Context, id segid.ID) disk.Source {
	src := c.diskCopy(id)
	if c.gate == nil {
		return src
	}
	tenant := TenantOf(ctx)
	return func(fctx context.Context, w io.Writer) error {
		release, err := c.gate.acquire(WithTenant(fctx, tenant))
		if err != nil {
			return err
		}
		defer release()
		return src(fctx, w)
	}
}

// diskCopy is diskSource without the gate.
func (c *Cached) diskCopy(id segid.ID) disk.Source {
	if bc := c.copier; bc != nil {
		return func(ctx context.Context, w io.Writer) error {
			if err := c.guard(); err != nil {
				return err
			}
			ow := &watchedWriter{w: w}
			_, err := bc.CopyBlob(ctx, id, &countingWriter{w: ow, n: &c.storeRead})
			if ow.err == nil { // a write error is the disk's, not the store's
				c.feedBreaker(err)
			}
			return err
		}
	}
	return disk.FromReader(func(ctx context.Context) (io.ReadCloser, error) {
		rc, _, err := c.openInner(ctx, id, 0, -1)
		return rc, err
	})
}

// diskDeclined reports whether the disk tier declined to serve (the caller
// then streams from the store) rather than failed to read the store.
func diskDeclined(err error) bool {
	return errors.Is(err, disk.ErrTooLarge) || errors.Is(err, disk.ErrNoRoom) ||
		errors.Is(err, disk.ErrUnavailable)
}

// corruptErr makes the disk tier's mismatch errors match ErrCorruptSegment.
func corruptErr(err error) error {
	if err != nil && !errors.Is(err, ErrCorruptSegment) &&
		(errors.Is(err, disk.ErrHashMismatch) || errors.Is(err, disk.ErrSizeMismatch)) {
		return fmt.Errorf("store: %w: %w", ErrCorruptSegment, err)
	}
	return err
}

// watchedWriter remembers its writer's first error.
type watchedWriter struct {
	w   io.Writer
	err error
}

func (w *watchedWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// verifyReader is segid.Reader with the store's errors: the whole body of
// a segment (size bytes) streamed from a store ends cleanly (io.EOF) only
// after its bytes hashed to the id and were exactly size long; every way
// it fails to be its segment's is ErrCorruptSegment, returned in place of
// the read that would have delivered the last byte, so a response copied
// from it can be aborted before the client has every byte it was promised.
type verifyReader struct {
	rc   io.ReadCloser
	id   segid.ID
	size int64
	v    segid.Reader
	err  error       // sticky: io.EOF once verified, or the failure
	end  func(error) // told once whether the body verified (nil) or not; may be nil
}

func newVerifyReader(rc io.ReadCloser, id segid.ID, size int64, end func(error)) *verifyReader {
	v := &verifyReader{rc: rc, id: id, size: size, end: end}
	v.v.Reset(rc, id, size)
	return v
}

// ended tells end how the body ended: verified (io.EOF) or err.
func (v *verifyReader) ended(err error) {
	if v.end == nil {
		return
	}
	if err == io.EOF {
		err = nil
	}
	v.end(err)
	v.end = nil
}

func (v *verifyReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	m, err := v.v.Read(p)
	if end := v.v.Err(); end != nil { // the body ended
		v.err = v.storeErr(end)
		v.ended(v.err)
		if v.err != io.EOF {
			return 0, v.err
		}
	}
	return m, err
}

// storeErr is the store's error for how the body ended (segid.Reader.Err).
func (v *verifyReader) storeErr(end error) error {
	switch {
	case end == io.EOF:
		return io.EOF
	case errors.Is(end, segid.ErrShort):
		return fmt.Errorf("store: %s: %w (%d of its record's %d bytes)", v.id, ErrCorruptSegment, v.v.N(), v.size)
	case errors.Is(end, segid.ErrLong):
		return fmt.Errorf("store: %s: %w (longer than its record's byteLength)", v.id, ErrCorruptSegment)
	}
	return fmt.Errorf("store: %s: %w", v.id, ErrCorruptSegment)
}

func (v *verifyReader) Close() error { return v.rc.Close() }

// Interface guards
var (
	_ io.ReadCloser = (*verifyReader)(nil)
)
