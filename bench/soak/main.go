// Command soak runs the real edge (bin/caddy) for a while under mixed
// traffic, with a SQLite site (serve, memory cache, disk tier) and an S3
// proxy site (versitygw), and checks that it comes back: every body it
// answers has the segment's bytes, and after an idle period its file
// descriptors, goroutines and anonymous memory are back within stated
// bounds of the baseline. `make soak` runs it (SOAK_DURATION, default
// 10m); it is not part of `make test`.
//
// Traffic: whole bodies (memory and disk hits), Range requests,
// conditional requests (304), compressed answers (gzip, decoded and
// hashed), misses (ids no store holds), refusals (bad and expired
// tokens), S3 proxy streams, stalled readers on S3 proxy streams that
// then finish or drop. Events: two config reloads, a 5 s store freeze
// (versitygw SIGSTOPped), and a disk-tier file corrupted in place with
// its mtime set back, which must be discarded and refilled. After the
// idle sample, a burst of stalled S3 streams that leave at once
// (burst.go).
package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	s3store "github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/token"
)

var (
	flagDuration = flag.Duration("duration", 10*time.Minute, "how long the traffic runs")
	flagIdle     = flag.Duration("idle", 60*time.Second, "idle time after the traffic before the after-sample")
	flagWorkers  = flag.Int("workers", 12, "request loops")
	flagStalls   = flag.Int("stalls", 6, "stalled-reader loops on S3 proxy streams")
	flagCaddy    = flag.String("caddy", "bin/caddy", "the edge binary")
	flagKeep     = flag.Bool("keep", false, "keep the work directory (logs, heap profile)")
	flagBurst    = flag.Int("burst", 200, "after the idle sample: this many stalled S3 proxy streams at once (burst.go; 0: none)")
)

// Bounds checked after the idle period, against the baseline taken after
// a warm-up. The memory bound allows the memory cache's max_bytes (64 MiB
// default: the cache keeps what it holds) plus 64 MiB of Go heap the
// runtime has not returned yet and SQLite's and pools' buffers.
const (
	boundFDs        = 16
	boundGoroutines = 16
	cacheMaxBytes   = 64 << 20
	boundAnonSlack  = 64 << 20
)

const (
	partition   = "p1"
	templateAud = "aud:{partition}"
)

var scopeDigest = hex.EncodeToString(bytes.Repeat([]byte{0xaa}, 32))

type segment struct {
	id string
	b  []byte
}

type soak struct {
	dir      string
	key      []byte
	keyText  string
	gw       *s3test.Server
	sqlSegs  []segment
	big      segment // the disk tier's file to corrupt
	s3Segs   []segment
	stallSeg segment
	cfgPath  string
	admin    int
	sqlPort  int
	s3Port   int
	s3Stream int // an S3 proxy site that keeps no bytes: every answer streams from S3 (burst.go)
	cmd      *exec.Cmd
	client   *http.Client
	stalls   *http.Client
	frozen   atomic.Bool
	// corruptAt, corruptEnd: when the disk-tier file was being changed
	// (UnixNano; 0: not yet).
	corruptAt, corruptEnd atomic.Int64
	reloadStep            int

	requests, wrong, unexpected, shed, transport, drops, inFlightCorrupt atomic.Int64
	mu                                                                   sync.Mutex
	samples                                                              []string
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	if err := run(); err != nil {
		log.Fatalf("soak: FAIL: %v", err)
	}
}

