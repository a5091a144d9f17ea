package caddymodule

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"
)

// caddyLikeWriter is a response writer whose ReadFrom hands its source on
// in 64 KiB io.LimitedReaders, as Caddy's idle timeout writer does: a
// copy through its ReadFrom allocates a buffer per chunk.
type caddyLikeWriter struct{ n int64 }

func (w *caddyLikeWriter) Header() http.Header { return nil }
func (w *caddyLikeWriter) WriteHeader(int)     {}
func (w *caddyLikeWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

func (w *caddyLikeWriter) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for {
		k, err := io.Copy(struct{ io.Writer }{w}, io.LimitReader(r, 64<<10))
		total += k
		if err != nil || k == 0 {
			return total, err
		}
	}
}

// readOnly hides a reader's WriteTo.
type readOnly struct{ r io.Reader }

func (o readOnly) Read(p []byte) (int, error) { return o.r.Read(p) }

// A stream (neither memory nor a complete file) is copied through one
// pooled buffer: writing it allocates nothing, however many chunks the
// writer would cut it into; a stream shorter than its size fails.
func TestCopyBodyAllocs(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	rd := bytes.NewReader(data)
	var src io.Reader = readOnly{rd}
	w := &caddyLikeWriter{}
	for _, size := range []int64{int64(len(data)), -1} {
		allocs := testing.AllocsPerRun(20, func() {
			rd.Reset(data)
			w.n = 0
			if n, err := copyBody(w, src, size, 0, time.Time{}, time.Now); err != nil || n != int64(len(data)) || w.n != n {
				t.Fatalf("copied %d (%d written): %v", n, w.n, err)
			}
		})
		if allocs != 0 {
			t.Fatalf("size %d: %v allocations per body, want 0", size, allocs)
		}
	}
	rd.Reset(data[:1000])
	if _, err := copyBody(w, src, 2000, 0, time.Time{}, time.Now); err != io.ErrUnexpectedEOF {
		t.Fatalf("short body: %v", err)
	}
}
