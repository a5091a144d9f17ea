package caddymodule

import (
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Sending a complete file of the disk tier with sendfile(2) through
// Caddy's response writers.
//
// (*net.TCPConn).ReadFrom sends with sendfile(2) only a source that is a
// syscall.Conn (an *os.File), bare or inside one *io.LimitedReader whose
// N is the count. Caddy's IdleTimeoutWriter (installed on every request
// while the server's write_idle_timeout is on, as it is by default) hands
// every ReadFrom source on as io.LimitReader(src, max_write_chunk), one
// chunk per call: the disk tier's *io.LimitedReader over the file then
// arrives as a LimitedReader of a LimitedReader, which is no syscall.Conn,
// and the bytes go through a 32 KiB read/write copy.
//
// fileRange is the source that wrapping suits: it is a syscall.Conn
// itself, and it ends where the range ends. sendfile(2) sends from the
// descriptor's offset up to the count it is given, here the writer's
// chunk, so fileRange offers its descriptor only when that count cannot
// pass the range's end: while at least one chunk of the range is left, or
// when the range ends at the end of the file (sendfile stops there), or
// always when the range is one chunk (below). Otherwise the rest of a
// range that stops short of the file's end, less than one chunk, is read
// and written. The bytes were verified when the file was
// filled; nothing here reads them twice or skips a check.
//
// One chunk per answer, the idle timeout kept by progress. The writer's
// chunk exists only so that its write_idle deadline, set before each
// chunk, bounds a stall rather than the whole transfer. Cutting a 64 MiB
// answer into 64 KiB chunks costs about a thousand sendfile calls and as
// many deadline resets and scheduler round trips; in one call the kernel
// takes the range in as few sendfile calls as the socket buffer allows
// (each returns when the buffer is full), as nginx does. So for the
// duration of one such answer the writer's chunk is the whole range
// (IdleTimeoutWriter.MaxChunk, per request, put back afterwards), and a
// progressDeadline keeps the idle timeout's meaning instead: every eighth
// of the timeout it reads the descriptor's offset, which sendfile(2)
// moves as the socket takes bytes, and while it moved it pushes the write
// deadline to now plus the timeout. A reader that stops is cut between
// one timeout and one and an eighth after the last bytes it took; one
// that keeps taking bytes, however slowly, is not. Only when the writer's
// deadline is a plain idle timeout on a connection that checks it at the
// next write (HTTP/1 and HTTP/3): with a minimum rate (write_min_rate)
// or on HTTP/2 (whose deadline is a timer that resets the stream) the
// writer's own chunks are kept.

// errNoSendfile declines sendfile for the next chunk: net falls back to a
// copy through fileRange.Read.
var errNoSendfile = errors.New("sendfile: the next chunk could pass the range's end")

// fileRange reads [pos, end) of a complete disk tier file through its own
// descriptor (the disk tier opens one per reader, so the offset is this
// answer's alone).
type fileRange struct {
	f        *os.File
	pos, end int64 // the descriptor's offset, the range's end
	// chunk is the most one call of the connection's ReadFrom may ask
	// sendfile for (the idle timeout writer's chunk); 0 when not known.
	chunk int64
	toEOF bool // the range ends at the end of the file
	// whole: the writer's one chunk is the whole range, so what it asks
	// of sendfile never passes the range's end (net/http's first 512
	// bytes, read through Read, shorten the chunk and the range alike).
	whole bool
	sent  int64 // bytes that went with sendfile
	err   error // the offset could not be read back: sticky
	raw   syscall.RawConn
	conn  rangeConn
}

// newFileRange is a fileRange of the next n bytes of f, for a connection
// whose ReadFrom source is chunked by chunk bytes (0: unknown). nil when
// the file's offset or size cannot be read.
func newFileRange(f *os.File, n, chunk int64) *fileRange {
	pos, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || pos+n > fi.Size() {
		return nil
	}
	r := &fileRange{f: f, pos: pos, end: pos + n, chunk: chunk, toEOF: pos+n == fi.Size()}
	r.conn.r = r
	return r
}

func (r *fileRange) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	left := r.end - r.pos
	if left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := r.f.Read(p)
	r.pos += int64(n)
	if err == io.EOF && r.pos < r.end {
		err = io.ErrUnexpectedEOF // the file is shorter than it was at open
	}
	return n, err
}

