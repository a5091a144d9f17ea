package caddymodule

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// sendfileServer is a real HTTP/1.1 server on loopback whose handler
// wraps its writer as Caddy's server does (an IdleTimeoutWriter cutting
// ReadFrom sources into chunk bytes, a ResponseWriterWrapper as the
// access log's recorder would add) and answers GET /?off=&n= with those
// bytes of file through sendfileSource, the way a disk tier body hands a
// complete file over (an *io.LimitedReader at the offset). The last fileRange used
// is kept for the test.
type sendfileServer struct {
	*httptest.Server
	done chan served // one per answer, after the handler copied the body
}

type served struct {
	fr  *fileRange
	err error
}

func newSendfileServer(t *testing.T, path string, chunk int, minRate int64) *sendfileServer {
	t.Helper()
	s := &sendfileServer{done: make(chan served, 1)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		off, _ := strconv.ParseInt(r.URL.Query().Get("off"), 10, 64)
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		f, err := os.Open(path)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			t.Error(err)
			return
		}
		iw := &caddyhttp.IdleTimeoutWriter{
			ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
			Ctrl:                  http.NewResponseController(w),
			Deadline:              caddyhttp.IdleDeadline{Start: time.Now(), Timeout: 10 * time.Second, MinRate: minRate},
			MaxChunk:              chunk,
			Logger:                zap.NewNop(),
		}
		defer iw.HandlerDone()
		outer := &caddyhttp.ResponseWriterWrapper{ResponseWriter: iw}
		outer.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		outer.WriteHeader(http.StatusOK)
		src, done := sendfileSource(outer, f, n) // as sendFile does
		defer done()
		fr := rangeOf(src)
		k, err := readFrom(outer, src)
		if err == nil && k != n {
			err = fmt.Errorf("copied %d of %d bytes", k, n)
		}
		s.done <- served{fr, err}
	}))
	t.Cleanup(s.Close)
	return s
}

// Every answer from a complete file, whole or any range, reaches sendfile
// through an IdleTimeoutWriter and never sends past the range's end (a
// second answer on the same connection parses). Under a plain idle
// timeout the answer is one chunk: only the 512 bytes net/http reads
// itself are copied. With a minimum rate (the writer's own chunks kept)
// only the tail of a range ending before the file's end, less than one
// chunk, is copied as well.
func TestSendfileThroughIdleTimeoutWriter(t *testing.T) {
	for _, minRate := range []int64{0, 1 << 10} {
		t.Run(fmt.Sprintf("min rate %d", minRate), func(t *testing.T) { testSendfileThroughIdleTimeoutWriter(t, minRate) })
	}
}

func testSendfileThroughIdleTimeoutWriter(t *testing.T, minRate int64) {
	const size = 3<<20 + 12345
	data := make([]byte, size)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "seg")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{0, 64 << 10, 1 << 20} {
		c := int64(chunk)
		if c == 0 {
			c = caddyhttp.DefaultMaxWriteChunk
		}
		s := newSendfileServer(t, path, chunk, minRate)
		conn, err := net.Dial("tcp", s.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		for _, tc := range []struct {
			name   string
			off, n int64
		}{
			{"whole", 0, size},
			{"to the end", 1000, size - 1000},
			{"inside", 777, size - 777 - 300_001},
			{"whole chunks", 512, 3 * c},
			{"less than a chunk", 5000, c - 1},
			{"one byte", 42, 1},
			{"inside, again", 1, size - 2},
		} {
			t.Run(fmt.Sprintf("chunk %d/%s", chunk, tc.name), func(t *testing.T) {
				fmt.Fprintf(conn, "GET /?off=%d&n=%d HTTP/1.1\r\nHost: x\r\n\r\n", tc.off, tc.n)
				res, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || !bytes.Equal(got, data[tc.off:tc.off+tc.n]) {
					t.Fatalf("%d bytes (%v), not bytes %d..%d of the file", len(got), err, tc.off, tc.off+tc.n)
				}
				var fr *fileRange
				select {
				case sv := <-s.done:
					if sv.err != nil {
						t.Fatal(sv.err)
					}
					fr = sv.fr
				case <-time.After(10 * time.Second):
					t.Fatal("handler did not return")
				}
				if fr == nil {
					t.Fatal("no fileRange under an IdleTimeoutWriter")
				}
				// net/http reads the first 512 bytes itself before it
				// hands the source to the connection.
				copied := tc.n - fr.sent
				toEOF := tc.off+tc.n == size
				switch {
				case minRate == 0 && copied > min(tc.n, 512):
					t.Fatalf("one chunk: %d of %d bytes copied, want at most 512", copied, tc.n)
				case toEOF && copied > 512:
					t.Fatalf("range to the end of the file: %d of %d bytes copied, want at most 512", copied, tc.n)
				case !toEOF && tc.n >= c+512 && copied > c+512:
					t.Fatalf("%d of %d bytes copied, want at most one chunk (%d) + 512", copied, tc.n, c)
				case fr.pos != tc.off+tc.n:
					t.Fatalf("file offset %d after the answer, want %d", fr.pos, tc.off+tc.n)
				}
				t.Logf("%d bytes: %d with sendfile, %d copied", tc.n, fr.sent, copied)
			})
		}
		conn.Close()
	}
}

