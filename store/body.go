package store

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/disk"
)

// The bytes of one answer. A request asks for them once (Cached.OpenBody)
// with what it accepts (Want):
// the cache picks the representation (a content-coded variant it holds,
// or the identity bytes of the range), schedules the variant builds its
// policy calls for, and hands back one Body that says what it holds (its
// Kind: bytes in memory, a range of a complete disk tier file, or a
// stream), its coding, its length and the tier it came from. The writer
// is the caller's (caddymodule/body.go): one Write, sendfile(2), or one
// copy. A stream never ends cleanly with bytes that do not match their
// id: its error then matches ErrCorruptSegment.

// Want is what an answer accepts.
type Want struct {
	// Codings are the content codings the request accepts, preferred
	// first (Identity is always acceptable and is not listed). nil: the
	// identity bytes only (a Range request, or compression off).
	Codings []compress.Coding
	// Off and N are the range of identity bytes, Size the record's
	// byteLength: a body of the whole segment (Off 0, N Size) is
	// verified against the id as it streams.
	Off, N, Size int64
	// Wait lets the open wait, a bounded time (WaitBound), for a build
	// of the preferred coding's variant under way (a GET: a HEAD has no
	// body to wait for).
	Wait bool
}

// BodyKind is what a Body holds, and so how it is best written.
type BodyKind uint8

const (
	// BodyMemory: Bytes, the cache's (never modified): one Write.
	BodyMemory BodyKind = iota
	// BodyFile: File, a range of a complete disk tier file whose bytes
	// were verified when it was filled: sendfile(2).
	BodyFile
	// BodyStream: Read, verified as it is read when it is a whole
	// segment (a store's stream, a disk fill or a variant being
	// encoded): a copy.
	BodyStream
)

// Body is the bytes of one answer. Not safe for concurrent use.
type Body struct {
	kind     BodyKind
	coding   compress.Coding
	size     int64 // bytes the body holds; -1: a variant still being encoded
	tier     Tier
	streamed bool // read from the inner store as it is written
	verified bool // BodyStream: already checked against the id as it is read

	mem  []byte   // BodyMemory: the unread bytes
	file *os.File // BodyFile: [off, off+size) of it
	off  int64
	r    io.Reader     // BodyStream; BodyFile once Read (a section of the file)
	src  io.ReadCloser // a store's stream (streamBody), before verification

	h      *disk.Handle // a disk tier body (closed with it)
	end    func(error)  // a disk tier body: told once how its reads ended
	closer io.Closer
	also   io.Closer // closed with the body (the identity read a variant follows)
}

// Kind is what the body holds.
func (b *Body) Kind() BodyKind { return b.kind }

// Bytes is a BodyMemory body's bytes (the cache's: never modify them).
func (b *Body) Bytes() []byte { return b.mem }

// File is a BodyFile body's file and the range of it that is the body
// (size bytes from off). The descriptor is the body's alone: a writer may
// move its offset.
func (b *Body) File() (f *os.File, off int64) { return b.file, b.off }

// Coding is the body's content coding (Identity for the segment's bytes).
func (b *Body) Coding() compress.Coding { return b.coding }

// Size is the body's length in bytes; -1 for a variant still being
// encoded, whose length is known only at its end (no Content-Length).
func (b *Body) Size() int64 { return b.size }

// Tier is the tier that answered the open (the cache kind of the answer).
func (b *Body) Tier() Tier { return b.tier }

// Streamed reports whether the bytes are read from the inner store while
// they are written (neither in memory nor a file of the disk tier): such
// a body holds the store's read buffer until it ends.
func (b *Body) Streamed() bool { return b.streamed }