func run() error {
	dir, err := os.MkdirTemp("", "syncular-soak-")
	if err != nil {
		return err
	}
	s := &soak{dir: dir}
	defer func() {
		s.stop()
		if s.gw != nil {
			s.gw.Stop()
		}
		if *flagKeep {
			log.Printf("soak: work directory kept: %s", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()
	if err := s.setup(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	tr := func() *http.Transport {
		return &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true, ResponseHeaderTimeout: 30 * time.Second}
	}
	s.client = &http.Client{Transport: tr(), Timeout: 60 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	s.stalls = &http.Client{Transport: tr(), Timeout: 60 * time.Second}

	// Warm up: one of each action, then the baseline after a pause.
	for i := range 40 {
		s.action(i % numActions)
	}
	s.client.CloseIdleConnections()
	time.Sleep(5 * time.Second)
	base, err := s.sample()
	if err != nil {
		return err
	}
	log.Printf("soak: baseline %s", base)

	ctx, cancel := context.WithTimeout(context.Background(), *flagDuration)
	defer cancel()
	var wg sync.WaitGroup
	for range *flagWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				s.action(mrand.IntN(numActions))
			}
		}()
	}
	for range *flagStalls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				s.stalledReader()
			}
		}()
	}
	peak := base
	events := s.events(*flagDuration)
	tick := time.NewTicker(2 * time.Second)
	startAt := time.Now()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			el := time.Since(startAt)
			for len(events) > 0 && el >= events[0].at {
				ev := events[0]
				events = events[1:]
				log.Printf("soak: %s: %s", el.Round(time.Second), ev.name)
				if err := ev.do(); err != nil {
					cancel()
					wg.Wait()
					return fmt.Errorf("%s: %w", ev.name, err)
				}
			}
			if sm, err := s.sample(); err == nil {
				peak = peak.max(sm)
			}
		}
	}
	tick.Stop()
	wg.Wait()
	s.client.CloseIdleConnections()
	s.stalls.CloseIdleConnections()
	end, _ := s.sample()
	peak = peak.max(end)
	log.Printf("soak: traffic over after %v: %d requests; idling %v", *flagDuration, s.requests.Load(), *flagIdle)
	time.Sleep(*flagIdle)
	after, err := s.sample()
	if err != nil {
		return err
	}
	heap := s.heapStats()
	discarded, _ := s.metric("caddy_syncular_disk_discarded_total")
	var burst *burstResult
	if *flagBurst > 0 {
		if burst, err = s.burst(*flagBurst, after); err != nil {
			return fmt.Errorf("burst: %w", err)
		}
	}

	fmt.Printf("\nsoak: %v of traffic, %d workers, %d stalled-reader loops, %v idle\n", *flagDuration, *flagWorkers, *flagStalls, *flagIdle)
	fmt.Printf("requests %d (503/504 shed: %d, stalled streams dropped: %d), wrong bytes %d, unexpected answers %d, transport errors %d\n",
		s.requests.Load(), s.shed.Load(), s.drops.Load(), s.wrong.Load(), s.unexpected.Load(), s.transport.Load())
	fmt.Printf("disk-tier files discarded (changed since verified): %.0f; answers in flight from that file when it changed: %d\n", discarded, s.inFlightCorrupt.Load())
	fmt.Printf("%-12s %12s %12s %12s\n", "", "baseline", "peak", "after idle")
	fmt.Printf("%-12s %12s %12s %12s\n", "RSS", mib(base.rss), mib(peak.rss), mib(after.rss))
	fmt.Printf("%-12s %12s %12s %12s\n", "anon", mib(base.anon), mib(peak.anon), mib(after.anon))
	fmt.Printf("%-12s %12d %12d %12d\n", "fds", base.fds, peak.fds, after.fds)
	fmt.Printf("%-12s %12d %12d %12d\n", "goroutines", base.goroutines, peak.goroutines, after.goroutines)
	fmt.Printf("after idle, Go runtime (admin /debug/pprof/heap?debug=1): %s\n", heap)

	var fails []string
	if n := s.wrong.Load(); n > 0 {
		fails = append(fails, fmt.Sprintf("%d answers with wrong bytes (%s)", n, strings.Join(s.samples, "; ")))
	}
	if n := s.unexpected.Load(); n > 0 {
		fails = append(fails, fmt.Sprintf("%d unexpected answers (%s)", n, strings.Join(s.samples, "; ")))
	}
	if n := s.transport.Load(); n*1000 > s.requests.Load() {
		fails = append(fails, fmt.Sprintf("%d transport errors, above 0.1%% of requests (%s)", n, strings.Join(s.samples, "; ")))
	}
	if discarded < 1 {
		fails = append(fails, "the corrupted disk-tier file was never discarded")
	}
	if after.fds > base.fds+boundFDs {
		fails = append(fails, fmt.Sprintf("fds %d after idle, bound baseline+%d = %d", after.fds, boundFDs, base.fds+boundFDs))
	}
	if after.goroutines > base.goroutines+boundGoroutines {
		fails = append(fails, fmt.Sprintf("goroutines %d after idle, bound baseline+%d = %d", after.goroutines, boundGoroutines, base.goroutines+boundGoroutines))
	}
	if bound := base.anon + cacheMaxBytes + boundAnonSlack; after.anon > bound {
		fails = append(fails, fmt.Sprintf("anon memory %s after idle, bound baseline + max_bytes + %s = %s", mib(after.anon), mib(boundAnonSlack), mib(bound)))
	}
	if burst != nil {
		burst.print()
		fails = append(fails, burst.fails()...)
	}
	if len(s.samples) > 0 {
		fmt.Printf("notes: %s\n", strings.Join(s.samples, "; "))
	}
	fmt.Printf("bounds after idle: fds <= baseline+%d, goroutines <= baseline+%d, anon <= baseline + cache max_bytes (%s) + %s\n",
		boundFDs, boundGoroutines, mib(cacheMaxBytes), mib(boundAnonSlack))
	if len(fails) > 0 {
		return errors.New(strings.Join(fails, "; "))
	}
	fmt.Println("soak: PASS")
	return nil
}