// rangeOf is the fileRange behind a source of sendfileSource; nil when
// there is none.
func rangeOf(src io.Reader) *fileRange {
	switch s := src.(type) {
	case *fileRange:
		return s
	case rawRange:
		return s.r
	}
	return nil
}

// Without an idle timeout writer the file goes to the connection as an
// *io.LimitedReader over it (the shape net's sendfile takes). (Whether a
// body is a range of a complete file is the store's: store.TestBodyKinds.)
func TestSendfileSourceShapes(t *testing.T) {
	f := segFile(t, 100, 'x', 10)
	source := func(w io.Writer, n int64) io.Reader {
		src, done := sendfileSource(w, f, n)
		done()
		return src
	}
	if lr, ok := source(httptest.NewRecorder(), 90).(*io.LimitedReader); !ok || lr.R != io.Reader(f) || lr.N != 90 {
		t.Fatalf("no idle timeout writer: %+v, want a LimitedReader over the file", lr)
	}
	iw := &caddyhttp.IdleTimeoutWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: httptest.NewRecorder()}}
	rec := &caddyhttp.ResponseWriterWrapper{ResponseWriter: iw}
	fr, ok := source(rec, 90).(*fileRange)
	if !ok || fr.pos != 10 || fr.end != 100 || !fr.toEOF || fr.chunk != caddyhttp.DefaultMaxWriteChunk {
		t.Fatalf("under an idle timeout writer: %+v", fr)
	}
	fr, ok = source(rec, 50).(*fileRange)
	if !ok || fr.toEOF {
		t.Fatalf("a range ending before the file's end: %+v", fr)
	}
	// Offered to sendfile only when a chunk cannot pass the end.
	if _, err := fr.SyscallConn(); err == nil {
		t.Fatal("50 bytes before the end with a 64 KiB chunk: descriptor offered to sendfile")
	}
	if got, err := io.ReadAll(fr); err != nil || len(got) != 50 || fr.pos != 60 {
		t.Fatalf("read %d bytes, offset %d: %v", len(got), fr.pos, err)
	}
	if chunk, found := writeChunk(rec); !found || chunk != caddyhttp.DefaultMaxWriteChunk {
		t.Fatalf("writeChunk %d %v", chunk, found)
	}
}

// A file shorter than the range (changed behind the tier's back) ends
// in an error, never a clean short answer.
func TestFileRangeShortFile(t *testing.T) {
	f := segFile(t, 100, 0, 0)
	fr := newFileRange(f, 100, 64<<10)
	if fr == nil {
		t.Fatal("no fileRange")
	}
	if err := f.Truncate(60); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(fr); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated file: %v, want io.ErrUnexpectedEOF", err)
	}
	if newFileRange(f, 100, 64<<10) != nil {
		t.Fatal("a range past the file's end was accepted")
	}
}

