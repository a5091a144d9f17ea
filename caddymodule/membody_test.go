package caddymodule

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// memOpts is how a memServer wraps its writer, as Caddy's server would.
type memOpts struct {
	chunk       int           // the idle timeout writer's MaxChunk (0: default)
	minRate     int64         // write_min_rate
	timeout     time.Duration // write_idle (0: 10s)
	noIdle      bool          // no idle timeout writer
	twoIdle     bool          // a second idle timeout writer above the first
	h2          bool          // ClearBetweenWrites, as on HTTP/2
	smallSndBuf bool          // 32 KiB send buffers: a stalled reader is felt soon
}

// memServed is one answer as the handler saw it.
type memServed struct {
	n       int64
	err     error
	counted int64    // what a writer above the idle timeout writer counted (the access log's size)
	calls   []string // what the writer below it got: "write N" or "readfrom TYPE"
}

// raw reports whether the answer reached the connection as a bare rawBytes.
func (s memServed) raw() bool {
	for _, c := range s.calls {
		if c == "readfrom *caddymodule.rawBytes" {
			return true
		}
	}
	return false
}

// memServer is a real HTTP/1.1 server on loopback (TLS when tls is set)
// whose handler answers every request with data through sendMemory,
// under the writers opts says.
type memServer struct {
	*httptest.Server
	done chan memServed
}

