package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/segdata"
	"github.com/syncular/caddy-syncular/store"
)

var (
	flagStormClients = flag.Int("storm-clients", 100, "clients arriving together in (l)")
	flagStormAccept  = flag.String("storm-accept", "gzip, deflate, br, zstd;gzip", "the crowds of (l): their `Accept-Encoding` values, separated by ';'")
	flagStormRounds  = flag.Int("storm-rounds", 1, "rounds of (l): each crowd runs once per round on its own fresh edge, the order reversed every other round")
)

// stormCodingRun is one crowd of (l): a fresh edge, cold, every client
// sending the same Accept-Encoding.
type stormCodingRun struct {
	accept            string
	round             int
	clients, ok       int
	fails             []string
	identity          int64 // segment bytes
	wire              int64 // body bytes received, all clients
	coded, growing    int   // answers with a Content-Encoding; of them, without a length
	byCoding          map[string]int
	firstByte         []float64 // s, from the release of the crowd to each client's first body byte
	headers           []float64 // s, from the release of the crowd to each client's response headers
	took              time.Duration
	storeReads        int
	rssIdle, rssPeak  int64 // KiB
	verified, bodiesN int   // distinct bodies decoded and hashed; bodies checked against them
}

// compressStormScenario is (l): *flagStormClients clients arrive together
// on a cold edge (empty disk directory) for one compressible 64 MiB
// SQLite image; once with a browser's Accept-Encoding, once with gzip
// only. Wire bytes against as many identity answers, store reads, the
// first byte of every client, peak RSS. Every body is checked: each
// client hashes the bytes it received; one body per distinct hash is
// kept, decoded and hashed against the segment id.
func compressStormScenario(e *env, rep *report) error {
	dir := filepath.Join(e.dir, "compress-storm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var img []byte
	for n := 155_000; len(img) < largeSize; n += 10_000 { // 150,000 rows: 66.6 MB
		log.Printf("(l) building a %d-row SQLite image", n)
		sub := filepath.Join(dir, fmt.Sprintf("img-%d", n))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		var err error
		if img, err = segdata.SQLiteImage(sub, n); err != nil {
			return err
		}
	}
	log.Printf("(l) SQLite image: %d bytes", len(img))
	dbPath := filepath.Join(dir, "storm.db")
	w, err := seed.Create(dbPath, 3)
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	id, err := w.Put(seed.SegmentInput{Bytes: img, Publication: store.Publication{
		Partition: partition, LogEpoch: "e1", Table: "tasks", ScopeDigest: scopeDigest,
		AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
	}})
	if err == nil {
		err = w.SetEpoch(partition, "e1", now)
	}
	w.Close()
	if err != nil {
		return err
	}
	accepts := strings.Split(*flagStormAccept, ";")
	var runs []*stormCodingRun
	for round := range max(1, *flagStormRounds) {
		for j := range accepts {
			i := j
			if round%2 == 1 { // ABBA: neither crowd always runs first
				i = len(accepts) - 1 - j
			}
			accept := strings.TrimSpace(accepts[i])
			r, err := e.compressStormRun(fmt.Sprintf("compress-storm-%d-%d", round, i), dbPath, id, img, accept)
			if err != nil {
				return err
			}
			r.round = round + 1
			runs = append(runs, r)
		}
	}
	rep.addSection(func(w func(string, ...any)) { compressStormMarkdown(w, runs) })
	return nil
}

func (e *env) compressStormRun(name, dbPath, id string, img []byte, accept string) (*stormCodingRun, error) {
	admin, port := freePort(), freePort()
	extra := fmt.Sprintf("delivery serve\n\t\tcache {\n\t\t\tdisk %s\n\t\t}", filepath.Join(e.dir, name+"-disk"))
	p, err := e.startCaddy(name, *flagCaddy, fmt.Sprintf(globalOpts, admin)+edgeSite(port, audTemplate, "store sqlite "+dbPath, extra))
	if err != nil {
		return nil, err
	}
	defer p.stop()
	if err := waitHTTP(p, fmt.Sprintf("http://127.0.0.1:%d/", port)); err != nil {
		return nil, err
	}
	urlOf := func(i int) string {
		return segURL(port, id, e.token(id, time.Now().Add(time.Hour+time.Duration(i)*time.Second)))
	}
	// A HEAD reads the record (and opens the store) but not the bytes.
	req, _ := http.NewRequest(http.MethodHead, urlOf(0), nil)
	if resp, err := rawHTTP.Do(req); err != nil {
		return nil, err
	} else if resp.Body.Close(); resp.StatusCode != 200 {
		return nil, fmt.Errorf("%s: HEAD answered %d", name, resp.StatusCode)
	}
	time.Sleep(300 * time.Millisecond)
	r := &stormCodingRun{accept: accept, clients: *flagStormClients, identity: int64(len(img)), byCoding: map[string]int{}}
	r.rssIdle, _ = procStatus(p.pid(), "VmRSS")
	reads0, err := metricSum(admin, "caddy_syncular_disk_fills_total")
	if err != nil {
		return nil, err
	}

	type body struct {
		coding string
		sum    string
	}
	var (
		mu     sync.Mutex
		kept   = map[body][]byte{} // one body per distinct (coding, wire hash)
		bodies []body
	)
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: r.clients}}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var t0 time.Time
	for i := range r.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest("GET", urlOf(i), nil)
			if err != nil {
				panic(err)
			}
			req.Header.Set("Accept-Encoding", accept)
			<-start
			fail := func(err error) {
				mu.Lock()
				r.fails = append(r.fails, err.Error())
				mu.Unlock()
			}
			resp, err := client.Do(req)
			if err != nil {
				fail(err)
				return
			}
			headers := time.Since(t0)
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				fail(fmt.Errorf("status %d", resp.StatusCode))
				return
			}
			h := sha256.New()
			buf := make([]byte, 256<<10)
			var first time.Duration
			var n int64
			var keep *bytes.Buffer
			mu.Lock()
			coding := resp.Header.Get("Content-Encoding")
			if len(kept) < 8 { // a body to decode, in case its hash is new
				keep = &bytes.Buffer{}
			}
			mu.Unlock()
			for {
				m, err := resp.Body.Read(buf)
				if m > 0 {
					if n == 0 {
						first = time.Since(t0)
					}
					n += int64(m)
					h.Write(buf[:m])
					if keep != nil {
						keep.Write(buf[:m])
					}
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					fail(err)
					return
				}
			}
			b := body{coding: coding, sum: hex.EncodeToString(h.Sum(nil))}
			mu.Lock()
			defer mu.Unlock()
			if _, ok := kept[b]; !ok && keep != nil {
				kept[b] = keep.Bytes()
			}
			bodies = append(bodies, b)
			r.ok++
			r.wire += n
			r.byCoding[coding]++
			if coding != "" {
				r.coded++
				if resp.ContentLength < 0 {
					r.growing++
				}
			}
			r.firstByte = append(r.firstByte, first.Seconds())
			r.headers = append(r.headers, headers.Seconds())
		}()
	}
	t0 = time.Now()
	close(start)
	prof := crowdProfiles(admin, name)
	wg.Wait()
	if err := prof(); err != nil {
		log.Printf("(l) %s: pprof: %v", name, err)
	}
	r.took = time.Since(t0)
	r.rssPeak, _ = procStatus(p.pid(), "VmHWM")
	reads1, err := metricSum(admin, "caddy_syncular_disk_fills_total")
	if err != nil {
		return nil, err
	}
	pass, _ := metricSum(admin, "caddy_syncular_cache_pass_through_total")
	r.storeReads = int(reads1 - reads0 + pass)
	// Every body: the same bytes as a kept one, which decodes to the
	// segment.
	want := id[len("sha256:"):]
	good := map[body]bool{}
	for b, raw := range kept {
		dec, err := decodeBody(b.coding, raw)
		if err != nil {
			return nil, fmt.Errorf("(l) %s: a %q body does not decode: %w", name, b.coding, err)
		}
		s := sha256.Sum256(dec)
		if hex.EncodeToString(s[:]) != want {
			return nil, fmt.Errorf("(l) %s: a %q body decodes to bytes that do not hash to the id", name, b.coding)
		}
		good[b] = true
		r.verified++
	}
	for _, b := range bodies {
		if !good[b] {
			return nil, fmt.Errorf("(l) %s: a %q body not checked (more than 8 distinct bodies)", name, b.coding)
		}
		r.bodiesN++
	}
	sort.Float64s(r.firstByte)
	log.Printf("(l) %q: %d/%d ok in %s, wire %.3f x identity, coded %v (%d growing), store reads %d, headers median %.0f ms, first byte median %.0f ms (min %.0f, p90 %.0f), RSS idle %.1f peak %.1f MiB, fails %v",
		accept, r.ok, r.clients, r.took.Round(time.Millisecond), r.ratio(), r.byCoding, r.growing, r.storeReads,
		median(r.headers)*1e3, median(r.firstByte)*1e3, r.firstByteAt(0)*1e3, r.firstByteAt(0.9)*1e3, mib(r.rssIdle), mib(r.rssPeak), r.fails)
	if r.ok < r.clients {
		logWarnings(p, name)
	}
	return r, nil
}