// Under a plain idle timeout on HTTP/1 the answer is one chunk of the
// writer for its duration, with the writer's chunk put back after; with a
// minimum rate or on HTTP/2 the writer's chunks are kept.
func TestSendfileSourceWholeRange(t *testing.T) {
	f := segFile(t, 1<<20, 0, -1)
	newIW := func(d caddyhttp.IdleDeadline, h2 bool) *caddyhttp.IdleTimeoutWriter {
		rec := httptest.NewRecorder()
		return &caddyhttp.IdleTimeoutWriter{
			ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: rec},
			Ctrl:                  http.NewResponseController(rec),
			Deadline:              d,
			MaxChunk:              64 << 10,
			Logger:                zap.NewNop(),
			ClearBetweenWrites:    h2,
		}
	}
	for _, tc := range []struct {
		name  string
		iw    *caddyhttp.IdleTimeoutWriter
		whole bool
	}{
		{"plain idle timeout", newIW(caddyhttp.IdleDeadline{Timeout: time.Minute}, false), true},
		{"with a hard deadline", newIW(caddyhttp.IdleDeadline{Timeout: time.Minute, HardDeadline: time.Now().Add(time.Hour)}, false), true},
		{"minimum rate", newIW(caddyhttp.IdleDeadline{Timeout: time.Minute, MinRate: 1000}, false), false},
		{"HTTP/2", newIW(caddyhttp.IdleDeadline{Timeout: time.Minute}, true), false},
		{"no timeout", newIW(caddyhttp.IdleDeadline{}, false), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.Seek(1000, io.SeekStart)
			outer := &caddyhttp.ResponseWriterWrapper{ResponseWriter: tc.iw}
			src, done := sendfileSource(outer, f, 500_000)
			fr := rangeOf(src)
			if fr == nil {
				t.Fatalf("%T, want a fileRange", src)
			}
			_, raw := src.(rawRange)
			if raw != (tc.whole && rawSendfileOK) {
				t.Fatalf("%T: a rawRange is the source of a whole-range answer (on Linux) only", src)
			}
			wholeChunk := 500_000
			if raw {
				wholeChunk++ // a bare source: the writer's loop ends after one call
			}
			during := tc.iw.MaxChunk
			done()
			switch {
			case fr.whole != tc.whole:
				t.Fatalf("whole %v, want %v", fr.whole, tc.whole)
			case tc.whole && during != wholeChunk:
				t.Fatalf("writer's chunk %d during the answer, want %d (the range's 500000)", during, wholeChunk)
			case !tc.whole && (during != 64<<10 || fr.chunk != 64<<10):
				t.Fatalf("writer's chunk %d, range's %d, want 64 KiB", during, fr.chunk)
			case tc.iw.MaxChunk != 64<<10:
				t.Fatalf("writer's chunk %d after the answer, want 64 KiB back", tc.iw.MaxChunk)
			}
		})
	}
}

// A progressDeadline pushes the deadline to now+timeout (never past the
// hard deadline) only when the offset moved since the last check, and
// never after stop.
func TestProgressDeadlineCheck(t *testing.T) {
	f := segFile(t, 1000, 0, 100)
	var sets []time.Time
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	// An hour's timeout: the timer (every 7.5 minutes) never fires here.
	p := startProgressDeadline(fileOffset{f}, 100, time.Hour, time.Time{}, func(d time.Time) error { sets = append(sets, d); return nil }, clock)
	p.check()
	if len(sets) != 0 {
		t.Fatalf("offset unchanged: deadline set to %v", sets)
	}
	f.Seek(600, io.SeekStart)
	now = now.Add(time.Minute)
	p.check()
	if len(sets) != 1 || !sets[0].Equal(now.Add(time.Hour)) {
		t.Fatalf("offset moved: deadlines %v, want %v", sets, now.Add(time.Hour))
	}
	p.check()
	if len(sets) != 1 {
		t.Fatalf("no move since the last check: deadlines %v", sets)
	}
	p.hard = now.Add(10 * time.Minute)
	f.Seek(700, io.SeekStart)
	p.check()
	if len(sets) != 2 || !sets[1].Equal(p.hard) {
		t.Fatalf("hard deadline first: deadlines %v, want %v last", sets, p.hard)
	}
	p.stop()
	f.Seek(900, io.SeekStart)
	p.check()
	if len(sets) != 2 {
		t.Fatalf("after stop: deadlines %v", sets)
	}
	if got := progressPeriod(time.Minute); got != 7500*time.Millisecond {
		t.Fatalf("period of a minute's timeout %v, want 7.5s", got)
	}
	if got := progressPeriod(time.Millisecond); got != minProgressPeriod {
		t.Fatalf("period of 1ms's timeout %v, want %v", got, minProgressPeriod)
	}
}

