package main

// Shared parts of the large-segment scenarios (e)–(h): one 64 MiB segment
// of random bytes, written to S3 (versitygw), to its own SQLite store file
// and under the file_server tree; edges with the disk tier in a directory
// of their own; byte-exact downloads; /proc and /metrics readers.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
)

const largeSize = 64 << 20

var (
	flagLargeRounds   = flag.Int("large-rounds", 3, "rounds of the large-segment scenarios (e) and (g)")
	flagWriteChunk    = flag.String("write-chunk", "", "the large-segment edges' `servers { timeouts { write_max_chunk } }` (e.g. 2MiB); empty: Caddy's default, 64 KiB")
	flagLargeBackends = flag.String("large-backends", "sqlite,s3", "the stores (e) measures, comma-separated")
	flagPprofCrowd    = flag.Duration("pprof-crowd", 5*time.Second, "with -pprof: how long the edge's CPU profile of each crowd of (e) and (l) runs from the crowd's release")
	flagPprofHeapAt   = flag.Duration("pprof-heap-at", 2*time.Second, "with -pprof: when, after each crowd of (e) and (l) is released, the edge's heap profile (in use, after a GC) is taken")
)

// crowdProfiles starts, when -pprof is set, the profiles of a crowd just
// released on the Caddy whose admin is on port admin: a CPU profile of
// its first -pprof-crowd and a heap profile at -pprof-heap-at, saved as
// <-pprof>/<name>-cpu.pprof and -heap.pprof. The returned func waits for
// both and reports their errors; without -pprof it does nothing.
func crowdProfiles(admin int, name string) func() error {
	if *flagPprof == "" {
		return func() error { return nil }
	}
	errs := make(chan error, 2)
	go func() {
		errs <- saveProfile(admin, *flagPprofCrowd, filepath.Join(*flagPprof, name+"-cpu.pprof"))
	}()
	go func() {
		time.Sleep(*flagPprofHeapAt)
		errs <- saveURL(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", admin), filepath.Join(*flagPprof, name+"-heap.pprof"))
	}()
	return func() error { return errors.Join(<-errs, <-errs) }
}

// saveURL saves the body of a GET of u at path.
func saveURL(u, path string) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// largeSeg is the 64 MiB segment, made once per run.
type largeSeg struct {
	bytes []byte
	id    string
	db    string // SQLite store holding it
	www   string // file_server root: www/sync/segments/<id>
}

var largeOnce struct {
	sync.Once
	seg *largeSeg
	err error
}

func (e *env) large() (*largeSeg, error) {
	largeOnce.Do(func() { largeOnce.seg, largeOnce.err = e.makeLarge() })
	return largeOnce.seg, largeOnce.err
}

func (e *env) makeLarge() (*largeSeg, error) {
	l := &largeSeg{bytes: make([]byte, largeSize)}
	if _, err := rand.Read(l.bytes); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if l.id, err = e.put(ctx, l.bytes); err != nil {
		return nil, err
	}
	l.db = filepath.Join(e.dir, "large.db")
	w, err := seed.Create(l.db, 3)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	now := time.Now().UnixMilli()
	id, err := w.Put(seed.SegmentInput{Bytes: l.bytes, Publication: store.Publication{
		Partition: partition, LogEpoch: "e1", Table: "tasks", ScopeDigest: scopeDigest,
		AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
	}})
	if err != nil {
		return nil, err
	}
	if id != l.id {
		return nil, fmt.Errorf("SQLite id %s, S3 id %s", id, l.id)
	}
	if err := w.SetEpoch(partition, "e1", now); err != nil {
		return nil, err
	}
	l.www = filepath.Join(e.dir, "www-large")
	segDir := filepath.Join(l.www, "sync", "segments")
	if err := os.MkdirAll(segDir, 0o755); err != nil {
		return nil, err
	}
	return l, os.WriteFile(filepath.Join(segDir, id), l.bytes, 0o644)
}

// largeBackends are the two stores the large scenarios measure.
var largeBackends = []string{"sqlite", "s3"}

func backendName(b string) string {
	if b == "s3" {
		return "S3 `proxy`"
	}
	return "SQLite `serve`"
}

// largeEdge is an edge serving the large segment from backend with the
// disk tier in diskDir.
type largeEdge struct {
	*proc
	admin, port int
	backend     string
	seg         *largeSeg
	e           *env
}

func (e *env) startLargeEdge(name, backend, diskDir string) (*largeEdge, error) {
	l, err := e.large()
	if err != nil {
		return nil, err
	}
	storeBlock, delivery := "store sqlite "+l.db, "delivery serve"
	if backend == "s3" {
		storeBlock, delivery = e.s3Block(), "delivery proxy"
	}
	extra := fmt.Sprintf("%s\n\t\tcache {\n\t\t\tdisk %s\n\t\t}", delivery, diskDir)
	admin, port := freePort(), freePort()
	global := fmt.Sprintf(globalOpts, admin)
	if *flagWriteChunk != "" {
		global = strings.Replace(global, "auto_https off", "auto_https off\n\tservers {\n\t\ttimeouts {\n\t\t\twrite_max_chunk "+*flagWriteChunk+"\n\t\t}\n\t}", 1)
	}
	p, err := e.startCaddy(name, *flagCaddy, global+edgeSite(port, audTemplate, storeBlock, extra))
	if err != nil {
		return nil, err
	}
	le := &largeEdge{proc: p, admin: admin, port: port, backend: backend, seg: l, e: e}
	if err := waitHTTP(p, fmt.Sprintf("http://127.0.0.1:%d/", port)); err != nil {
		return nil, err
	}
	// A HEAD reads the record (opening the store connection) but never
	// the bytes: the idle baseline includes the store connection.
	req, _ := http.NewRequest(http.MethodHead, le.url(0), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("%s: HEAD answered %d", name, resp.StatusCode)
	}
	time.Sleep(300 * time.Millisecond)
	return le, nil
}

// url is the large segment's URL with the i-th client's own token.
func (le *largeEdge) url(i int) string {
	return segURL(le.port, le.seg.id, le.e.token(le.seg.id, time.Now().Add(time.Hour+time.Duration(i)*time.Second)))
}

// storeReads is what this edge read of the segment's bytes from the
// store: S3 object GETs in versitygw's access log, or for SQLite the
// disk tier's fills (each one store read of the bytes).
func (le *largeEdge) storeReads() int {
	if le.backend == "s3" {
		time.Sleep(200 * time.Millisecond) // let versitygw flush its log
		return countLog(le.e.gw.AccessLog, "s3_GetObject", s3.ObjectKey("", le.seg.id))
	}
	n, _ := metricSum(le.admin, "caddy_syncular_disk_fills_total")
	return int(n)
}

// metricSum sums every series of the metric name on the admin endpoint.
func metricSum(admin int, name string) (float64, error) {
	// No keep-alive: (f) counts the edge's open fds, this request's
	// connection must not be among them.
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", admin), nil)
	if err != nil {
		return 0, err
	}
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		found = true
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	if !found {
		return 0, fmt.Errorf("no %s metric", name)
	}
	return sum, sc.Err()
}

// fdCount is the number of open file descriptors of pid.
func fdCount(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// fdTargets is where each open file descriptor of pid points.
func fdTargets(pid int) map[string]string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	out := map[string]string{}
	for _, e := range ents {
		t, _ := os.Readlink(filepath.Join(dir, e.Name()))
		out[e.Name()] = t
	}
	return out
}

// logWarnings logs the edge's last warning and error lines (why a client
// failed).
func logWarnings(p *proc, what string) {
	b, _ := os.ReadFile(p.log)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	for _, l := range lines {
		if len(l) > 600 {
			l = l[:600]
		}
		log.Printf("%s: edge log: %s", what, l)
	}
}

// errWrongBytes marks a body that differs from the segment: the bench
// stops on it.
var errWrongBytes = errors.New("wrong bytes")

// fetch downloads u and compares every byte with want as it arrives. It
// reads at most rate bytes/s (0: unlimited) and stops after limit (0:
// at the end of the body); a body that ends early or differs is an error,
// a differing byte wraps errWrongBytes. ttfb is the time to the first
// body byte.
func fetch(client *http.Client, u string, want []byte, rate int, limit time.Duration) (ttfb time.Duration, n int, err error) {
	t0 := time.Now()
	resp, err := client.Get(u)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	buf := make([]byte, 64<<10)
	for {
		if limit > 0 && time.Since(t0) >= limit {
			return ttfb, n, nil
		}
		chunk := buf
		if rate > 0 {
			chunk = buf[:min(len(buf), rate/16)]
		}
		m, rerr := resp.Body.Read(chunk)
		if m > 0 {
			if n == 0 {
				ttfb = time.Since(t0)
			}
			if n+m > len(want) || !bytes.Equal(chunk[:m], want[n:n+m]) {
				return ttfb, n, fmt.Errorf("%w at offset %d..%d", errWrongBytes, n, n+m)
			}
			n += m
		}
		if rerr == io.EOF {
			if n != len(want) {
				return ttfb, n, fmt.Errorf("body ended after %d of %d bytes", n, len(want))
			}
			return ttfb, n, nil
		}
		if rerr != nil {
			return ttfb, n, rerr
		}
		if rate > 0 {
			if ahead := time.Duration(float64(n)/float64(rate)*float64(time.Second)) - time.Since(t0); ahead > 0 {
				time.Sleep(ahead)
			}
		}
	}
}

// crowd is the outcome of clients downloading at once.
type crowd struct {
	clients, ok int
	took        time.Duration
	ttfb        []time.Duration // per client, in start order
	bytes       []int
	firstErr    error
	fails       map[string]int // failed clients by error text
	// clientCPU: the clients' CPU time (this process's, user + system)
	// per answered client, ms, when measured (cpuCrowd).
	clientCPU float64
}

// runCrowd starts n clients at once (after delay(i) each), the i-th on
// urlOf(i), and waits for all. A wrong byte is returned as an error.
func runCrowd(n int, urlOf func(int) string, want []byte, rate int, limit time.Duration, delay func(int) time.Duration) (*crowd, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true, DisableKeepAlives: limit > 0}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 3 * time.Minute}
	c := &crowd{clients: n, ttfb: make([]time.Duration, n), bytes: make([]int, n), fails: map[string]int{}}
	urls := make([]string, n)
	for i := range n {
		urls[i] = urlOf(i) // tokens signed before the clock starts
	}
	gate := make(chan struct{})
	var ok atomic.Int64
	var wrong atomic.Value
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			if delay != nil {
				time.Sleep(delay(i))
			}
			ttfb, got, err := fetch(client, urls[i], want, rate, limit)
			c.ttfb[i], c.bytes[i] = ttfb, got
			if err == nil {
				ok.Add(1)
				return
			}
			if errors.Is(err, errWrongBytes) {
				wrong.CompareAndSwap(nil, err)
			}
			mu.Lock()
			msg := err.Error()
			if len(msg) > 80 {
				msg = msg[:80]
			}
			c.fails[msg]++
			if c.firstErr == nil {
				c.firstErr = err
			}
			mu.Unlock()
		}()
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	c.took = time.Since(t0)
	c.ok = int(ok.Load())
	if err, _ := wrong.Load().(error); err != nil {
		return c, err
	}
	return c, nil
}

// budgetKiB is the RSS target over the idle edge: the bytes cache
// (default max_bytes 64 MiB) plus 32 MiB.
const budgetKiB = (64 + 32) << 10

func mib(kib int64) float64 { return float64(kib) / 1024 }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func durMs(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}