// firstByteAt is the q quantile of the first byte (r.firstByte sorted).
func (r *stormCodingRun) firstByteAt(q float64) float64 {
	n := len(r.firstByte)
	if n == 0 {
		return 0
	}
	return r.firstByte[min(n-1, int(float64(n)*q))]
}

// ratio is the wire bytes over as many identity answers.
func (r *stormCodingRun) ratio() float64 {
	if r.ok == 0 {
		return 0
	}
	return float64(r.wire) / (float64(r.ok) * float64(r.identity))
}

// decodeBody decodes a body per its Content-Encoding ("" is identity).
func decodeBody(coding string, b []byte) ([]byte, error) {
	switch coding {
	case "":
		return b, nil
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		return io.ReadAll(zr)
	}
	return nil, fmt.Errorf("Content-Encoding %q", coding)
}

func compressStormMarkdown(w func(string, ...any), runs []*stormCodingRun) {
	w("## (l) %d clients arriving together on a cold edge, a compressible 64 MiB SQLite image\n\n", *flagStormClients)
	w("A fresh edge (empty disk directory, the record read by one HEAD) answers a crowd released at once, every client sending the same `Accept-Encoding`: the variant is encoded as the disk tier's fill lands and the clients follow it. Wire = body bytes received by all clients / (clients × identity). Every body is checked: each client hashes what it received, and one body per distinct hash is decoded and hashed against the segment id. First byte: from the crowd's release to each client's first body byte. Store reads: disk fills plus pass-through streams. RSS: VmHWM over the edge's life against its idle VmRSS.\n\n")
	w("| round | Accept-Encoding | answered | codings | followed a growing variant | wire / identity | store reads | headers median | first byte median (p90) | wall time | RSS idle → peak | bodies checked (distinct decoded) |\n|---|---|---|---|---|---:|---|---|---|---:|---|---|\n")
	for _, r := range runs {
		w("| %d | `%s` | %d / %d | %v | %d | **%.3f×** (target ≤ 0.45: %s) | %d (target 1: %s) | %.0f ms | %.0f ms (%.0f ms; target ≤ 100 ms: %s) | %.2f s | %.1f → %.1f MiB | %d (%d) |\n",
			r.round, r.accept, r.ok, r.clients, r.byCoding, r.growing, r.ratio(), verdict(r.ratio() <= 0.45),
			r.storeReads, verdict(r.storeReads == 1), median(r.headers)*1e3, median(r.firstByte)*1e3, r.firstByteAt(0.9)*1e3, verdict(median(r.firstByte) <= 0.1),
			r.took.Seconds(), mib(r.rssIdle), mib(r.rssPeak), r.bodiesN, r.verified)
	}
	for _, r := range runs {
		if len(r.fails) > 0 {
			w("\n- `%s`: failed clients: %v", r.accept, r.fails)
		}
	}
	w("\n\n")
}