// Read reads the body, whatever its kind. A body that ends short of its
// Size or whose bytes do not verify fails rather than end: its error
// matches ErrCorruptSegment when the bytes do not match their id.
func (b *Body) Read(p []byte) (int, error) {
	switch b.kind {
	case BodyMemory:
		if len(b.mem) == 0 {
			return 0, io.EOF
		}
		n := copy(p, b.mem)
		b.mem = b.mem[n:]
		return n, nil
	case BodyFile:
		if b.r == nil {
			b.r = io.NewSectionReader(b.file, b.off, b.size)
		}
	}
	n, err := b.r.Read(p)
	if err != nil && b.h != nil {
		if err != io.EOF {
			err = corruptErr(err)
		}
		if b.end != nil {
			if err == io.EOF {
				b.end(nil)
			} else {
				b.end(err)
			}
			b.end = nil
		}
	}
	return n, err
}

// Close releases the body (a file descriptor of the disk tier).
func (b *Body) Close() error {
	var err error
	if b.closer != nil {
		err = b.closer.Close()
		b.closer = nil
	}
	if b.also != nil {
		b.also.Close()
		b.also = nil
	}
	return err
}

// memoryBody is the Body of bytes held in memory.
func memoryBody(mem []byte, t Tier) *Body {
	return &Body{kind: BodyMemory, size: int64(len(mem)), tier: t, mem: mem}
}

// streamBody is the Body of a store's stream (rc), unverified.
func streamBody(rc io.ReadCloser, t Tier) *Body {
	return &Body{kind: BodyStream, size: -1, tier: t, streamed: true, r: rc, src: rc, closer: rc}
}

// diskBody is the Body of [off, off+n) (n < 0: to the end) of a disk tier
// handle: a range of its file when the file is complete, else a stream
// that follows the fill (or the encoder) and verifies (disk.Handle.Reader,
// read under ctx). end, when set, is told how its reads ended.
func diskBody(ctx context.Context, h *disk.Handle, t Tier, off, n int64, end func(error)) (*Body, error) {
	b := &Body{kind: BodyStream, coding: compress.Identity, size: h.Size(), tier: t, h: h, end: end, closer: h}
	if f := h.File(); f != nil {
		size := h.Size()
		if off < 0 || off > size {
			return nil, fmt.Errorf("disk cache: offset %d outside 0..%d", off, size)
		}
		if n < 0 || n > size-off {
			n = size - off
		}
		b.kind, b.file, b.off, b.size = BodyFile, f, off, n
		return b, nil
	}
	r, err := h.Reader(ctx, off, n)
	if err != nil {
		return nil, err
	}
	if n >= 0 {
		b.size = n
	} else if b.size >= 0 {
		b.size -= off
	}
	b.r = r
	return b, nil
}

// OpenBody opens the body that answers want (the caller closes it): the variant of the first of want.Codings
// when it is held (or being encoded from a fill, or its build under way
// ends within the wait), else the variant of another acceptable coding
// that is held, else the identity bytes of the range through the tiers
// (Open). A variant missing because its identity bytes were not at hand
// has its build started as soon as the identity read put them there, and
// the answer follows that variant when it can be sent now.
func (c *Cached) OpenBody(ctx context.Context, id segid.ID, want Want) (*Body, error) {
	retry := compress.Identity
	if len(want.Codings) > 0 {
		var b *Body
		if b, retry = c.openVariant(ctx, id, want); b != nil {
			return b, nil
		}
	}
	b, err := c.read(ctx, id, want.Off, want.N)
	if err != nil {
		return nil, err
	}
	identity(b, id, want)
	if retry != compress.Identity {
		if v := c.variantAfterRead(ctx, id, retry, want.Wait); v != nil {
			v.tier = b.tier // this request's read started what the variant follows
			v.also = b
			return v, nil
		}
	}
	return b, nil
}

// identity makes b, an open of want's identity range, that range's
// answer: a stream of the whole segment is verified as it is read (once),
// and a stream's length is the range's.
func identity(b *Body, id segid.ID, want Want) {
	b.coding = compress.Identity
	if b.kind != BodyStream {
		return
	}
	b.size = want.N
	if b.streamed && !b.verified && want.Off == 0 && want.N == want.Size {
		v := newVerifyReader(b.src, id, want.Size, nil)
		b.r, b.closer, b.verified = v, v, true
	}
}

