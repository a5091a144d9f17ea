package caddymodule

import (
	"bufio"
	"bytes"
	"crypto/rand"
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

func newSendfileServer(t *testing.T, path string, chunk int) *sendfileServer {
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
			Deadline:              caddyhttp.IdleDeadline{Start: time.Now(), Timeout: 10 * time.Second},
			MaxChunk:              chunk,
			Logger:                zap.NewNop(),
		}
		defer iw.HandlerDone()
		outer := &caddyhttp.ResponseWriterWrapper{ResponseWriter: iw}
		outer.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		outer.WriteHeader(http.StatusOK)
		src := sendfileSource(outer, &io.LimitedReader{R: f, N: n}) // as the body writer does
		fr, _ := src.(*fileRange)
		k, err := io.Copy(outer, src)
		if err == nil && k != n {
			err = fmt.Errorf("copied %d of %d bytes", k, n)
		}
		s.done <- served{fr, err}
	}))
	t.Cleanup(s.Close)
	return s
}

// Every answer from a complete file, whole or any range, reaches sendfile
// through an IdleTimeoutWriter's chunks, never sends past the range's end
// (a second answer on the same connection parses), and only the tail of
// a range ending before the file's end (less than one chunk) is copied.
func TestSendfileThroughIdleTimeoutWriter(t *testing.T) {
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
		s := newSendfileServer(t, path, chunk)
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

// Without an idle timeout writer the disk tier's LimitedReader goes to
// the connection as it is (the shape net's sendfile takes); so does a
// LimitedReader of anything but a file. (Whether a body is a complete
// file of its length is the store's: store.TestBodyWriteTo.)
func TestSendfileSourceShapes(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "seg")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(bytes.Repeat([]byte("x"), 100))
	f.Seek(10, io.SeekStart)
	lr := &io.LimitedReader{R: f, N: 90}
	if src := sendfileSource(httptest.NewRecorder(), lr); src != lr {
		t.Fatalf("no idle timeout writer: %T, want the LimitedReader itself", src)
	}
	mem := &io.LimitedReader{R: bytes.NewReader(make([]byte, 90)), N: 90}
	iw := &caddyhttp.IdleTimeoutWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: httptest.NewRecorder()}}
	rec := &caddyhttp.ResponseWriterWrapper{ResponseWriter: iw}
	if src := sendfileSource(rec, mem); src != mem {
		t.Fatalf("not a file: %T, want the LimitedReader itself", src)
	}
	fr, ok := sendfileSource(rec, lr).(*fileRange)
	if !ok || fr.pos != 10 || fr.end != 100 || !fr.toEOF || fr.chunk != caddyhttp.DefaultMaxWriteChunk {
		t.Fatalf("under an idle timeout writer: %+v", fr)
	}
	fr, ok = sendfileSource(rec, &io.LimitedReader{R: f, N: 50}).(*fileRange)
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
	f, err := os.CreateTemp(t.TempDir(), "seg")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(make([]byte, 100))
	f.Seek(0, io.SeekStart)
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
