package compress

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/internal/segdata"
)

// benchData is built once per test binary: a real SQLite image and a rows
// segment of the same rows. COMPRESS_BENCH_ROWS sets the row count
// (default 50000: about 21 MiB of SQLite, 24 MiB of rows; 150000 gives
// about 64 MiB).
var benchData = sync.OnceValues(func() ([]dataset, error) {
	n := 50000
	if s := os.Getenv("COMPRESS_BENCH_ROWS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("COMPRESS_BENCH_ROWS=%q: want a positive integer", s)
		}
		n = v
	}
	dir, err := os.MkdirTemp("", "compress-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	img, err := segdata.SQLiteImage(dir, n)
	if err != nil {
		return nil, err
	}
	return []dataset{{"sqlite", img}, {"rows", segdata.RowsSegment(n)}}, nil
})

type dataset struct {
	name  string
	bytes []byte
}

func loadBench(b *testing.B) []dataset {
	b.Helper()
	ds, err := benchData()
	if err != nil {
		b.Fatal(err)
	}
	return ds
}

// reportCPU adds CPU-time metrics for a benchmark that processed size
// bytes per op: cpu-ms/op and MB/cpu-s (what one core does per second).
func reportCPU(b *testing.B, start time.Duration, size int) {
	used := cpuTime() - start
	if start == 0 || used <= 0 {
		return
	}
	perOp := used.Seconds() / float64(b.N)
	b.ReportMetric(perOp*1000, "cpu-ms/op")
	b.ReportMetric(float64(size)/1e6/perOp, "MB/cpu-s")
}

// discardCounter counts bytes without keeping them.
type discardCounter struct{ n int64 }

func (d *discardCounter) Write(p []byte) (int, error) { d.n += int64(len(p)); return len(p), nil }

// BenchmarkEncode measures the chosen levels: MB/s of identity input and
// the ratio identity/compressed.
func BenchmarkEncode(b *testing.B) {
	for _, d := range loadBench(b) {
		for _, c := range []Coding{Gzip, Zstd} {
			b.Run(d.name+"/"+c.String(), func(b *testing.B) {
				b.SetBytes(int64(len(d.bytes)))
				var n int64
				start := cpuTime()
				for b.Loop() {
					var w discardCounter
					if _, err := Encode(c, &w, bytes.NewReader(d.bytes)); err != nil {
						b.Fatal(err)
					}
					n = w.n
				}
				reportCPU(b, start, len(d.bytes))
				b.ReportMetric(float64(len(d.bytes))/float64(n), "ratio")
			})
		}
	}
}

// BenchmarkVerify measures decoding and hashing a stored variant (MB/s of
// identity output).
func BenchmarkVerify(b *testing.B) {
	for _, d := range loadBench(b) {
		id := segmentID(d.bytes)
		for _, c := range []Coding{Gzip, Zstd} {
			var buf bytes.Buffer
			if _, err := Encode(c, &buf, bytes.NewReader(d.bytes)); err != nil {
				b.Fatal(err)
			}
			b.Run(d.name+"/"+c.String(), func(b *testing.B) {
				b.SetBytes(int64(len(d.bytes)))
				start := cpuTime()
				for b.Loop() {
					if err := Verify(c, bytes.NewReader(buf.Bytes()), idOf(id), int64(len(d.bytes))); err != nil {
						b.Fatal(err)
					}
				}
				reportCPU(b, start, len(d.bytes))
			})
		}
	}
}

