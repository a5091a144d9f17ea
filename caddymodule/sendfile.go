package caddymodule

import (
	"errors"
	"io"
	"math"
	"os"
	"syscall"
	"time"
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
		pd := startProgressDeadline(fileOffset{f}, fr.pos, iw.Deadline.Timeout, iw.Deadline.HardDeadline, iw.Ctrl.SetWriteDeadline, time.Now)
		var src io.Reader = fr
		var bare wholeSource
		// Raw sendfile(2) calls (sendfile_raw_linux.go): below the idle
		// timeout writer, the source reaches the connection bare.
		if rawSendfileOK && rawSendfileOn() && iw.ResponseWriterWrapper != nil { // rawSendfileOn: switches.go
			src, bare = rawRange{fr}, rawRange{fr}
		}
		restore := oneChunk(iw, n, bare) // onechunk.go
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

// Interface guards
var (
	_ syscall.Conn    = (*fileRange)(nil)
	_ syscall.RawConn = (*rangeConn)(nil)
	_ wholeSource     = rawRange{}
)

// left is what the range has not yet read or sent (wholeSource).
func (s rawRange) left() int64 { return s.r.end - s.r.pos }

// copyRest writes the rest of r to dst with read and write calls: a
// rawRange's way when dst is not a socket (TLS, a wrapped connection).
// The range is hidden behind a plain Reader, so nothing below offers its
// descriptor to another sendfile path.
func copyRest(dst io.Writer, r *fileRange) (int64, error) {
	return io.Copy(dst, struct{ io.Reader }{r})
}
