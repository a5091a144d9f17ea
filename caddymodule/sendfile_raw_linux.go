//go:build linux

package caddymodule

import (
	"io"
	"os"
	"runtime"
	"syscall"
)

// Sending a whole-range answer with sendfile(2) as a raw system call.
//
// Go's own sendfile path (net → internal/poll) makes each sendfile(2) call
// through syscall.Syscall, which tells the scheduler the thread may block.
// On a non-blocking socket sendfile(2) does not wait for the network: it
// moves as much as the socket buffer takes (on loopback up to megabytes,
// hundreds of microseconds of kernel work) and returns. The runtime's
// monitor sees a processor sitting in a system call past one tick, hands
// it to another thread and wakes that thread, which finds little to do
// and sleeps again; the sender then has to get a processor back. Raw
// calls make far fewer voluntary context switches per answer, about as
// few as nginx's, and cost less CPU per answer (docs/performance.md, "Raw
// sendfile calls and large page cache folios"). So for an answer sent as one chunk (sendfileSource's whole
// mode) the edge makes the calls itself with RawSyscall6, each at most
// rawSendfileMax bytes, and yields between full calls so a fast reader
// cannot hold a processor. EAGAIN waits in the netpoller, under the
// connection's write deadline, as net's own path does.
//
// What a raw call gives up: a page of the file that is not in the page
// cache is read from disk while the thread holds its processor (nginx's
// worker does the same without aio). Disk tier files were written or
// verified shortly before, and rawSendfileMax bounds one call.

// rawSendfileMax is the most one raw sendfile(2) call asks for (nginx's
// sendfile_max_chunk default).
const rawSendfileMax = 2 << 20

// rawSendfileOK: this platform has rawRange.
const rawSendfileOK = true

// rawRange is a whole-range fileRange that writes itself (io.WriterTo)
// to a connection with raw sendfile(2) calls. It is deliberately no
// syscall.Conn: net's ReadFrom then declines its own sendfile and hands
// the connection to WriteTo (net.genericReadFrom → io.Copy).
type rawRange struct{ r *fileRange }

// Read serves what net/http reads before it hands the body over (the
// first 512 bytes).
func (s rawRange) Read(p []byte) (int, error) { return s.r.Read(p) }

// WriteTo sends the rest of the range to dst: with raw sendfile(2) when
// dst is a socket (syscall.Conn), else by copying.
func (s rawRange) WriteTo(dst io.Writer) (int64, error) {
	r := s.r
	if r.err != nil {
		return 0, r.err
	}
	sc, ok := dst.(syscall.Conn)
	if !ok {
		return copyRest(dst, r)
	}
	conn, err := sc.SyscallConn()
	if err != nil {
		return copyRest(dst, r)
	}
	file, err := r.f.SyscallConn()
	if err != nil {
		return copyRest(dst, r)
	}
	var sent int64
	var serr error
	cerr := file.Control(func(ffd uintptr) {
		werr := conn.Write(func(sfd uintptr) bool {
			for r.pos < r.end {
				want := min(r.end-r.pos, rawSendfileMax)
				n, _, e := syscall.RawSyscall6(syscall.SYS_SENDFILE, sfd, ffd, 0, uintptr(want), 0, 0)
				switch {
				case e == syscall.EAGAIN:
					return false // wait in the netpoller for room
				case e == syscall.EINTR:
					continue
				case e != 0:
					serr = os.NewSyscallError("sendfile", e)
					return true
				case n == 0:
					serr = io.ErrUnexpectedEOF // the file is shorter than at open
					return true
				}
				r.pos += int64(n)
				r.sent += int64(n)
				sent += int64(n)
				if int64(n) == want && r.pos < r.end {
					runtime.Gosched() // the socket still takes bytes: let others run
				}
			}
			return true
		})
		if serr == nil {
			serr = werr
		}
	})
	if serr == nil {
		serr = cerr
	}
	if serr != nil {
		r.err = serr
	}
	return sent, serr
}
