package store

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/syncular/caddy-syncular/compress"
)

// The bytes of one answer. A request asks for them once (Cached.OpenBody,
// or Direct for a store without the cache) with what it accepts (Want):
// the cache picks the representation (a content-coded variant it holds,
// or the identity bytes of the range), schedules the variant builds its
// policy calls for, and hands back one Body that knows its coding, its
// length and the tier it came from, and that writes itself: one Write for
// bytes held in memory, sendfile(2) for a complete file of the disk tier,
// a verified copy otherwise. A Body never ends cleanly with bytes that do
// not match their id: its error then matches ErrCorruptSegment.

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
	// SendFile, when set, is how WriteTo writes a complete disk file: lr
	// is an *io.LimitedReader over the *os.File positioned at the range's
	// start, N its length (the Caddy handler sends it through its
	// response writers to sendfile(2)). nil: io.Copy(w, lr), which
	// reaches sendfile on a bare connection.
	SendFile func(w io.Writer, lr *io.LimitedReader) (int64, error)
}

// Server hands out the bodies of answers and says, without I/O, which
// coding a GET would get now. Cached is one; Direct makes one of any
// Store.
type Server interface {
	// OpenBody opens the body that answers want. The caller closes it.
	OpenBody(ctx context.Context, segmentID string, want Want) (*Body, error)
	// Coding is the coding a GET accepting codings (preferred first)
	// would be answered with now, and that variant's length (-1 for one
	// still being encoded; 0 for Identity). It has no side effect: no
	// I/O, no counter, no build (HEAD and 304 answers).
	Coding(segmentID string, codings []compress.Coding) (compress.Coding, int64)
}

// bodyKind is how a Body writes itself.
type bodyKind uint8

const (
	bodyMemory bodyKind = iota // b.mem: one Write
	bodyFile                   // b.file: a complete disk file, sendfile
	bodyStream                 // b.r: a verified copy
)

// Body is the bytes of one answer. Not safe for concurrent use.
type Body struct {
	kind     bodyKind
	coding   compress.Coding
	size     int64 // bytes the body holds; -1: a variant still being encoded
	tier     Tier
	streamed bool // read from the inner store as it is written

	mem  []byte            // bodyMemory: the unread bytes (the cache's: never modified)
	file *io.LimitedReader // bodyFile
	r    io.Reader         // bodyFile, bodyStream: the verified reader

	closer io.Closer
	also   io.Closer                                              // closed with the body (the identity read a variant follows)
	send   func(w io.Writer, lr *io.LimitedReader) (int64, error) // Want.SendFile
}

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

// Read reads the body, verified like WriteTo.
func (b *Body) Read(p []byte) (int, error) {
	if b.kind == bodyMemory {
		if len(b.mem) == 0 {
			return 0, io.EOF
		}
		n := copy(p, b.mem)
		b.mem = b.mem[n:]
		return n, nil
	}
	return b.r.Read(p)
}

// WriteTo writes the body to w: bytes in memory in one Write, a complete
// disk file by Want.SendFile when set (else io.Copy, which reaches
// sendfile(2) on a bare connection), anything else by a copy that
// fails, rather than end, when the bytes do not verify. A body that ends
// short of its Size is io.ErrUnexpectedEOF; errors from the tiers match
// ErrCorruptSegment when the bytes do not match their id.
func (b *Body) WriteTo(w io.Writer) (int64, error) {
	switch b.kind {
	case bodyMemory:
		k, err := w.Write(b.mem)
		b.mem = b.mem[k:]
		return int64(k), err
	case bodyFile:
		if b.file.N == b.size {
			var k int64
			var err error
			if b.send != nil {
				k, err = b.send(w, b.file)
			} else {
				k, err = io.Copy(w, b.file) // not CopyN: its LimitedReader would hide the file
			}
			if err == nil && k != b.size {
				err = io.ErrUnexpectedEOF
			}
			return k, corruptErr(err)
		}
	}
	return copyPooled(w, b.r, b.size)
}

// copier is the state of one copyPooled, pooled whole so that a copy
// allocates nothing.
type copier struct {
	buf []byte
	w   writerOnly
	lr  io.LimitedReader
}

// writerOnly hides a writer's ReadFrom.
type writerOnly struct{ io.Writer }

var copiers = sync.Pool{New: func() any { return &copier{buf: make([]byte, copyBufSize)} }}

// copyBufSize is copyPooled's buffer.
const copyBufSize = 32 << 10