// SyscallConn offers the descriptor to sendfile when the next chunk
// cannot pass the range's end.
func (r *fileRange) SyscallConn() (syscall.RawConn, error) {
	left := r.end - r.pos
	if r.err != nil || left <= 0 || !(r.toEOF || r.whole || (r.chunk > 0 && left >= r.chunk)) {
		return nil, errNoSendfile
	}
	if r.raw == nil {
		raw, err := r.f.SyscallConn()
		if err != nil {
			return nil, err
		}
		r.raw = raw
	}
	return &r.conn, nil
}

// rangeConn is the file's syscall.RawConn that reads the descriptor's
// offset back after sendfile(2) moved it.
type rangeConn struct{ r *fileRange }

func (c *rangeConn) Read(fn func(fd uintptr) bool) error {
	r := c.r
	err := r.raw.Read(fn)
	pos, serr := r.f.Seek(0, io.SeekCurrent)
	switch {
	case serr != nil:
		r.err = serr
	case pos > r.end: // cannot happen with the checks above; never end cleanly
		r.err = errors.New("sendfile: passed the range's end")
	default:
		r.sent += pos - r.pos
		r.pos = pos
	}
	return err
}

func (c *rangeConn) Control(fn func(fd uintptr)) error    { return c.r.raw.Control(fn) }
func (c *rangeConn) Write(fn func(fd uintptr) bool) error { return c.r.raw.Write(fn) }

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
// on a connection whose deadline is checked at the next write only.
func wholeRangeOK(iw *caddyhttp.IdleTimeoutWriter) bool {
	return iw.Ctrl != nil && iw.Deadline.Timeout > 0 && iw.Deadline.MinRate == 0 && !iw.ClearBetweenWrites
}

// sendfileSource returns the reader that takes the next n bytes of f, a
// complete disk tier file positioned at the range's start, to w with
// sendfile(2), and the func to call once the copy has ended. Under an
// idle timeout writer it is a fileRange (sent as one chunk under a
// progressDeadline when wholeRangeOK); with no such writer an
// *io.LimitedReader over f, the shape net's sendfile path takes.
func sendfileSource(w io.Writer, f *os.File, n int64) (io.Reader, func()) {
	lr := &io.LimitedReader{R: f, N: n}
	iws := idleWriters(w)
	if len(iws) == 0 {
		return lr, noop
	}
	if len(iws) == 1 && wholeRangeOK(iws[0]) && n > 0 && n <= math.MaxInt {
		iw := iws[0]
		fr := newFileRange(f, n, n)
		if fr == nil {
			return lr, noop
		}
		fr.whole = true
		pd := startProgressDeadline(f, fr.pos, iw.Deadline.Timeout, iw.Deadline.HardDeadline, iw.Ctrl.SetWriteDeadline, time.Now)
		var src io.Reader = fr
		var raw *fileRange
		// Raw sendfile(2) calls (sendfile_raw_linux.go): below the idle
		// timeout writer, the source reaches the connection bare.
		if rawSendfileOK && rawSendfileOn() && iw.ResponseWriterWrapper != nil { // rawSendfileOn: switches.go
			src, raw = rawRange{fr}, fr
		}
		restore := oneChunk(iw, n, raw)
		return src, func() {
			pd.stop()
			restore()
		}
	}
	chunk, _ := writeChunk(w)
	if fr := newFileRange(f, lr.N, chunk); fr != nil {
		return fr, noop
	}
	return lr, noop
}

func noop() {}

