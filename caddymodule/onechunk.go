package caddymodule

import (
	"io"
	"math"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// One answer as one chunk of Caddy's idle timeout writer, shared by the
// disk tier's whole ranges (sendfile.go) and the memory tier's bytes
// (membody.go).
//
// Caddy's IdleTimeoutWriter cuts every Write and ReadFrom into chunks
// (64 KiB by default) and sets the connection's write deadline before
// each, so that its write_idle timeout bounds a stall, not the whole
// transfer. For an answer whose bytes are all at hand that costs a system
// call, a deadline reset and a scheduler round trip per chunk. So, when
// the writer's deadline is a plain idle timeout checked at the next
// write (wholeRangeOK), the answer goes as one chunk (chunkSwap) and the
// idle timeout keeps its meaning another way: a progressDeadline pushes
// the write deadline on while the answer's bytes keep moving. A reader
// that stops is cut between one timeout and one and an eighth after the
// last bytes it took; one that keeps taking bytes, however slowly, is
// not (docs/performance.md, "One sendfile chunk per answer" and
// "Memory-tier hits as one chunk").

// idleWriters walks the response writers from w down (Unwrap) and
// returns the idle timeout writers among them, outermost first.
func idleWriters(w any) []*caddyhttp.IdleTimeoutWriter {
	var out []*caddyhttp.IdleTimeoutWriter
	for range 64 { // bounded: a writer that unwraps to itself must not hang a request
		if iw, ok := w.(*caddyhttp.IdleTimeoutWriter); ok {
			out = append(out, iw)
		}
		u, ok := w.(unwrapper)
		if !ok {
			break
		}
		if w = u.Unwrap(); w == nil {
			break
		}
	}
	return out
}

// soleIdleWriter is the idle timeout writer below w when there is
// exactly one, else nil; unlike idleWriters it allocates nothing.
func soleIdleWriter(w any) *caddyhttp.IdleTimeoutWriter {
	var found *caddyhttp.IdleTimeoutWriter
	for range 64 {
		if iw, ok := w.(*caddyhttp.IdleTimeoutWriter); ok {
			if found != nil {
				return nil
			}
			found = iw
		}
		u, ok := w.(unwrapper)
		if !ok {
			break
		}
		if w = u.Unwrap(); w == nil {
			break
		}
	}
	return found
}

// writeChunk returns the largest chunk an idle timeout writer below w
// cuts ReadFrom sources into; found is false when there is none.
func writeChunk(w any) (chunk int64, found bool) {
	for _, iw := range idleWriters(w) {
		chunk, found = max(chunk, chunkOf(iw)), true
	}
	return chunk, found
}

func chunkOf(iw *caddyhttp.IdleTimeoutWriter) int64 {
	if iw.MaxChunk > 0 {
		return int64(iw.MaxChunk)
	}
	return caddyhttp.DefaultMaxWriteChunk
}

// wholeRangeOK reports whether the answer may go to iw as one chunk with
// a progressDeadline in place of the chunks' deadlines: a plain idle
// timeout (no minimum rate, which counts bytes the writer alone knows),
// on a connection whose deadline is checked at the next write only
// (HTTP/1 and HTTP/3; HTTP/2's deadline is a timer that resets the
// stream, and its writer clears it between writes).
func wholeRangeOK(iw *caddyhttp.IdleTimeoutWriter) bool {
	return iw.Ctrl != nil && iw.Deadline.Timeout > 0 && iw.Deadline.MinRate == 0 && !iw.ClearBetweenWrites
}

// wholeSource is an answer's whole body as a ReadFrom source that writes
// itself to the connection (an io.WriterTo that is no syscall.Conn):
// rawRange and *rawBytes.
type wholeSource interface {
	io.Reader
	io.WriterTo
	// left is the bytes not yet read or written.
	left() int64
}

// chunkSwap is what oneChunk changes on an idle timeout writer, kept to
// put it back, and the two writers it puts in place (held here so that a
// pooled chunkSwap allocates them once).
type chunkSwap struct {
	iw    *caddyhttp.IdleTimeoutWriter
	inner *caddyhttp.ResponseWriterWrapper
	undo  func() // IdleTimeoutWriter.Override's restore
	wrap  caddyhttp.ResponseWriterWrapper
	unl   rangeUnlimiter
}

// oneChunk makes iw hand the next ReadFrom source on as one chunk of n
// bytes, and, when bare is set, pass bare on unwrapped to the writer
// below it (rangeUnlimiter), so that the connection's ReadFrom reaches
// bare.WriteTo; c.restore puts iw back as it was. It is the one place
// that reaches into Caddy's IdleTimeoutWriter (Caddy 2.11): the chunk
// goes through its documented Override (the same timeout and minimum
// rate, maxChunk n), and bare through the ResponseWriterWrapper its
// ReadFrom writes through, an exported field whose use is not
// documented. No documented interface of the writer chain reaches below
// that writer without also passing by the writers above it (the access
// log's byte count): encode's io.ReaderFrom forwarding keeps sendfile
// only down to it. A Caddy that changes either makes the answer go in
// chunks or through a copy: TestOneChunk fails on both, and
// integration's TestSendfileDiskTier and TestMemoryHitWrites count the
// system calls per answer through the real binary.
func (c *chunkSwap) oneChunk(iw *caddyhttp.IdleTimeoutWriter, n int64, bare wholeSource) {
	c.iw, c.inner = iw, iw.ResponseWriterWrapper
	chunk := int(n)
	if bare != nil && chunk < math.MaxInt {
		// One more than the answer: the writer's ReadFrom ends after the
		// call that sends it all, with no second, empty one. Only for a
		// bare source, which the writer's io.LimitedReader never limits.
		chunk++
	}
	c.undo = iw.Override(iw.Deadline.Timeout, iw.Deadline.MinRate, chunk)
	if bare != nil {
		c.unl = rangeUnlimiter{ResponseWriter: c.inner, src: bare}
		c.wrap = caddyhttp.ResponseWriterWrapper{ResponseWriter: &c.unl}
		iw.ResponseWriterWrapper = &c.wrap
	}
}

// restore puts back what oneChunk changed, and lets go of the writers.
func (c *chunkSwap) restore() {
	if c.iw == nil {
		return
	}
	c.iw.ResponseWriterWrapper = c.inner
	c.undo()
	*c = chunkSwap{}
}

// oneChunk is chunkSwap.oneChunk for an answer of its own (the disk
// tier's): the returned func puts iw back.
func oneChunk(iw *caddyhttp.IdleTimeoutWriter, n int64, bare wholeSource) (restore func()) {
	c := new(chunkSwap)
	c.oneChunk(iw, n, bare)
	return c.restore
}

// rangeUnlimiter stands below an idle timeout writer for one whole
// answer. The writer hands its ReadFrom sources on as
// io.LimitReader(src, chunk); for the answer's own source (the chunk
// being the whole answer) it passes the source on bare, so that the
// connection's ReadFrom offers the socket to its WriteTo, and accounts
// what was sent in the writer's LimitedReader. The byte counts above and
// below are the same as for any ReadFrom.
type rangeUnlimiter struct {
	http.ResponseWriter // the idle timeout writer's own inner writer
	src                 wholeSource
}

func (u *rangeUnlimiter) ReadFrom(r io.Reader) (int64, error) {
	lr, ok := r.(*io.LimitedReader)
	if !ok || lr.R != io.Reader(u.src) || lr.N < u.src.left() {
		return readFrom(u.ResponseWriter, r)
	}
	n, err := readFrom(u.ResponseWriter, u.src)
	lr.N -= n
	return n, err
}

// Unwrap lets http.ResponseController reach the writers below.
func (u *rangeUnlimiter) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// readFrom is w.ReadFrom when w has one, else io.Copy.
func readFrom(w io.Writer, r io.Reader) (int64, error) {
	if rf, ok := w.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(w, r)
}

// unwrapper is a response writer that wraps another (Caddy's, and
// net/http's ResponseController's convention).
type unwrapper interface{ Unwrap() http.ResponseWriter }

// progressSource is where a progressDeadline reads how far an answer
// got: a count that grows as the connection takes its bytes.
type progressSource interface{ progress() (int64, error) }

// fileOffset is a file descriptor's offset, which sendfile(2) moves as
// the socket takes bytes.
type fileOffset struct{ f *os.File }

func (o fileOffset) progress() (int64, error) { return o.f.Seek(0, io.SeekCurrent) }

// progressDeadline pushes a connection's write deadline on while an
// answer's progress moves (see the top of this file).
type progressDeadline struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	src     progressSource
	last    int64 // the progress at the last check
	timeout time.Duration
	hard    time.Time // the writer's hard deadline (write_timeout); zero: none
	set     func(time.Time) error
	now     func() time.Time
}