// copyPooled writes n bytes of r to w (n < 0: to r's end) through a
// pooled buffer, in Writes. Not io.Copy to w's ReadFrom: Caddy's idle
// timeout writer hands each chunk on as an io.LimitedReader, and the
// connection's generic ReadFrom then allocates a 32 KiB buffer per chunk
// (for a body that is not a file: a file goes by sendfile). Fewer than n
// bytes is io.ErrUnexpectedEOF.
func copyPooled(w io.Writer, r io.Reader, n int64) (int64, error) {
	c := copiers.Get().(*copier)
	defer func() {
		c.w.Writer, c.lr.R = nil, nil
		copiers.Put(c)
	}()
	c.w.Writer = w
	var src io.Reader = r
	if n >= 0 {
		c.lr = io.LimitedReader{R: r, N: n}
		src = &c.lr
	}
	k, err := io.CopyBuffer(&c.w, src, c.buf)
	if err == nil && n >= 0 && k < n {
		err = io.ErrUnexpectedEOF
	}
	return k, err
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

// identityBody makes the Body of an identity read of segmentID from tier
// t that is not in memory: a file of the disk tier (sendfile when it is
// complete), or a stream, verified when it is the whole segment.
func identityBody(rc io.ReadCloser, t Tier, segmentID string, want Want) *Body {
	b := &Body{coding: compress.Identity, size: want.N, tier: t}
	switch r := rc.(type) {
	case *diskBody:
		b.kind, b.r, b.closer = bodyStream, r, r
		if lr, ok := r.r.(*io.LimitedReader); ok {
			if _, ok := lr.R.(*os.File); ok {
				b.kind, b.file, b.size = bodyFile, lr, lr.N
			}
		}
		return b
	}
	if _, ok := rc.(*verifyReader); !ok && want.Off == 0 && want.N == want.Size {
		rc = newVerifyReader(rc, segmentID, want.Size, nil) // not twice
	}
	b.kind, b.r, b.closer, b.streamed = bodyStream, rc, rc, true
	return b
}

// variantBody makes the Body of a variant the cache holds (a memory or
// disk tier body) of the coding, size bytes (-1: still being encoded).
func variantBody(rc io.ReadCloser, coding compress.Coding, size int64) *Body {
	b := &Body{coding: coding, size: size}
	switch r := rc.(type) {
	case *memBody:
		b.kind, b.mem, b.tier = bodyMemory, r.b, TierMemory
	case *diskBody:
		b.kind, b.r, b.closer, b.tier = bodyStream, r, r, TierDisk
		if r.h.Growing() {
			b.tier = TierDiskFollow // a variant encoded as its segment is filled
		} else if lr, ok := r.r.(*io.LimitedReader); ok && lr.N == size {
			if _, ok := lr.R.(*os.File); ok {
				b.kind, b.file = bodyFile, lr
			}
		}
	default:
		b.kind, b.r, b.closer = bodyStream, rc, rc
	}
	return b
}

// OpenBody implements Server: the variant of the first of want.Codings
// when it is held (or being encoded from a fill, or its build under way
// ends within the wait), else the variant of another acceptable coding
// that is held, else the identity bytes of the range through the tiers
// (Open). A variant missing because its identity bytes were not at hand
// has its build started as soon as the identity read put them there, and
// the answer follows that variant when it can be sent now.
func (c *Cached) OpenBody(ctx context.Context, segmentID string, want Want) (*Body, error) {
	b, err := c.openBody(ctx, segmentID, want)
	if b != nil {
		b.send = want.SendFile
	}
	return b, err
}

func (c *Cached) openBody(ctx context.Context, segmentID string, want Want) (*Body, error) {
	retry := compress.Identity
	if len(want.Codings) > 0 {
		var b *Body
		if b, retry = c.openVariant(ctx, segmentID, want); b != nil {
			return b, nil
		}
	}
	mem, rc, t, err := c.read(ctx, segmentID, want.Off, want.N)
	if err != nil {
		return nil, err
	}
	var b *Body
	if rc == nil {
		b = &Body{kind: bodyMemory, coding: compress.Identity, size: int64(len(mem)), tier: t, mem: mem}
	} else {
		b = identityBody(rc, t, segmentID, want)
	}
	if retry != compress.Identity {
		if v := c.variantAfterRead(ctx, segmentID, retry, want.Wait); v != nil {
			v.tier = t // this request's read started what the variant follows
			v.also = b
			return v, nil
		}
	}
	return b, nil
}

// openVariant is OpenBody's variant step. retry is the preferred coding
// when its variant could not be built because the identity bytes were
// not at hand (Identity otherwise).
func (c *Cached) openVariant(ctx context.Context, segmentID string, want Want) (b *Body, retry compress.Coding) {
	pref := want.Codings[0]
	rc, size, st := c.variant(segmentID, pref)
	if st == variantBuilding && want.Wait && c.waitVariant(ctx, segmentID, pref) {
		rc, size, st = c.variant(segmentID, pref)
	}
	if rc != nil && (st == variantReady || st == variantFollowing) {
		bindContext(ctx, rc)
		return variantBody(rc, pref, size), compress.Identity
	}
	if rc != nil {
		rc.Close()
	}
	for _, alt := range want.Codings[1:] {
		if b := c.heldVariant(ctx, segmentID, alt); b != nil {
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
func (c *Cached) variantAfterRead(ctx context.Context, segmentID string, coding compress.Coding, wait bool) *Body {
	rc, size, st := c.variant(segmentID, coding)
	if st == variantBuilding && wait && c.waitVariant(ctx, segmentID, coding) { // the build it started
		rc, size, st = c.variant(segmentID, coding)
	}
	switch {
	case rc != nil && (st == variantFollowing || st == variantReady):
		bindContext(ctx, rc)
		return variantBody(rc, coding, size)
	case rc != nil:
		rc.Close()
	}
	return nil
}

// heldVariant is the complete coding variant of segmentID when a tier
// holds it now; it starts no build.
func (c *Cached) heldVariant(ctx context.Context, segmentID string, coding compress.Coding) *Body {
	if !buildable(coding) {
		return nil
	}
	if c.opts.MaxBytes > 0 {
		if v, ok := c.blobs.get(variantKey(segmentID, coding)); ok {
			c.byteHits.Add(1)
			return &Body{kind: bodyMemory, coding: coding, size: int64(len(v)), tier: TierMemory, mem: v}
		}
	}
	d := c.opts.Disk
	if d == nil {
		return nil
	}
	size, ok := c.records.size(segmentID)
	if !ok {
		return nil
	}
	h := d.HeldVariant(segmentID, size, coding)
	if h == nil {
		return nil
	}
	r, err := h.Reader(ctx, 0, -1)
	if err != nil {
		h.Close()
		return nil
	}
	c.diskReads.Add(1)
	return variantBody(&diskBody{h: h, r: r}, coding, h.Size())
}

// Coding implements Server: the first of codings whose variant is held
// now (the preferred one also while it is encoded from a fill), with the
// variant's length; Identity when none is. Nothing is read, counted or
// built.
func (c *Cached) Coding(segmentID string, codings []compress.Coding) (compress.Coding, int64) {
	for i, k := range codings {
		if !buildable(k) {
			continue
		}
		if c.opts.MaxBytes > 0 {
			if v, ok := c.blobs.peek(variantKey(segmentID, k)); ok {
				return k, int64(len(v))
			}
		}
		if d := c.opts.Disk; d != nil {
			if size, ok := c.records.size(segmentID); ok {
				if n, ok := d.VariantSize(segmentID, size, k, i == 0); ok {
					return k, n
				}
			}
		}
	}
	return compress.Identity, 0
}

// buildable reports the codings that have variants.
func buildable(c compress.Coding) bool { return c == compress.Gzip || c == compress.Zstd }

// Direct is the Server of a store without the cache: the identity bytes
// of the range, streamed and verified when whole; no variants.
func Direct(st Store) Server { return direct{st} }

type direct struct{ st Store }

func (d direct) OpenBody(ctx context.Context, segmentID string, want Want) (*Body, error) {
	if want.Off < 0 {
		return nil, errors.New("store: open: negative offset")
	}
	rc, err := d.st.Open(ctx, segmentID, want.Off, want.N)
	if err != nil {
		return nil, err
	}
	b := identityBody(rc, TierStore, segmentID, want)
	b.send = want.SendFile
	return b, nil
}

func (direct) Coding(string, []compress.Coding) (compress.Coding, int64) {
	return compress.Identity, 0
}

// Interface guards
var (
	_ Server      = (*Cached)(nil)
	_ Server      = direct{}
	_ io.Reader   = (*Body)(nil)
	_ io.WriterTo = (*Body)(nil)
)

// ServerOf is st's Server: st itself when it is one (Cached), else Direct.
func ServerOf(st Store) Server {
	if s, ok := st.(Server); ok {
		return s
	}
	return Direct(st)
}
