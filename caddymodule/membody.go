package caddymodule

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A memory tier answer as one chunk of Caddy's idle timeout writer, sent
// with raw write(2) calls (docs/performance.md, "Memory-tier hits as one
// chunk").
//
// Left to itself, the idle timeout writer cuts a memory answer's one
// Write into chunks (64 KiB by default) and resets the write deadline
// before each; each chunk is a write(2) through Go's net poller, whose
// system call path hands the processor around. For an answer larger than
// one chunk, when the writer's deadline is a plain idle timeout
// (wholeRangeOK), the bytes instead go as one chunk (chunkSwap, the way
// the disk tier's whole ranges do) through a rawBytes: a ReadFrom source
// that reaches the connection bare and writes itself to the socket with
// raw write(2) calls inside the socket's RawConn.Write, which waits for
// room (EAGAIN) in the netpoller under the connection's write deadline.
// net/http reads the first 512 bytes itself and sends them with the
// header in one write; the rest goes in as few writes as the socket
// buffer allows.
//
// The idle timeout keeps its meaning: the writer sets the deadline once,
// before the chunk; while the socket takes every byte at once (loopback,
// a fast client) nothing else is needed. At the first EAGAIN a
// progressDeadline starts, reading how many bytes the peer has taken
// (written, less what the socket still holds), and pushes the deadline
// on while that grows. A reader that stops is cut about one idle timeout
// after the last bytes it took; one that keeps taking bytes, however
// slowly, is not, even while it drains a send buffer of megabytes for
// longer than the timeout (where the writer's own chunks, each waiting
// for room, are cut).
//
// Everything else writes the bytes in one Write as before: a body of at
// most one chunk, no idle timeout writer or more than one, a minimum
// rate, HTTP/2, off Linux (rawWriteOK) or with SYNCULAR_RAW_WRITE=off
// (switches.go). A connection that is no socket (TLS, HTTP/3, a wrapped
// listener) gets the bytes in Writes of the writer's own chunk, the
// write deadline reset before each, as the writer would have done.

// sendMemory writes p, a memory tier body, to w.
func sendMemory(w http.ResponseWriter, p []byte) (int64, error) {
	if rawWriteOK && len(p) > 0 {
		iw := soleIdleWriter(w)
		if iw != nil && int64(len(p)) > chunkOf(iw) && wholeRangeOK(iw) && iw.ResponseWriterWrapper != nil && rawWriteOn() { // rawWriteOn: switches.go
			return sendRawBytes(w, iw, p)
		}
	}
	k, err := w.Write(p)
	return int64(k), err
}

// rawBytes is one memory tier answer on its way to the connection as one
// chunk (see the top of this file), pooled whole with its writers.
type rawBytes struct {
	b    []byte
	pos  int          // the next byte to read or write
	sent atomic.Int64 // bytes the socket took from WriteTo: the progress
	// The idle timeout writer's settings, for the progressDeadline and
	// for Writes to a connection that is no socket.
	chunk   int
	timeout time.Duration
	hard    time.Time
	ctrl    *http.ResponseController
	pd      *progressDeadline // started at the first EAGAIN, else nil
	conn    syscall.RawConn   // the socket of the raw writes, else nil
	swap    chunkSwap
	// writeRaw's callback for the socket's RawConn.Write, bound once per
	// pooled rawBytes, and what it reports.
	step    func(fd uintptr) bool
	written int64
	werr    error
}

var rawBytesPool = sync.Pool{New: func() any {
	s := new(rawBytes)
	s.step = s.writeStep // membody_raw_linux.go
	return s
}}

// sendRawBytes writes p to w as one chunk of iw, its only idle timeout
// writer, which wholeRangeOK allows.
func sendRawBytes(w http.ResponseWriter, iw *caddyhttp.IdleTimeoutWriter, p []byte) (int64, error) {
	s := rawBytesPool.Get().(*rawBytes)
	s.b, s.pos = p, 0
	s.sent.Store(0)
	s.chunk = int(chunkOf(iw))
	s.timeout, s.hard, s.ctrl = iw.Deadline.Timeout, iw.Deadline.HardDeadline, iw.Ctrl
	s.swap.oneChunk(iw, int64(len(p)), s) // onechunk.go
	n, err := readFrom(w, s)
	if s.pd != nil {
		s.pd.stop()
		s.pd = nil
	}
	s.swap.restore()
	s.b, s.ctrl, s.werr, s.conn = nil, nil, nil, nil
	rawBytesPool.Put(s)
	if err == nil && n != int64(len(p)) {
		err = io.ErrShortWrite
	}
	return n, err
}

// Read serves what net/http reads before it hands the body over (the
// first 512 bytes), and any writer that copies instead.
func (s *rawBytes) Read(p []byte) (int, error) {
	if s.pos >= len(s.b) {
		return 0, io.EOF
	}
	n := copy(p, s.b[s.pos:])
	s.pos += n
	return n, nil
}

// left is what is not yet read or written (wholeSource).
func (s *rawBytes) left() int64 { return int64(len(s.b) - s.pos) }

// progress is the bytes the peer has taken (progressSource): those the
// raw writes put in the socket less those it still holds. The socket's
// send buffer grows to megabytes; a reader that drains it slowly makes
// progress long before the next write finds room.
func (s *rawBytes) progress() (int64, error) { return s.sent.Load() - unsent(s.conn), nil }

// WriteTo writes the rest of the bytes to dst: with raw write(2) calls
// when dst is a socket (syscall.Conn), else in Writes of the idle
// timeout writer's chunk.
func (s *rawBytes) WriteTo(dst io.Writer) (int64, error) {
	if sc, ok := dst.(syscall.Conn); ok && rawWriteOK {
		if conn, err := sc.SyscallConn(); err == nil {
			return s.writeRaw(conn) // membody_raw_linux.go
		}
	}
	return s.writeChunks(dst)
}

// writeChunks writes the rest to dst in Writes of at most the writer's
// chunk, pushing the write deadline to now+timeout before each, as the
// idle timeout writer does.
func (s *rawBytes) writeChunks(dst io.Writer) (int64, error) {
	var written int64
	for s.pos < len(s.b) {
		p := s.b[s.pos:]
		if len(p) > s.chunk {
			p = p[:s.chunk]
		}
		if s.ctrl != nil {
			_ = s.ctrl.SetWriteDeadline(idleDeadline(time.Now(), s.timeout, s.hard))
		}
		n, err := dst.Write(p)
		s.pos += n
		written += int64(n)
		if err != nil {
			return written, err
		}
		if n < len(p) {
			return written, io.ErrShortWrite
		}
	}
	return written, nil
}

// waiting is called when the socket takes no more for now (EAGAIN): the
// progress deadline starts, once per answer.
func (s *rawBytes) waiting() {
	if s.pd == nil && s.ctrl != nil {
		s.pd = startProgressDeadline(s, s.sent.Load(), s.timeout, s.hard, s.ctrl.SetWriteDeadline, time.Now)
	}
}

// Interface guards
var (
	_ wholeSource    = (*rawBytes)(nil)
	_ progressSource = (*rawBytes)(nil)
)
