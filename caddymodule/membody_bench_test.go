//go:build unix

package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// BenchmarkSendMemory is a memory tier answer through a Caddy-like
// writer chain (a ResponseWriterWrapper above an IdleTimeoutWriter with
// Caddy's default write_idle of a minute) to a real HTTP/1.1 client over
// loopback, one keep-alive connection: as one chunk in raw write(2)
// calls, and with SYNCULAR_RAW_WRITE=off (the writer's 64 KiB chunks
// through Go's write path). cpu-ns/op is the process's CPU time per
// answer, client included (docs/performance.md, "Memory-tier hits as
// one chunk").
func BenchmarkSendMemory(b *testing.B) {
	for _, size := range []int{256 << 10, 2 << 20} {
		data := randomBytes(size)
		for _, mode := range []string{"raw", "off"} {
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, mode), func(b *testing.B) {
				if mode == "off" {
					b.Setenv(envRawWrite, "off")
				}
				benchSendMemory(b, data)
			})
		}
	}
}

func benchSendMemory(b *testing.B, data []byte) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		iw := &caddyhttp.IdleTimeoutWriter{
			ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
			Ctrl:                  http.NewResponseController(w),
			Deadline:              caddyhttp.IdleDeadline{Start: time.Now(), Timeout: time.Minute},
			Logger:                zap.NewNop(),
		}
		defer iw.HandlerDone()
		outer := &caddyhttp.ResponseWriterWrapper{ResponseWriter: iw}
		outer.Header().Set("Content-Length", strconv.Itoa(len(data)))
		outer.WriteHeader(http.StatusOK)
		if n, err := sendMemory(outer, data); err != nil || n != int64(len(data)) {
			b.Errorf("sent %d of %d: %v", n, len(data), err)
		}
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	get := func() {
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			b.Fatal(err)
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, res.Body); err != nil || n != int64(len(data)) {
			b.Fatalf("got %d of %d: %v", n, len(data), err)
		}
		res.Body.Close()
	}
	get() // warm the connection
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for b.Loop() {
		get()
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