// oneChunk makes iw hand the next ReadFrom source on as one chunk of n
// bytes, and, when raw is set, pass rawRange{raw} on bare to the writer
// below it (rangeUnlimiter); restore puts iw back as it was. It is the
// one place that reaches into Caddy's IdleTimeoutWriter (Caddy 2.11: its
// exported MaxChunk, read by each ReadFrom, and the ResponseWriterWrapper
// its ReadFrom writes through). No documented interface of the writer
// chain reaches below that writer without also passing by the writers
// above it (the access log's byte count): encode's io.ReaderFrom
// forwarding keeps sendfile only down to it. A Caddy that changes
// either field's meaning makes the answer go in chunks or through a copy:
// TestOneChunk fails on the first, and integration's TestSendfileDiskTier
// counts the sendfile(2) calls per answer through the real binary and
// fails on either.
func oneChunk(iw *caddyhttp.IdleTimeoutWriter, n int64, raw *fileRange) (restore func()) {
	chunk, inner := iw.MaxChunk, iw.ResponseWriterWrapper
	iw.MaxChunk = int(n)
	if raw != nil {
		iw.ResponseWriterWrapper = &caddyhttp.ResponseWriterWrapper{ResponseWriter: &rangeUnlimiter{ResponseWriter: inner, src: rawRange{raw}}}
	}
	return func() { iw.MaxChunk, iw.ResponseWriterWrapper = chunk, inner }
}

// progressDeadline pushes a connection's write deadline on while a file
// descriptor's offset moves (see the top of this file).
type progressDeadline struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	f       *os.File
	last    int64 // the offset at the last check
	timeout time.Duration
	hard    time.Time // the writer's hard deadline (write_timeout); zero: none
	set     func(time.Time) error
	now     func() time.Time
}

// minProgressPeriod bounds how often a progressDeadline checks, for
// idle timeouts of a few milliseconds.
const minProgressPeriod = 10 * time.Millisecond

// progressPeriod is how often a progressDeadline checks the offset.
func progressPeriod(timeout time.Duration) time.Duration {
	return max(timeout/8, minProgressPeriod)
}

// startProgressDeadline checks f's offset (pos now) every
// progressPeriod(timeout) and, when it moved, sets the write deadline
// with set to now+timeout, never past hard.
func startProgressDeadline(f *os.File, pos int64, timeout time.Duration, hard time.Time, set func(time.Time) error, now func() time.Time) *progressDeadline {
	p := &progressDeadline{f: f, last: pos, timeout: timeout, hard: hard, set: set, now: now}
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
	if pos, err := p.f.Seek(0, io.SeekCurrent); err == nil && pos != p.last {
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

// unwrapper is a response writer that wraps another (Caddy's, and
// net/http's ResponseController's convention).
type unwrapper interface{ Unwrap() http.ResponseWriter }

// Interface guards
var (
	_ syscall.Conn    = (*fileRange)(nil)
	_ syscall.RawConn = (*rangeConn)(nil)
)

// copyRest writes the rest of r to dst with read and write calls: a
// rawRange's way when dst is not a socket (TLS, a wrapped connection).
// The range is hidden behind a plain Reader, so nothing below offers its
// descriptor to another sendfile path.
func copyRest(dst io.Writer, r *fileRange) (int64, error) {
	return io.Copy(dst, struct{ io.Reader }{r})
}

// rangeUnlimiter stands below an idle timeout writer for one whole-range
// answer. The writer hands its ReadFrom sources on as
// io.LimitReader(src, chunk); for the answer's own rawRange (the chunk
// being the whole range) it passes the rawRange on bare, so that the
// connection's ReadFrom offers the socket to rawRange.WriteTo, and
// accounts what was sent in the writer's LimitedReader. The byte counts
// above and below are the same as for any ReadFrom.
type rangeUnlimiter struct {
	http.ResponseWriter // the idle timeout writer's own inner writer
	src                 rawRange
}

func (u *rangeUnlimiter) ReadFrom(r io.Reader) (int64, error) {
	lr, ok := r.(*io.LimitedReader)
	if !ok || lr.R != io.Reader(u.src) || lr.N < u.src.r.end-u.src.r.pos {
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