// minProgressPeriod bounds how often a progressDeadline checks, for
// idle timeouts of a few milliseconds.
const minProgressPeriod = 10 * time.Millisecond

// progressPeriod is how often a progressDeadline checks the progress.
func progressPeriod(timeout time.Duration) time.Duration {
	return max(timeout/8, minProgressPeriod)
}

// startProgressDeadline checks src's progress (pos now) every
// progressPeriod(timeout) and, when it moved, sets the write deadline
// with set to now+timeout, never past hard.
func startProgressDeadline(src progressSource, pos int64, timeout time.Duration, hard time.Time, set func(time.Time) error, now func() time.Time) *progressDeadline {
	p := &progressDeadline{src: src, last: pos, timeout: timeout, hard: hard, set: set, now: now}
	p.mu.Lock()
	p.timer = time.AfterFunc(progressPeriod(timeout), p.check)
	p.mu.Unlock()
	return p
}

func (p *progressDeadline) check() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	if pos, err := p.src.progress(); err == nil && pos != p.last {
		p.last = pos
		_ = p.set(idleDeadline(p.now(), p.timeout, p.hard))
	}
	p.timer.Reset(progressPeriod(p.timeout))
}

// stop ends the checks; no deadline is set after it returns.
func (p *progressDeadline) stop() {
	p.mu.Lock()
	p.stopped = true
	p.timer.Stop()
	p.mu.Unlock()
}

// idleDeadline is now+timeout, or hard when that comes first.
func idleDeadline(now time.Time, timeout time.Duration, hard time.Time) time.Time {
	d := now.Add(timeout)
	if !hard.IsZero() && hard.Before(d) {
		return hard
	}
	return d
}