// idleServer is a real HTTP/1.1 server on loopback whose handler sends
// the whole file with sendFile under an IdleTimeoutWriter with idle
// timeout timeout, as Caddy's server installs it. Its connections' send
// buffers are small, so a reader that stops is felt after about 64 KiB.
type idleServer struct {
	*httptest.Server
	done chan error // the copy's error, one per answer
}

func newIdleServer(t *testing.T, path string, timeout time.Duration) *idleServer {
	t.Helper()
	s := &idleServer{done: make(chan error, 1)}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			s.done <- err
			return
		}
		defer f.Close()
		fi, _ := f.Stat()
		iw := &caddyhttp.IdleTimeoutWriter{
			ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
			Ctrl:                  http.NewResponseController(w),
			Deadline:              caddyhttp.IdleDeadline{Start: time.Now(), Timeout: timeout},
			Logger:                zap.NewNop(),
		}
		defer iw.HandlerDone()
		iw.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		iw.WriteHeader(http.StatusOK)
		n, err := sendFile(iw, f, 0, fi.Size())
		if err == nil && n != fi.Size() {
			err = fmt.Errorf("copied %d of %d bytes", n, fi.Size())
		}
		s.done <- err
	}))
	s.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if tc, ok := c.(*net.TCPConn); ok && st == http.StateNew {
			tc.SetWriteBuffer(32 << 10)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// get sends GET / on a connection with a small receive buffer and
// returns the response, its body unread.
func (s *idleServer) get(t *testing.T) *http.Response {
	t.Helper()
	d := net.Dialer{}
	conn, err := d.Dial("tcp", s.Listener.Addr().String())
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

func writeRandomFile(t *testing.T, size int) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "seg")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// A reader that stops taking bytes is cut by the write idle timeout,
// though the whole answer is one chunk of the writer, and not before the
// timeout.
func TestSendfileStalledReaderCut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	path, _ := writeRandomFile(t, 8<<20)
	s := newIdleServer(t, path, timeout)
	t0 := time.Now()
	res := s.get(t)
	defer res.Body.Close()
	// Read nothing more.
	select {
	case err := <-s.done:
		took := time.Since(t0)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("stalled reader: copy ended with %v, want the write deadline", err)
		}
		if took < timeout {
			t.Fatalf("cut after %v, before the idle timeout %v", took, timeout)
		}
		t.Logf("stalled reader cut after %v (idle timeout %v)", took, timeout)
	case <-time.After(30 * timeout):
		t.Fatalf("stalled reader not cut after %v (idle timeout %v)", 30*timeout, timeout)
	}
}

