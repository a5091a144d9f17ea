//go:build linux

package caddymodule

import (
	"io"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// Writing a memory tier answer with write(2) as a raw system call, for
// the reasons sendfile_raw_linux.go gives for sendfile(2): Go's own write
// path tells the scheduler the thread may block, and on a non-blocking
// socket write(2) never does; it copies what the socket buffer takes and
// returns (docs/performance.md, "Memory-tier hits as one chunk").

// rawWriteMax is the most one raw write(2) call asks for, as
// rawSendfileMax bounds one sendfile(2) call.
const rawWriteMax = 2 << 20

// rawWriteOK: this platform has rawBytes.writeRaw.
const rawWriteOK = true

// writeRaw writes the rest of the bytes to the socket conn with raw
// write(2) calls, each at most rawWriteMax bytes, yielding between full
// calls so a fast reader cannot hold a processor. EAGAIN waits in the
// netpoller under the connection's write deadline (and starts the
// progress deadline); EINTR is retried.
func (s *rawBytes) writeRaw(conn syscall.RawConn) (int64, error) {
	var written int64
	var werr error
	err := conn.Write(func(fd uintptr) bool {
		for s.pos < len(s.b) {
			p := s.b[s.pos:]
			if len(p) > rawWriteMax {
				p = p[:rawWriteMax]
			}
			// s.b keeps the bytes alive across the call.
			n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch {
			case e == syscall.EAGAIN:
				s.waiting()
				return false // wait in the netpoller for room
			case e == syscall.EINTR:
				continue
			case e != 0:
				werr = os.NewSyscallError("write", e)
				return true
			case n == 0:
				werr = io.ErrShortWrite
				return true
			}
			s.pos += int(n)
			written += int64(n)
			s.sent.Add(int64(n))
			if int(n) == len(p) && s.pos < len(s.b) {
				runtime.Gosched() // the socket still takes bytes: let others run
			}
		}
		return true
	})
	if werr == nil {
		werr = err
	}
	return written, werr
}