// setup writes the segments: SQLite (small compressible, random, and one
// big one for the disk tier) and S3 (proxy streams and a stalled one).
func (s *soak) setup() error {
	s.key = make([]byte, 32)
	rand.Read(s.key)
	s.keyText = "hex:" + hex.EncodeToString(s.key)

	db := filepath.Join(s.dir, "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	pub := store.Publication{Partition: partition, LogEpoch: "e1", Table: "tasks", ScopeDigest: scopeDigest,
		AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000}
	sizes := []int{2 << 10, 64 << 10, 300 << 10, 1 << 20}
	for i := range 24 {
		b := body(sizes[i%len(sizes)], i%2 == 0, i)
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: pub})
		if err != nil {
			w.Close()
			return err
		}
		s.sqlSegs = append(s.sqlSegs, segment{id, b})
	}
	big := body(12<<20, false, 100) // above max_entry (8 MiB): the disk tier
	id, err := w.Put(seed.SegmentInput{Bytes: big, Publication: pub})
	if err != nil {
		w.Close()
		return err
	}
	s.big = segment{id, big}
	if err := w.SetEpoch(partition, "e1", now); err != nil {
		w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}

	gw, err := s3test.Launch(filepath.Join(s.dir, "s3"), s3test.WithKeepAlive())
	if err != nil {
		return err
	}
	s.gw = gw
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := gw.Client()
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("segments")}); err != nil {
		return err
	}
	put := func(b []byte) (segment, error) {
		id := seed.SegmentID(b)
		p := pub
		p.ByteLength, p.MediaType, p.SchemaVersion = int64(len(b)), "rows", 1
		rec := seed.S3Record(id, p)
		for _, in := range []*s3.PutObjectInput{
			{Bucket: aws.String("segments"), Key: aws.String(s3store.ObjectKey("", id)), Body: bytes.NewReader(b), ContentLength: aws.Int64(int64(len(b)))},
			{Bucket: aws.String("segments"), Key: aws.String(s3store.RecordKey("", id)), Body: bytes.NewReader(rec), ContentLength: aws.Int64(int64(len(rec)))},
		} {
			if _, err := c.PutObject(ctx, in); err != nil {
				return segment{}, err
			}
		}
		return segment{id, b}, nil
	}
	for i := range 8 {
		sg, err := put(body(sizes[i%len(sizes)], i%2 == 0, 200+i))
		if err != nil {
			return err
		}
		s.s3Segs = append(s.s3Segs, sg)
	}
	s.stallSeg, err = put(body(4<<20, false, 300))
	return err
}