// BenchmarkLevels is the sweep the chosen levels come from. It is slow,
// so it runs only with COMPRESS_LEVELS=1.
func BenchmarkLevels(b *testing.B) {
	if os.Getenv("COMPRESS_LEVELS") != "1" {
		b.Skip("set COMPRESS_LEVELS=1 to run the level sweep")
	}
	type config struct {
		name string
		c    Coding
		k    coder
	}
	var configs []config
	for _, l := range []int{5, 6, 7, 9} {
		configs = append(configs, config{fmt.Sprintf("gzip-%d", l), Gzip, coder{gzipLevel: l}})
	}
	for _, l := range []zstd.EncoderLevel{zstd.SpeedDefault, zstd.SpeedBetterCompression, zstd.SpeedBestCompression} {
		configs = append(configs,
			config{fmt.Sprintf("zstd-%s-c1", l), Zstd, coder{zstdLevel: l, zstdConcurrency: 1}},
			config{fmt.Sprintf("zstd-%s-c2", l), Zstd, coder{zstdLevel: l, zstdConcurrency: 2}},
			config{fmt.Sprintf("zstd-%s-c2blocks", l), Zstd, coder{zstdLevel: l, zstdConcurrency: 2, zstdConcurrentBk: true}})
	}
	for _, d := range loadBench(b) {
		for _, cf := range configs {
			b.Run(d.name+"/"+cf.name, func(b *testing.B) {
				b.SetBytes(int64(len(d.bytes)))
				var n int64
				start := cpuTime()
				for b.Loop() {
					var w discardCounter
					if err := cf.k.encode(cf.c, &w, bytes.NewReader(d.bytes)); err != nil {
						b.Fatal(err)
					}
					n = w.n
				}
				reportCPU(b, start, len(d.bytes))
				b.ReportMetric(float64(len(d.bytes))/float64(n), "ratio")
			})
		}
	}
}

// Headers real clients send (protocol §6) and a few heavier ones.
var benchHeaders = []struct{ name, header string }{
	{"rust", "gzip"},
	{"browser", "gzip, deflate, br, zstd"},
	{"bare-fetch", ""},
	{"node", "gzip, deflate"},
	{"weighted", "br;q=1.0, gzip;q=0.8, *;q=0.1"},
	{"no-coding", "identity;q=1, *;q=0"},
}

func BenchmarkNegotiate(b *testing.B) {
	for _, h := range benchHeaders {
		b.Run(h.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Negotiate(h.header, nil)
			}
		})
	}
}

func BenchmarkMatchIfNoneMatch(b *testing.B) {
	id := segmentID([]byte("bench"))
	h := `W/"sha256:0000000000000000000000000000000000000000000000000000000000000000", ` + ETag(id, Gzip)
	b.ReportAllocs()
	for b.Loop() {
		if !MatchIfNoneMatch(id, h) {
			b.Fatal("no match")
		}
	}
}

// BenchmarkStormLevels measures the candidate levels of the storm path
// (a variant encoded while its segment is filled and followed): gzip 1
// and 6, zstd fastest and default at the storm window, and zstd default
// at 8 and 1 MiB, one goroutine each, flushed as the storm path flushes.
// It runs only with COMPRESS_LEVELS=1.
func BenchmarkStormLevels(b *testing.B) {
	if os.Getenv("COMPRESS_LEVELS") != "1" {
		b.Skip("set COMPRESS_LEVELS=1 to run the level sweep")
	}
	configs := []struct {
		name string
		c    Coding
		k    coder
	}{
		{"gzip-1", Gzip, coder{gzipLevel: 1}},
		{"gzip-6", Gzip, coder{gzipLevel: 6}},
		{"zstd-fastest", Zstd, coder{zstdLevel: zstd.SpeedFastest, zstdConcurrency: 1, zstdWindow: StormZstdWindow}},
		{"zstd-default", Zstd, coder{zstdLevel: zstd.SpeedDefault, zstdConcurrency: 1, zstdWindow: StormZstdWindow}},
		{"zstd-default-8MiB", Zstd, coder{zstdLevel: zstd.SpeedDefault, zstdConcurrency: 1, zstdWindow: 8 << 20}},
		{"zstd-default-1MiB", Zstd, coder{zstdLevel: zstd.SpeedDefault, zstdConcurrency: 1, zstdWindow: 1 << 20}},
	}
	for _, d := range loadBench(b) {
		if d.name != "sqlite" {
			continue
		}
		for _, cf := range configs {
			b.Run(d.name+"/"+cf.name, func(b *testing.B) {
				b.SetBytes(int64(len(d.bytes)))
				var n int64
				start := cpuTime()
				for b.Loop() {
					var w discardCounter
					if err := cf.k.encodeFlushing(cf.c, &w, bytes.NewReader(d.bytes), StormFirstFlush, StormFlushEvery, nil); err != nil {
						b.Fatal(err)
					}
					n = w.n
				}
				reportCPU(b, start, len(d.bytes))
				b.ReportMetric(float64(len(d.bytes))/float64(n), "ratio")
			})
		}
	}
}