// openVariant is OpenBody's variant step. retry is the preferred coding
// when its variant could not be built because the identity bytes were
// not at hand (Identity otherwise).
func (c *Cached) openVariant(ctx context.Context, id segid.ID, want Want) (b *Body, retry compress.Coding) {
	pref := want.Codings[0]
	v, _, st := c.variant(id, pref)
	if st == variantBuilding && want.Wait && c.waitVariant(ctx, id, pref) {
		v, _, st = c.variant(id, pref)
	}
	if v != nil && (st == variantReady || st == variantFollowing) {
		bindContext(ctx, v)
		v.coding = pref
		return v, compress.Identity
	}
	if v != nil {
		v.Close()
	}
	for _, alt := range want.Codings[1:] {
		if b := c.heldVariant(ctx, id, alt); b != nil {
			return b, compress.Identity
		}
	}
	if st == variantUnavailable {
		return nil, pref
	}
	return nil, compress.Identity
}

// variantAfterRead asks again for a variant that was unavailable before
// the identity bytes were opened: the open put them in memory, or started
// the disk tier's fill, so the build starts now rather than on the next
// request. The variant is returned when it can be sent now (a large
// segment's, encoded as its fill lands, or a small one's whose build
// ended within the wait).
func (c *Cached) variantAfterRead(ctx context.Context, id segid.ID, coding compress.Coding, wait bool) *Body {
	v, _, st := c.variant(id, coding)
	if st == variantBuilding && wait && c.waitVariant(ctx, id, coding) { // the build it started
		v, _, st = c.variant(id, coding)
	}
	switch {
	case v != nil && (st == variantFollowing || st == variantReady):
		bindContext(ctx, v)
		v.coding = coding
		return v
	case v != nil:
		v.Close()
	}
	return nil
}

// heldVariant is the complete coding variant of id when a tier
// holds it now; it starts no build.
func (c *Cached) heldVariant(ctx context.Context, id segid.ID, coding compress.Coding) *Body {
	if !buildable(coding) {
		return nil
	}
	if c.opts.MaxBytes > 0 {
		if v, ok := c.blobs.get(variantKey(id, coding)); ok {
			c.byteHits.Add(1)
			b := memoryBody(v, TierMemory)
			b.coding = coding
			return b
		}
	}
	d := c.opts.Disk
	if d == nil {
		return nil
	}
	size, ok := c.records.size(id.String())
	if !ok {
		return nil
	}
	h := d.HeldVariant(id, size, coding)
	if h == nil {
		return nil
	}
	b, err := diskBody(ctx, h, TierDisk, 0, -1, nil)
	if err != nil {
		h.Close()
		return nil
	}
	c.diskReads.Add(1)
	b.coding = coding
	return b
}

// Coding is the coding a GET accepting codings (preferred first) would
// be answered with now, and that variant's length (-1 for one still
// being encoded; 0 for Identity), for HEAD and 304 answers: the first of codings whose variant is held
// now (the preferred one also while it is encoded from a fill), with the
// variant's length; Identity when none is. Nothing is read, counted or
// built.
func (c *Cached) Coding(id segid.ID, codings []compress.Coding) (compress.Coding, int64) {
	for i, k := range codings {
		if !buildable(k) {
			continue
		}
		if c.opts.MaxBytes > 0 {
			if v, ok := c.blobs.peek(variantKey(id, k)); ok {
				return k, int64(len(v))
			}
		}
		if d := c.opts.Disk; d != nil {
			if size, ok := c.records.size(id.String()); ok {
				if n, ok := d.VariantSize(id, size, k, i == 0); ok {
					return k, n
				}
			}
		}
	}
	return compress.Identity, 0
}

// buildable reports the codings that have variants.
func buildable(c compress.Coding) bool { return c == compress.Gzip || c == compress.Zstd }

// Interface guards
var _ io.ReadCloser = (*Body)(nil)
