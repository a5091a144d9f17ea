package caddymodule

import (
	"errors"
	"io"
	"net/http"
	"os"
	"syscall"

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
// when the range ends at the end of the file (sendfile stops there). The
// rest of a range that stops short of the file's end, less than one
// chunk, is read and written. The bytes were verified when the file was
// filled; nothing here reads them twice or skips a check.

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
	toEOF bool  // the range ends at the end of the file
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
	if r.err != nil || left <= 0 || !(r.toEOF || (r.chunk > 0 && left >= r.chunk)) {
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

// writeChunk walks the response writers from w down (Unwrap) and returns
// the largest chunk an idle timeout writer among them cuts ReadFrom
// sources into; found is false when there is none.
func writeChunk(w any) (chunk int64, found bool) {
	for range 64 { // bounded: a writer that unwraps to itself must not hang a request
		if iw, ok := w.(*caddyhttp.IdleTimeoutWriter); ok {
			c := int64(iw.MaxChunk)
			if c <= 0 {
				c = caddyhttp.DefaultMaxWriteChunk
			}
			chunk, found = max(chunk, c), true
		}
		u, ok := w.(unwrapper)
		if !ok {
			break
		}
		if w = u.Unwrap(); w == nil {
			break
		}
	}
	return chunk, found
}

// sendfileSource returns the reader that takes the bytes of lr, a
// complete disk tier file's reader (an *io.LimitedReader over an
// *os.File at the range's start, N its length), to w with sendfile(2).
// Under an idle timeout writer it is a fileRange; with no such writer
// (or not a file) lr itself, which reaches the connection as it is.
func sendfileSource(w io.Writer, lr *io.LimitedReader) io.Reader {
	f, ok := lr.R.(*os.File)
	if !ok {
		return lr
	}
	chunk, found := writeChunk(w)
	if !found {
		return lr
	}
	if fr := newFileRange(f, lr.N, chunk); fr != nil {
		return fr
	}
	return lr
}

// unwrapper is a response writer that wraps another (Caddy's, and
// net/http's ResponseController's convention).
type unwrapper interface{ Unwrap() http.ResponseWriter }

// Interface guards
var (
	_ syscall.Conn    = (*fileRange)(nil)
	_ syscall.RawConn = (*rangeConn)(nil)
)