// body is n bytes: text that compresses (rows of JSON) or random bytes.
func body(n int, text bool, seedN int) []byte {
	b := make([]byte, 0, n)
	if !text {
		b = b[:n]
		rand.Read(b)
		return b
	}
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, `{"id":%d,"seed":%d,"title":"task %d","done":%v}`+"\n", i, seedN, i*7, i%3 == 0)
	}
	return b[:n]
}

// config is the Caddyfile; step changes a harmless setting so that each
// reload loads a new config.
func (s *soak) config(step int) string {
	status := ""
	if step%2 == 1 {
		status = "cache_status on"
	}
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	default_bind 127.0.0.1
	persist_config off
	auto_https off
}
http://127.0.0.1:%d {
	syncular_segments /sync/segments/* {
		key {env.SOAK_SEGMENT_KEY}
		audience template %s
		store sqlite %s
		untokened reject
		%s
		cache {
			disk %s
		}
	}
}
`, s.admin, s.sqlPort, templateAud, filepath.Join(s.dir, "sync.db"), status, filepath.Join(s.dir, "disk")) +
		s.s3Site(s.s3Port, status) +
		s.s3Site(s.s3Stream, "cache {\n\t\t\tmax_entry 1MiB\n\t\t\tdisk off\n\t\t}")
}

// s3Site is a proxy site of the S3 store on port; extra goes in the
// handler block.
func (s *soak) s3Site(port int, extra string) string {
	return fmt.Sprintf(`http://127.0.0.1:%d {
	syncular_segments /sync/segments/* {
		key {env.SOAK_SEGMENT_KEY}
		audience template %s
		store s3 {
			bucket segments
			region %s
			endpoint %s
			access_key_id {env.SOAK_S3_AK}
			secret_access_key {env.SOAK_S3_SK}
		}
		delivery proxy
		untokened reject
		%s
	}
}
`, port, templateAud, s.gw.Region, s.gw.Endpoint, extra)
}

func (s *soak) start() error {
	s.admin, s.sqlPort, s.s3Port, s.s3Stream = freePort(), freePort(), freePort(), freePort()
	s.cfgPath = filepath.Join(s.dir, "Caddyfile")
	if err := os.WriteFile(s.cfgPath, []byte(s.config(0)), 0o600); err != nil {
		return err
	}
	out, err := os.Create(filepath.Join(s.dir, "caddy.log"))
	if err != nil {
		return err
	}
	defer out.Close()
	home := filepath.Join(s.dir, "home")
	s.cmd = exec.Command(*flagCaddy, "run", "--config", s.cfgPath, "--adapter", "caddyfile")
	s.cmd.Env = append(os.Environ(), "SOAK_SEGMENT_KEY="+s.keyText, "SOAK_S3_AK="+s.gw.AccessKey, "SOAK_S3_SK="+s.gw.SecretKey,
		"HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_DATA_HOME="+home)
	s.cmd.Stdout, s.cmd.Stderr = out, out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", s.sqlPort))
		if err == nil {
			resp.Body.Close()
			resp2, err2 := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", s.s3Port))
			if err2 == nil {
				resp2.Body.Close()
				return nil
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(s.dir, "caddy.log"))
			return fmt.Errorf("the edge did not start: %s", tail(b))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *soak) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

type event struct {
	at   time.Duration
	name string
	do   func() error
}

// events: a reload at 1/4 and 3/4 of the run, the store freeze at 1/2,
// the disk-tier corruption at 3/5.
func (s *soak) events(d time.Duration) []event {
	return []event{
		{d / 4, "reload 1", s.reload},
		{d / 2, "s3 store frozen 5s (SIGSTOP)", s.freeze},
		{d * 3 / 5, "disk-tier file: 4 KiB overwritten, mtime set back", s.corrupt},
		{d * 3 / 4, "reload 2", s.reload},
	}
}

func (s *soak) reload() error {
	s.reloadStep++
	if err := os.WriteFile(s.cfgPath, []byte(s.config(s.reloadStep)), 0o600); err != nil {
		return err
	}
	out, err := exec.Command(*flagCaddy, "reload", "--config", s.cfgPath, "--adapter", "caddyfile",
		"--address", fmt.Sprintf("127.0.0.1:%d", s.admin)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, tail(out))
	}
	return nil
}

func (s *soak) freeze() error {
	s.frozen.Store(true)
	if err := s.gw.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	time.Sleep(5 * time.Second)
	err := s.gw.Signal(syscall.SIGCONT)
	go func() { time.Sleep(5 * time.Second); s.frozen.Store(false) }()
	return err
}

func (s *soak) corrupt() error {
	// Make sure the big segment is on disk first.
	s.get(s.sqlPort, s.big, nil)
	key := strings.TrimPrefix(s.big.id, "sha256:")
	p := filepath.Join(s.dir, "disk", key[:2], key)
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("the disk tier holds no file for the big segment: %w", err)
	}
	s.corruptAt.Store(time.Now().UnixNano())
	defer func() { s.corruptEnd.Store(time.Now().UnixNano()) }()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	junk := make([]byte, 4<<10)
	rand.Read(junk)
	_, err = f.WriteAt(junk, 1<<20)
	f.Close()
	if err != nil {
		return err
	}
	return os.Chtimes(p, fi.ModTime(), fi.ModTime())
}

const numActions = 9

// action runs one request of kind k and checks its answer.
func (s *soak) action(k int) {
	seg := s.sqlSegs[mrand.IntN(len(s.sqlSegs))]
	switch k {
	case 0: // whole body, memory cache
		s.get(s.sqlPort, seg, nil)
	case 1: // the big segment: the disk tier
		s.get(s.sqlPort, s.big, nil)
	case 2: // a Range
		b := s.big
		if mrand.IntN(2) == 0 {
			b = seg
		}
		from := mrand.IntN(len(b.b))
		to := min(len(b.b)-1, from+mrand.IntN(256<<10))
		s.get(s.sqlPort, b, map[string]string{"Range": fmt.Sprintf("bytes=%d-%d", from, to)})
	case 3: // conditional
		s.get(s.sqlPort, seg, map[string]string{"If-None-Match": `"` + seg.id + `"`})
	case 4: // compressed
		s.get(s.sqlPort, seg, map[string]string{"Accept-Encoding": "gzip"})
	case 5: // a miss: an id no store holds
		var x [32]byte
		rand.Read(x[:])
		s.expect(s.sqlPort, segment{id: "sha256:" + hex.EncodeToString(x[:])}, s.token, 404)
	case 6: // refusals: a token for another segment, an expired one
		other := s.sqlSegs[(mrand.IntN(len(s.sqlSegs)-1)+1+indexOf(s.sqlSegs, seg))%len(s.sqlSegs)]
		s.expect(s.sqlPort, seg, func(string) string { return s.token(other.id) }, 403)
		s.expect(s.s3Port, s.s3Segs[0], func(id string) string {
			return token.Sign(s.key, id, scopeDigest, "aud:"+partition, time.Now().Add(-time.Hour).Unix())
		}, 401, 403, 404)
	case 7, 8: // S3 proxy, whole or ranged
		sg := s.s3Segs[mrand.IntN(len(s.s3Segs))]
		if k == 7 {
			s.get(s.s3Port, sg, nil)
		} else {
			from := mrand.IntN(len(sg.b))
			s.get(s.s3Port, sg, map[string]string{"Range": fmt.Sprintf("bytes=%d-", from)})
		}
	}
}

func indexOf(segs []segment, s segment) int {
	for i := range segs {
		if segs[i].id == s.id {
			return i
		}
	}
	return 0
}

func (s *soak) token(id string) string {
	return token.Sign(s.key, id, scopeDigest, "aud:"+partition, time.Now().Add(time.Hour).Unix())
}

func (s *soak) url(port int, id, tok string) string {
	return fmt.Sprintf("http://127.0.0.1:%d/sync/segments/%s?st=%s", port, id, url.QueryEscape(tok))
}

// get requests seg and checks the answer's bytes against it.
func (s *soak) get(port int, seg segment, hdr map[string]string) {
	s.requests.Add(1)
	began := time.Now().UnixNano()

	req, _ := http.NewRequest(http.MethodGet, s.url(port, seg.id, s.token(seg.id)), nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.transportErr(err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		if resp.StatusCode == 200 || resp.StatusCode == 206 {
			// A body cut short: the edge aborts a stream whose bytes do
			// not verify, or the store froze mid-stream.
			s.transportErr(fmt.Errorf("%d body: %w", resp.StatusCode, err))
		}
		return
	}
	switch resp.StatusCode {
	case 200:
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(b))
			if err == nil {
				b, err = io.ReadAll(zr)
			}
			if err != nil {
				s.wrongBody(seg, began, "gzip: "+err.Error())
				return
			}
		}
		if !bytes.Equal(b, seg.b) {
			s.wrongBody(seg, began, fmt.Sprintf("200 for %s: %d bytes, not the segment", seg.id[:15], len(b)))
		}
	case 206:
		var from, to int
		if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes %d-%d/", &from, &to); err != nil || to >= len(seg.b) || !bytes.Equal(b, seg.b[from:to+1]) {
			s.wrongBody(seg, began, fmt.Sprintf("206 %q: %d bytes, not the segment's", resp.Header.Get("Content-Range"), len(b)))
		}
	case 304:
		if hdr["If-None-Match"] == "" {
			s.unexpectedAnswer(fmt.Sprintf("304 without a condition (%s)", seg.id[:15]))
		}
	case 503, 504:
		s.shed.Add(1)
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/") {
			s.unexpectedAnswer(fmt.Sprintf("%d without a JSON body", resp.StatusCode))
		}
	default:
		s.unexpectedAnswer(fmt.Sprintf("%d for a granted GET: %.200s", resp.StatusCode, b))
	}
}

// expect requests id with the token tok(id) and wants one of codes (or
// 503/504, shed).
func (s *soak) expect(port int, seg segment, tok func(string) string, codes ...int) {
	s.requests.Add(1)
	resp, err := s.client.Get(s.url(port, seg.id, tok(seg.id)))
	if err != nil {
		s.transportErr(err)
		return
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	for _, c := range codes {
		if resp.StatusCode == c {
			return
		}
	}
	if resp.StatusCode == 503 || resp.StatusCode == 504 {
		s.shed.Add(1)
		return
	}
	s.unexpectedAnswer(fmt.Sprintf("%d, want %v: %.200s", resp.StatusCode, codes, b))
}

// stalledReader opens the 4 MiB S3 proxy stream, reads 64 KiB, stalls 2 to
// 8 s, then drops it or reads the rest and checks it.
func (s *soak) stalledReader() {
	s.requests.Add(1)
	resp, err := s.stalls.Get(s.url(s.s3Port, s.stallSeg.id, s.token(s.stallSeg.id)))
	if err != nil {
		s.transportErr(err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode == 503 || resp.StatusCode == 504 {
			s.shed.Add(1)
			return
		}
		s.unexpectedAnswer(fmt.Sprintf("stalled stream: %d", resp.StatusCode))
		return
	}
	h := sha256.New()
	if _, err := io.CopyN(h, resp.Body, 64<<10); err != nil {
		s.transportErr(err)
		return
	}
	time.Sleep(time.Duration(2000+mrand.IntN(6000)) * time.Millisecond)
	if mrand.IntN(2) == 0 {
		s.drops.Add(1)
		return // dropped mid-stream
	}
	if _, err := io.Copy(h, resp.Body); err != nil {
		if !s.frozen.Load() {
			s.transportErr(fmt.Errorf("stalled stream: %w", err))
		}
		return
	}
	if "sha256:"+hex.EncodeToString(h.Sum(nil)) != s.stallSeg.id {
		s.wrongBytes("stalled stream: wrong bytes")
	}
}

func (s *soak) note(msg string) {
	s.mu.Lock()
	if len(s.samples) < 5 {
		s.samples = append(s.samples, msg)
	}
	s.mu.Unlock()
}

// wrongBody counts an answer with wrong bytes, apart when it is the
// disk-tier file's segment and the request began before the file's
// change ended: an answer already being sent from the file when it
// changed carries the change (docs/large-segments.md: the check is made
// when the file is opened for a response).
func (s *soak) wrongBody(seg segment, began int64, msg string) {
	if seg.id == s.big.id && s.corruptAt.Load() != 0 {
		end := s.corruptEnd.Load()
		if end == 0 || began <= end {
			s.inFlightCorrupt.Add(1)
			s.note("in flight at the change: " + msg)
			return
		}
	}
	s.wrongBytes(msg)
}

func (s *soak) wrongBytes(msg string)       { s.wrong.Add(1); s.note("wrong bytes: " + msg) }
func (s *soak) unexpectedAnswer(msg string) { s.unexpected.Add(1); s.note(msg) }
func (s *soak) transportErr(err error) {
	if s.frozen.Load() {
		s.shed.Add(1) // a stream cut by the store freeze
		return
	}
	s.transport.Add(1)
	s.note(err.Error())
}

// procSample is the edge process's state at one moment.
type procSample struct {
	rss, anon       int64 // bytes
	fds, goroutines int
}

func (p procSample) String() string {
	return fmt.Sprintf("RSS %s, anon %s, fds %d, goroutines %d", mib(p.rss), mib(p.anon), p.fds, p.goroutines)
}

func (p procSample) max(q procSample) procSample {
	return procSample{max(p.rss, q.rss), max(p.anon, q.anon), max(p.fds, q.fds), max(p.goroutines, q.goroutines)}
}

// sample reads RSS and anonymous memory (/proc/PID/status), open fds
// (/proc/PID/fd) and goroutines (go_goroutines on the admin endpoint).
func (s *soak) sample() (procSample, error) {
	pid := s.cmd.Process.Pid
	var p procSample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return p, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			p.rss = kb << 10
		case "RssAnon:":
			p.anon = kb << 10
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return p, err
	}
	p.fds = len(ents)
	g, err := s.metric("go_goroutines")
	p.goroutines = int(g)
	return p, err
}

// metric sums every series of name on the admin /metrics endpoint, on a
// connection of its own (closed: not counted among the fds).
func (s *soak) metric(name string) (float64, error) {
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", s.admin), nil)
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
		rest, ok := strings.CutPrefix(sc.Text(), name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("no %s on /metrics", name)
	}
	return sum, sc.Err()
}

// heapStats is the Go runtime's memory figures from the admin API's heap
// profile (debug=1 ends with runtime.MemStats), and saves the profile.
func (s *soak) heapStats() string {
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?debug=1", s.admin), nil)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	os.WriteFile(filepath.Join(s.dir, "heap-after-idle.txt"), b, 0o644)
	want := []string{"HeapAlloc", "HeapInuse", "HeapIdle", "HeapReleased", "Sys"}
	vals := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		for _, w := range want {
			if v, ok := strings.CutPrefix(line, "# "+w+" = "); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				vals[w] = mib(n)
			}
		}
	}
	var out []string
	for _, w := range want {
		out = append(out, w+" "+vals[w])
	}
	return strings.Join(out, ", ")
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