func newMemServer(t *testing.T, data []byte, opts memOpts, useTLS bool) *memServer {
	t.Helper()
	if opts.timeout == 0 {
		opts.timeout = 10 * time.Second
	}
	s := &memServer{done: make(chan memServed, 4)}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &callRecorder{ResponseWriter: w}
		newIdle := func(below http.ResponseWriter) *caddyhttp.IdleTimeoutWriter {
			return &caddyhttp.IdleTimeoutWriter{
				ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: below},
				Ctrl:                  http.NewResponseController(below),
				Deadline:              caddyhttp.IdleDeadline{Start: time.Now(), Timeout: opts.timeout, MinRate: opts.minRate},
				MaxChunk:              opts.chunk,
				Logger:                zap.NewNop(),
				ClearBetweenWrites:    opts.h2,
			}
		}
		var top http.ResponseWriter = rec
		if !opts.noIdle {
			iw := newIdle(rec)
			defer iw.HandlerDone()
			top = iw
			if opts.twoIdle {
				iw2 := newIdle(iw)
				defer iw2.HandlerDone()
				top = iw2
			}
		}
		outer := &countingWriter{ResponseWriter: top}
		outer.Header().Set("Content-Length", strconv.Itoa(len(data)))
		outer.WriteHeader(http.StatusOK)
		n, err := sendMemory(outer, data)
		s.done <- memServed{n: n, err: err, counted: outer.n, calls: rec.calls}
	}))
	if opts.smallSndBuf {
		s.Config.ConnState = func(c net.Conn, st http.ConnState) {
			if tc, ok := c.(*net.TCPConn); ok && st == http.StateNew {
				tc.SetWriteBuffer(32 << 10)
			}
		}
	}
	if useTLS {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// served waits for the handler's account of the last answer.
func (s *memServer) served(t *testing.T) memServed {
	t.Helper()
	select {
	case sv := <-s.done:
		return sv
	case <-time.After(30 * time.Second):
		t.Fatal("handler did not return")
	}
	return memServed{}
}

// callRecorder stands just above net/http's writer and records what
// reaches it.
type callRecorder struct {
	http.ResponseWriter
	mu    sync.Mutex
	calls []string
}

func (r *callRecorder) note(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *callRecorder) Write(p []byte) (int, error) {
	r.note("write " + strconv.Itoa(len(p)))
	return r.ResponseWriter.Write(p)
}

func (r *callRecorder) ReadFrom(src io.Reader) (int64, error) {
	r.note(fmt.Sprintf("readfrom %T", src))
	return readFrom(r.ResponseWriter, src)
}

func (r *callRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// countingWriter counts the bytes written through it, as Caddy's access
// log recorder does.
type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	k, err := w.ResponseWriter.Write(p)
	w.n += int64(k)
	return k, err
}

func (w *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	k, err := readFrom(w.ResponseWriter, r)
	w.n += k
	return k, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// getOn sends GET / on conn and reads the whole answer.
func getOn(t *testing.T, conn net.Conn, br *bufio.Reader) []byte {
	t.Helper()
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.ContentLength != int64(len(got)) {
		t.Fatalf("Content-Length %d, %d bytes", res.ContentLength, len(got))
	}
	return got
}

// A memory answer larger than one chunk of a plain idle timeout writer
// reaches the connection bare, as one chunk, and every byte and count is
// exact: the body, the handler's count, the count of a writer above, and
// the next answer on the same connection. One of at most a chunk is
// one Write, as before.
func TestSendMemoryOneChunk(t *testing.T) {
	if !rawWriteOK {
		t.Skip("no raw writes on this platform")
	}
	for _, chunk := range []int{0, 1 << 20} {
		c := int(chunkOf(&caddyhttp.IdleTimeoutWriter{MaxChunk: chunk}))
		for _, size := range []int{513, c, c + 1, 256 << 10, 3<<20 + 12345} {
			t.Run(fmt.Sprintf("chunk %d/%d bytes", chunk, size), func(t *testing.T) {
				data := randomBytes(size)
				s := newMemServer(t, data, memOpts{chunk: chunk}, false)
				conn, err := net.Dial("tcp", s.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				br := bufio.NewReader(conn)
				for i := range 2 { // keep-alive: the second answer parses
					if got := getOn(t, conn, br); !bytes.Equal(got, data) {
						t.Fatalf("answer %d: %d bytes, not the %d written", i, len(got), size)
					}
					sv := s.served(t)
					if sv.err != nil || sv.n != int64(size) || sv.counted != int64(size) {
						t.Fatalf("answer %d: sent %d (%v), counted above %d; want %d", i, sv.n, sv.err, sv.counted, size)
					}
					if want := size > c; sv.raw() != want {
						t.Fatalf("answer %d: bare rawBytes %v, want %v: %v", i, sv.raw(), want, sv.calls)
					}
					if sv.raw() && len(sv.calls) != 1 {
						t.Fatalf("answer %d: the writer below got %v, want one ReadFrom", i, sv.calls)
					}
				}
			})
		}
	}
}

// Every case the one chunk does not suit writes the bytes as before: one
// Write, cut by the idle timeout writer into its own chunks.
func TestSendMemoryFallbacks(t *testing.T) {
	const size = 1<<20 + 3
	data := randomBytes(size)
	for _, tc := range []struct {
		name string
		opts memOpts
		env  string // SYNCULAR_RAW_WRITE
	}{
		{"no idle timeout writer", memOpts{noIdle: true}, ""},
		{"min rate", memOpts{minRate: 1 << 10}, ""},
		{"HTTP/2 (cleared between writes)", memOpts{h2: true}, ""},
		{"two idle timeout writers", memOpts{twoIdle: true}, ""},
		{"switch off", memOpts{}, "off"},
		{"one chunk or less", memOpts{chunk: size}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv(envRawWrite, tc.env)
			}
			s := newMemServer(t, data, tc.opts, false)
			conn, err := net.Dial("tcp", s.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if got := getOn(t, conn, bufio.NewReader(conn)); !bytes.Equal(got, data) {
				t.Fatalf("%d bytes, not the %d written", len(got), size)
			}
			sv := s.served(t)
			if sv.err != nil || sv.n != size || sv.counted != size {
				t.Fatalf("sent %d (%v), counted above %d; want %d", sv.n, sv.err, sv.counted, size)
			}
			chunk := size
			if !tc.opts.noIdle && tc.opts.chunk == 0 {
				chunk = caddyhttp.DefaultMaxWriteChunk
			}
			for _, c := range sv.calls {
				k, err := strconv.Atoi(strings.TrimPrefix(c, "write "))
				if err != nil || k > chunk {
					t.Fatalf("the writer below got %v, want Writes of at most %d", sv.calls, chunk)
				}
			}
		})
	}
}

// Over TLS the connection is no socket: the bytes still go as one chunk
// of the idle timeout writer, written in Writes of the writer's own
// chunk, every byte and count exact.
func TestSendMemoryTLS(t *testing.T) {
	const size = 3<<20 + 7
	data := randomBytes(size)
	s := newMemServer(t, data, memOpts{}, true)
	conn, err := tls.Dial("tcp", s.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := getOn(t, conn, bufio.NewReader(conn)); !bytes.Equal(got, data) {
		t.Fatalf("%d bytes, not the %d written", len(got), size)
	}
	sv := s.served(t)
	if sv.err != nil || sv.n != size || sv.counted != size {
		t.Fatalf("sent %d (%v), counted above %d; want %d", sv.n, sv.err, sv.counted, size)
	}
	if rawWriteOK && !sv.raw() {
		t.Fatalf("the writer below got %v, want the bare rawBytes", sv.calls)
	}
}

// deadlineWriter records the writes and the write deadlines set on it.
type deadlineWriter struct {
	http.ResponseWriter
	writes    []int
	deadlines int
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, len(p))
	return len(p), nil
}

func (w *deadlineWriter) SetWriteDeadline(time.Time) error {
	w.deadlines++
	return nil
}

// To a writer that is no socket, a rawBytes writes what net/http did not
// read in Writes of the idle timeout writer's chunk, the deadline pushed
// before each, as the writer itself would.
func TestRawBytesToNonSocket(t *testing.T) {
	const chunk = 64 << 10
	data := randomBytes(5*chunk + 100)
	dw := &deadlineWriter{ResponseWriter: httptest.NewRecorder()}
	s := &rawBytes{b: data, chunk: chunk, timeout: time.Second, ctrl: http.NewResponseController(dw)}
	head := make([]byte, 512)
	if _, err := io.ReadFull(s, head); err != nil || !bytes.Equal(head, data[:512]) {
		t.Fatalf("first 512 bytes: %v", err)
	}
	n, err := s.WriteTo(dw)
	want := []int{chunk, chunk, chunk, chunk, chunk + 100 - 512}
	if err != nil || n != int64(len(data)-512) || fmt.Sprint(dw.writes) != fmt.Sprint(want) || dw.deadlines != len(want) || s.left() != 0 {
		t.Fatalf("wrote %d (%v) in %v with %d deadlines, %d left; want %d in %v, a deadline each", n, err, dw.writes, dw.deadlines, s.left(), len(data)-512, want)
	}
}

// memIdleGet sends GET / on a connection with a small receive buffer and
// returns the response, its body unread.
func memIdleGet(t *testing.T, s *memServer) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", s.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.(*net.TCPConn).SetReadBuffer(32 << 10)
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReaderSize(conn, 8<<10), nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A reader that stops taking bytes is cut by the write idle timeout,
// though the whole memory answer is one chunk of the writer.
func TestSendMemoryStalledReaderCut(t *testing.T) {
	if !rawWriteOK {
		t.Skip("no raw writes on this platform")
	}
	const timeout = 300 * time.Millisecond
	s := newMemServer(t, randomBytes(4<<20), memOpts{timeout: timeout, smallSndBuf: true}, false)
	res := memIdleGet(t, s)
	defer res.Body.Close()
	// Read nothing more.
	select {
	case sv := <-s.done:
		if !errors.Is(sv.err, os.ErrDeadlineExceeded) || !sv.raw() {
			t.Fatalf("stalled reader: the answer ended with %v (bare rawBytes %v), want the write deadline of one chunk", sv.err, sv.raw())
		}
	case <-time.After(30 * timeout):
		t.Fatalf("stalled reader not cut after %v (idle timeout %v)", 30*timeout, timeout)
	}
}

// A reader that keeps taking bytes, slowly, gets the whole memory answer
// though it takes many idle timeouts: the deadline follows its progress.
func TestSendMemorySlowReaderKept(t *testing.T) {
	if !rawWriteOK {
		t.Skip("no raw writes on this platform")
	}
	const timeout = 500 * time.Millisecond
	data := randomBytes(2 << 20)
	s := newMemServer(t, data, memOpts{timeout: timeout, smallSndBuf: true}, false)
	t0 := time.Now()
	res := memIdleGet(t, s)
	defer res.Body.Close()
	var got []byte
	buf := make([]byte, 8<<10)
	for {
		n, err := res.Body.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // about 800 KB/s at most
	}
	took := time.Since(t0)
	sv := s.served(t)
	if sv.err != nil || !sv.raw() {
		t.Fatalf("slow reader cut after %v (idle timeout %v): %v (bare rawBytes %v)", took, timeout, sv.err, sv.raw())
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("slow reader got %d bytes, not the %d written", len(got), len(data))
	}
	if took < 3*timeout {
		t.Fatalf("the answer took %v, under 3 idle timeouts (%v): it proves nothing", took, timeout)
	}
}

// A rawBytes's progress is what the peer took: bytes written to a socket
// whose peer reads nothing count only once they leave the socket.
func TestRawBytesProgressUnsent(t *testing.T) {
	if !rawWriteOK {
		t.Skip("no raw writes on this platform")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		peer <- c
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p := <-peer
	if p == nil {
		t.Fatal("no peer")
	}
	defer p.Close()
	p.(*net.TCPConn).SetReadBuffer(16 << 10)
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	conn.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	s := &rawBytes{b: randomBytes(8 << 20), chunk: 64 << 10}
	n, err := s.writeRaw(raw)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 {
		t.Fatalf("wrote %d to a peer that reads nothing: %v, want some, then the deadline", n, err)
	}
	if got, _ := s.progress(); got >= n {
		t.Fatalf("progress %d of %d written: the bytes the socket still holds count", got, n)
	}
}