// A reader that keeps taking bytes, slowly, gets the whole answer though
// it takes many idle timeouts: the deadline follows its progress.
func TestSendfileSlowReaderKept(t *testing.T) {
	const timeout = 500 * time.Millisecond
	path, data := writeRandomFile(t, 2<<20)
	s := newIdleServer(t, path, timeout)
	t0 := time.Now()
	res := s.get(t)
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
	if err := <-s.done; err != nil {
		t.Fatalf("slow reader cut after %v (idle timeout %v): %v", took, timeout, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("slow reader got %d bytes, not the file's %d", len(got), len(data))
	}
	if took < 3*timeout {
		t.Fatalf("the answer took %v, under 3 idle timeouts (%v): it proves nothing", took, timeout)
	}
	t.Logf("slow reader: %d bytes in %v (idle timeout %v)", len(got), took, timeout)
}

// segFile is a temporary file of n bytes of fill, its offset at pos (or
// at its end when pos is -1), closed when the test ends.
func segFile(t *testing.T, n int, fill byte, pos int64) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "seg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(bytes.Repeat([]byte{fill}, n)); err != nil {
		t.Fatal(err)
	}
	if pos >= 0 {
		if _, err := f.Seek(pos, io.SeekStart); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// A rawRange given a writer that is no socket (TLS, a wrapped
// connection) copies the rest of its range, no byte past its end, and
// counts none of it as sent with sendfile.
func TestRawRangeToNonSocketCopies(t *testing.T) {
	f := segFile(t, 100_000, 'x', 10)
	fr := newFileRange(f, 50_000, 50_000)
	if fr == nil {
		t.Fatal("no fileRange")
	}
	fr.whole = true
	src := rawRange{fr}
	head := make([]byte, 512) // what net/http reads first
	if _, err := io.ReadFull(src, head); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := src.WriteTo(&buf)
	if err != nil || n != 50_000-512 || buf.Len() != int(n) || fr.pos != 50_010 || fr.sent != 0 {
		t.Fatalf("wrote %d (%v), buffer %d, offset %d, sent %d; want %d bytes copied, offset 50010", n, err, buf.Len(), fr.pos, fr.sent, 50_000-512)
	}
}

// oneChunk is the one place that reaches into Caddy's IdleTimeoutWriter:
// while it is in place the writer hands a whole range on as one chunk,
// the raw range bare (not inside the writer's io.LimitedReader) to the
// writer below it; restore puts the writer back. If a Caddy upgrade
// changes how IdleTimeoutWriter.ReadFrom uses MaxChunk or its
// ResponseWriterWrapper, this fails (and so does integration's
// TestSendfileDiskTier, through the real binary).
func TestOneChunk(t *testing.T) {
	const n = 1 << 20
	for _, raw := range []bool{false, true} {
		f := segFile(t, n, 'x', 0)
		fr := newFileRange(f, n, n)
		fr.whole = true
		var seen []readFromCall
		below := &caddyhttp.ResponseWriterWrapper{ResponseWriter: chunkRecorder{seen: &seen}}
		rec := httptest.NewRecorder()
		iw := &caddyhttp.IdleTimeoutWriter{
			ResponseWriterWrapper: below,
			Ctrl:                  http.NewResponseController(rec),
			Logger:                zap.NewNop(),
		}
		var src io.Reader = fr
		var bare wholeSource
		if raw {
			src, bare = rawRange{fr}, rawRange{fr}
		}
		restore := oneChunk(iw, n, bare)
		k, err := iw.ReadFrom(src)
		restore()
		if err != nil || k != n {
			t.Fatalf("raw %v: %d of %d bytes: %v", raw, k, n, err)
		}
		if len(seen) == 0 || seen[0].n != n || (raw && len(seen) != 1) {
			t.Fatalf("raw %v: the writer below got %+v, want the range as one chunk (then, at most, an empty one; none when raw)", raw, seen)
		}
		if raw {
			if _, ok := seen[0].r.(rawRange); !ok {
				t.Fatalf("raw: the writer below got %T, want the rawRange bare", seen[0].r)
			}
		} else if lr, ok := seen[0].r.(*io.LimitedReader); !ok || lr.R != src {
			t.Fatalf("the writer below got %T, want the fileRange inside the writer's chunk", seen[0].r)
		}
		if iw.MaxChunk != 0 || iw.ResponseWriterWrapper != below {
			t.Fatalf("raw %v: not restored: chunk %d, wrapper %p (want %p)", raw, iw.MaxChunk, iw.ResponseWriterWrapper, below)
		}
	}
}

// chunkRecorder is a connection's writer whose ReadFrom records each
// source it gets and reads it to its end.
type chunkRecorder struct{ seen *[]readFromCall }

// readFromCall is one ReadFrom: its source and the bytes it read.
type readFromCall struct {
	r io.Reader
	n int64
}

func (w chunkRecorder) Header() http.Header         { return http.Header{} }
func (w chunkRecorder) WriteHeader(int)             {}
func (w chunkRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (w chunkRecorder) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.Copy(io.Discard, r)
	*w.seen = append(*w.seen, readFromCall{r, n})
	return n, err
}
