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
// write(2) calls (writeStep).
func (s *rawBytes) writeRaw(conn syscall.RawConn) (int64, error) {
	s.written, s.werr = 0, nil
	s.conn = conn // for progress; sendRawBytes lets go of it
	step := s.step
	if step == nil { // a rawBytes not from the pool
		step = s.writeStep
	}
	err := conn.Write(step)
	if s.werr == nil {
		s.werr = err
	}
	return s.written, s.werr
}

// writeStep writes to the socket fd with raw write(2) calls, each at
// most rawWriteMax bytes, yielding between full calls so a fast reader
// cannot hold a processor, until the bytes are all written (true), an
// error (true, in s.werr), or EAGAIN: false, to wait in the netpoller
// under the connection's write deadline (and the progress deadline
// starts). EINTR is retried.
func (s *rawBytes) writeStep(fd uintptr) bool {
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
			s.werr = os.NewSyscallError("write", e)
			return true
		case n == 0:
			s.werr = io.ErrShortWrite
			return true
		}
		s.pos += int(n)
		s.written += int64(n)
		s.sent.Add(int64(n))
		if int(n) == len(p) && s.pos < len(s.b) {
			runtime.Gosched() // the socket still takes bytes: let others run
		}
	}
	return true
}

// unsent is what the socket conn holds that its peer has not yet
// acknowledged (SIOCOUTQ, which is TIOCOUTQ on Linux); 0 when unknown.
func unsent(conn syscall.RawConn) int64 {
	if conn == nil {
		return 0
	}
	var q int32
	var e syscall.Errno
	err := conn.Control(func(fd uintptr) {
		_, _, e = syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&q)))
	})
	if err != nil || e != 0 || q < 0 {
		return 0
	}
	return int64(q)
}
