// Command load is the side-by-side load benchmark behind `make bench`. It
// builds nothing (make built bin/caddy, bin/caddy-plain and installed
// versitygw and hey) and measures, in one run on this machine, over
// loopback only:
//
//	(a) serve: the edge serving a 256 KiB segment from SQLite (warm cache)
//	    against stock Caddy's file_server serving the same bytes from disk;
//	(b) redirect: the edge's 302 to a presigned S3 URL (record cached)
//	    against a stock Caddy `redir` of a URL of the same length;
//	(c) storm: 200 concurrent clients downloading one 8 MiB segment in
//	    proxy mode from a real S3 server (versitygw): bytes checked, object
//	    requests counted in versitygw's access log, the edge's peak RSS
//	    (VmHWM); once with the default cache and once with the bytes cache
//	    off, as a control;
//	(d) forged: 2,000 requests with forged tokens, counting the store
//	    requests they caused (versitygw access log; the edge's
//	    caddy_syncular_store_duration_seconds counts for SQLite).
//
// (a) and (b) alternate edge and plain runs (ABBA order) over several
// rounds and report medians and ratios: absolute numbers on shared
// machines drift. The report is printed as Markdown and, with -o, written
// to a file (bench/RESULTS.md).
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
)

var (
	flagCaddy   = flag.String("caddy", "bin/caddy", "Caddy with this module")
	flagPlain   = flag.String("plain", "bin/caddy-plain", "stock Caddy of the same version")
	flagGW      = flag.String("versitygw", ".tools/bin/versitygw", "versitygw binary")
	flagHey     = flag.String("hey", ".tools/bin/hey", "hey binary")
	flagRounds  = flag.Int("rounds", 7, "rounds of (a) and (b)")
	flagDur     = flag.Duration("dur", 4*time.Second, "length of one hey run")
	flagConc    = flag.Int("c", 32, "hey concurrency for (a) and (b)")
	flagClients = flag.Int("clients", 200, "concurrent clients in (c)")
	flagForged  = flag.Int("forged", 2000, "forged-token requests in (d)")
	flagOut     = flag.String("o", "", "also write the Markdown report to this file")
	flagPprof   = flag.String("pprof", "", "save CPU profiles of the edge during the first round's edge runs of (a) and (b) into this directory")
)

const (
	bucket    = "segments"
	partition = "p1"
	region    = "us-east-1"
	serveSize = 256 << 10
	stormSize = 8 << 20
)

var scopeDigest = strings.Repeat("a", 64)

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	if err := run(); err != nil {
		cleanup()
		log.Fatalf("bench: %v", err)
	}
	cleanup()
}

// ---- process management -------------------------------------------------

var (
	procsMu sync.Mutex
	procs   []*proc
)

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func start(name, bin string, args, env []string, dir string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); close(p.done) }()
	procsMu.Lock()
	procs = append(procs, p)
	procsMu.Unlock()
	return p, nil
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

func cleanup() {
	procsMu.Lock()
	defer procsMu.Unlock()
	for _, p := range procs {
		p.stop()
	}
	procs = nil
}

// waitHTTP polls url until any HTTP answer comes back.
func waitHTTP(p *proc, u string) error {
	deadline := time.Now().Add(20 * time.Second)
	c := &http.Client{Timeout: time.Second, CheckRedirect: noRedirect}
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %s", p.name, p.tail())
		default:
		}
		if resp, err := c.Get(u); err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no answer on %s: %s", p.name, u, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		log.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func segmentID(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// ---- the run -------------------------------------------------------------

type env struct {
	dir        string
	key        []byte
	keyText    string
	gw         *proc
	gwEndpoint string
	gwAK, gwSK string
	gwLog      string
	s3         *s3.Client
	dbPath     string
	www        string
	serveID    string
	redirID    string
	stormID    string
	stormBytes []byte
}

func run() error {
	for _, p := range []string{*flagCaddy, *flagPlain, *flagGW, *flagHey} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing (run `make bench`, which builds and installs it): %v", p, err)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; cleanup(); os.Exit(130) }()

	dir, err := os.MkdirTemp("", "syncular-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e := &env{dir: dir, keyText: randHex(24)}
	e.key = []byte(e.keyText)
	began := time.Now()

	if err := e.setupS3(); err != nil {
		return err
	}
	if err := e.setupSQLite(); err != nil {
		return err
	}

	rep := &report{began: began, loadBefore: loadAvg()}
	if err := e.sideBySide(rep); err != nil {
		return err
	}
	for _, cached := range []bool{true, false} {
		r, err := e.storm(cached)
		if err != nil {
			return err
		}
		rep.storms = append(rep.storms, r)
	}
	rep.took = time.Since(began)
	rep.loadAfter = loadAvg()
	md := rep.markdown()
	fmt.Print(md)
	if *flagOut != "" {
		// Hand-written notes below the marker survive a new run.
		if old, err := os.ReadFile(*flagOut); err == nil {
			if i := bytes.Index(old, []byte(notesMarker)); i >= 0 {
				md += "\n" + string(old[i:])
			}
		}
		if err := os.WriteFile(*flagOut, []byte(md), 0o644); err != nil {
			return err
		}
		log.Printf("wrote %s", *flagOut)
	}
	return nil
}

// setupS3 starts versitygw and writes the redirect and storm segments.
func (e *env) setupS3() error {
	e.gwAK, e.gwSK = "bench"+randHex(4), randHex(20)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort())
	e.gwEndpoint = "http://" + addr
	e.gwLog = filepath.Join(e.dir, "versitygw-access.log")
	data := filepath.Join(e.dir, "s3data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	gw, err := start("versitygw", *flagGW,
		[]string{"--port", addr, "--region", region, "--quiet", "--access-log", e.gwLog, "posix", data},
		[]string{"ROOT_ACCESS_KEY=" + e.gwAK, "ROOT_SECRET_KEY=" + e.gwSK}, e.dir)
	if err != nil {
		return err
	}
	e.gw = gw
	if err := waitHTTP(gw, e.gwEndpoint+"/"); err != nil {
		return err
	}
	e.s3 = s3.New(s3.Options{
		Region:       region,
		Credentials:  credentials.NewStaticCredentialsProvider(e.gwAK, e.gwSK, ""),
		BaseEndpoint: aws.String(e.gwEndpoint),
		UsePathStyle: true,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return fmt.Errorf("create bucket: %w", err)
	}
	redir := bytes.Repeat([]byte("redirect"), 256) // 2 KiB
	if e.redirID, err = e.put(ctx, redir); err != nil {
		return err
	}
	e.stormBytes = make([]byte, stormSize)
	if _, err := rand.Read(e.stormBytes); err != nil {
		return err
	}
	e.stormID, err = e.put(ctx, e.stormBytes)
	return err
}

func (e *env) put(ctx context.Context, b []byte) (string, error) {
	id := segmentID(b)
	now := time.Now().UnixMilli()
	rec, _ := json.Marshal(map[string]any{
		"segmentId": id, "partition": partition, "logEpoch": "e1", "table": "tasks", "schemaVersion": 1,
		"mediaType": "rows", "scopeDigest": scopeDigest, "asOfCommitSeq": 1, "rowCount": 1,
		"rowCursor": nil, "nextRowCursor": nil, "byteLength": len(b),
		"createdAtMs": now, "expiresAtMs": now + 24*3600*1000,
	})
	_, err := e.s3.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(bucket),
		Key:           aws.String(store.S3ObjectKey("", id)),
		Body:          bytes.NewReader(b),
		ContentLength: aws.Int64(int64(len(b))),
		ContentType:   aws.String("application/octet-stream"),
		Metadata:      map[string]string{"syncular-record": base64.RawURLEncoding.EncodeToString(rec)},
	})
	if err != nil {
		return "", fmt.Errorf("put %s: %w", id, err)
	}
	return id, nil
}

// setupSQLite seeds the 256 KiB segment, and writes the same bytes where
// file_server finds them under the same URL path.
func (e *env) setupSQLite() error {
	body := make([]byte, serveSize)
	if _, err := rand.Read(body); err != nil {
		return err
	}
	e.dbPath = filepath.Join(e.dir, "sync.db")
	w, err := seed.Create(e.dbPath, 3)
	if err != nil {
		return err
	}
	defer w.Close()
	now := time.Now().UnixMilli()
	id, err := w.Put(seed.SegmentInput{Bytes: body, Publication: store.Publication{
		Partition: partition, LogEpoch: "e1", Table: "tasks", ScopeDigest: scopeDigest,
		AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
	}})
	if err != nil {
		return err
	}
	if err := w.SetEpoch(partition, "e1", now); err != nil {
		return err
	}
	e.serveID = id
	e.www = filepath.Join(e.dir, "www")
	segDir := filepath.Join(e.www, "sync", "segments")
	if err := os.MkdirAll(segDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(segDir, id), body, 0o644)
}

func (e *env) token(id string, exp time.Time) string {
	return presign.Sign(e.key, id, scopeDigest, "aud:"+partition, exp.Unix())
}

// segURL is the signed URL of id on the site at port.
func (e *env) segURL(port int, id, tok string) string {
	return fmt.Sprintf("http://127.0.0.1:%d/sync/segments/%s?st=%s", port, id, url.QueryEscape(tok))
}

// notesMarker starts the hand-written part of the results file.
const notesMarker = "<!-- notes: kept across runs -->"

const globalOpts = `{
	admin 127.0.0.1:%d
	default_bind 127.0.0.1
	persist_config off
	auto_https off
}
`

func (e *env) s3Block() string {
	return fmt.Sprintf(`store s3 {
			bucket %s
			region %s
			endpoint %s
			access_key_id {env.BENCH_S3_AK}
			secret_access_key {env.BENCH_S3_SK}
		}`, bucket, region, e.gwEndpoint)
}

func (e *env) edgeSite(port int, storeBlock, extra string) string {
	return fmt.Sprintf(`
http://127.0.0.1:%d {
	syncular_segments /sync/segments/* {
		key {env.BENCH_SEGMENT_KEY}
		audience template aud:{partition}
		%s
		untokened reject
		%s
	}
}
`, port, storeBlock, extra)
}

// startCaddy writes cfg and runs bin (Caddy) on it.
func (e *env) startCaddy(name, bin, cfg string) (*proc, error) {
	path := filepath.Join(e.dir, name+".Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	home := filepath.Join(e.dir, name+"-home")
	return start(name, bin, []string{"run", "--config", path, "--adapter", "caddyfile"}, []string{
		"BENCH_SEGMENT_KEY=" + e.keyText, "BENCH_S3_AK=" + e.gwAK, "BENCH_S3_SK=" + e.gwSK,
		"XDG_CONFIG_HOME=" + home, "XDG_DATA_HOME=" + home, "HOME=" + home,
	}, e.dir)
}

// ---- (a), (b), (d) ---------------------------------------------------------

type heyResult struct {
	rps    float64
	codes  map[int]int
	errors int
}

var (
	rpsRe    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	codeRe   = regexp.MustCompile(`\[(\d{3})\]\s+(\d+) responses`)
	errDistR = regexp.MustCompile(`(?m)^\s+\[(\d+)\]\s+Get `)
)

func heyArgs(dur time.Duration, u string) []string {
	return []string{"-z", dur.String(), "-c", strconv.Itoa(*flagConc), "-disable-redirects", "-disable-compression", u}
}

func runHey(dur time.Duration, u string) (heyResult, error) {
	out, err := exec.Command(*flagHey, heyArgs(dur, u)...).CombinedOutput()
	if err != nil {
		return heyResult{}, fmt.Errorf("hey: %v: %s", err, out)
	}
	m := rpsRe.FindSubmatch(out)
	if m == nil {
		return heyResult{}, fmt.Errorf("hey: no Requests/sec in output: %s", out)
	}
	r := heyResult{codes: map[int]int{}}
	r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, cm := range codeRe.FindAllSubmatch(out, -1) {
		code, _ := strconv.Atoi(string(cm[1]))
		n, _ := strconv.Atoi(string(cm[2]))
		r.codes[code] += n
	}
	for _, em := range errDistR.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(em[1]))
		r.errors += n
	}
	return r, nil
}

type pair struct {
	name, edgeURL, plainURL string
	want                    int // status every response must have
	edge, plain             []float64
	edgeCPU, plainCPU       []float64 // server CPU µs per request
	bad                     int       // responses with another status, or errors
}

func (e *env) sideBySide(rep *report) error {
	edgeAdmin, plainAdmin := freePort(), freePort()
	pServe, pRedir := freePort(), freePort()
	edgeCfg := fmt.Sprintf(globalOpts, edgeAdmin) +
		e.edgeSite(pServe, "store sqlite "+e.dbPath, "") +
		e.edgeSite(pRedir, e.s3Block(), "delivery redirect")
	edge, err := e.startCaddy("edge", *flagCaddy, edgeCfg)
	if err != nil {
		return err
	}
	defer edge.stop()
	exp := time.Now().Add(time.Hour)
	serveURL := e.segURL(pServe, e.serveID, e.token(e.serveID, exp))
	redirURL := e.segURL(pRedir, e.redirID, e.token(e.redirID, exp))
	if err := waitHTTP(edge, serveURL); err != nil {
		return err
	}
	// The redirect's Location, for a bare redir of a URL of the same length.
	resp, err := (&http.Client{CheckRedirect: noRedirect}).Get(redirURL)
	if err != nil {
		return err
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || loc == "" {
		return fmt.Errorf("edge redirect answered %d", resp.StatusCode)
	}

	qFile, qRedir := freePort(), freePort()
	plainCfg := fmt.Sprintf(globalOpts, plainAdmin) + fmt.Sprintf(`
http://127.0.0.1:%d {
	root * %s
	file_server
}

http://127.0.0.1:%d {
	redir "%s" 302
}
`, qFile, e.www, qRedir, loc)
	plain, err := e.startCaddy("plain", *flagPlain, plainCfg)
	if err != nil {
		return err
	}
	defer plain.stop()
	// The same path and query on both sides (file_server ignores the query).
	fileURL := e.segURL(qFile, e.serveID, e.token(e.serveID, exp))
	plainRedirURL := e.segURL(qRedir, e.redirID, e.token(e.redirID, exp))
	if err := waitHTTP(plain, fileURL); err != nil {
		return err
	}
	if err := sameBody(serveURL, fileURL); err != nil {
		return err
	}

	rep.pairs = []*pair{
		{name: "(a) serve 256 KiB: edge (SQLite, warm cache) / file_server", edgeURL: serveURL, plainURL: fileURL, want: 200},
		{name: "(b) redirect: edge (S3, record cached) / redir", edgeURL: redirURL, plainURL: plainRedirURL, want: 302},
	}
	rep.heyExample = append([]string{*flagHey}, heyArgs(*flagDur, "<url>")...)
	log.Printf("warm-up")
	for _, p := range rep.pairs {
		for _, u := range []string{p.edgeURL, p.plainURL} {
			if _, err := runHey(time.Second, u); err != nil {
				return err
			}
		}
	}
	for round := 0; round < *flagRounds; round++ {
		for _, p := range rep.pairs {
			order := []bool{true, false} // edge first
			if round%2 == 1 {
				order = []bool{false, true}
			}
			for _, isEdge := range order {
				u, pid := p.plainURL, plain.cmd.Process.Pid
				if isEdge {
					u, pid = p.edgeURL, edge.cmd.Process.Pid
				}
				cpu0, _ := procCPU(pid)
				var prof chan error
				if isEdge && round == 0 && *flagPprof != "" {
					prof = make(chan error, 1)
					go func() {
						prof <- saveProfile(edgeAdmin, *flagDur-time.Second, filepath.Join(*flagPprof, p.name[1:2]+"-edge.pprof"))
					}()
				}
				r, err := runHey(*flagDur, u)
				if err != nil {
					return err
				}
				cpu1, _ := procCPU(pid)
				total := 0
				for _, n := range r.codes {
					total += n
				}
				cpuPer := 0.0
				if total > 0 {
					cpuPer = float64(cpu1-cpu0) / float64(total) * 1e6
				}
				if prof != nil {
					if err := <-prof; err != nil {
						log.Printf("pprof: %v", err)
					}
				}
				p.bad += r.errors
				for code, n := range r.codes {
					if code != p.want {
						p.bad += n
					}
				}
				if isEdge {
					p.edge = append(p.edge, r.rps)
					p.edgeCPU = append(p.edgeCPU, cpuPer)
				} else {
					p.plain = append(p.plain, r.rps)
					p.plainCPU = append(p.plainCPU, cpuPer)
				}
				side := map[bool]string{true: "edge", false: "plain"}[isEdge]
				log.Printf("round %d %s %s: %.0f req/s, %.1f µs server CPU per request", round+1, p.name[:3], side, r.rps, cpuPer)
			}
		}
	}

	// (d) forged tokens against the SQLite and the S3 site of this edge.
	f, err := e.forged(edgeAdmin, pServe, pRedir)
	if err != nil {
		return err
	}
	rep.forged = f
	return nil
}

// saveProfile fetches a CPU profile of the Caddy whose admin is on port.
func saveProfile(admin int, d time.Duration, path string) error {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", admin, int(d.Seconds())))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

func sameBody(a, b string) error {
	var sums [2][32]byte
	for i, u := range []string{a, b} {
		resp, err := http.Get(u)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			return fmt.Errorf("GET %s: %d %v", u, resp.StatusCode, err)
		}
		sums[i] = sha256.Sum256(body)
	}
	if sums[0] != sums[1] {
		return errors.New("edge and file_server bodies differ")
	}
	return nil
}

type forgedResult struct {
	requests   int
	codes      map[int]int
	s3Requests int
	storeOps   string // store operations the edge counted, or why unknown
}

// forged sends *flagForged requests whose tokens must all be refused
// before any store read: wrong key (real and random segment ids), garbage,
// and a valid token for another segment.
func (e *env) forged(admin, pServe, pRedir int) (*forgedResult, error) {
	before := countLog(e.gwLog, "", "")
	metricsBefore, mErr := storeOpCount(admin)
	wrongKey := []byte(randHex(24))
	exp := time.Now().Add(time.Hour)
	urls := make([]string, *flagForged)
	for i := range urls {
		port, id := pServe, e.serveID
		if i%2 == 1 {
			port, id = pRedir, e.redirID
		}
		var tok string
		switch i % 8 / 2 {
		case 0: // wrong key, real segment
			tok = presign.Sign(wrongKey, id, scopeDigest, "aud:"+partition, exp.Unix())
		case 1: // wrong key, random segment id
			r := make([]byte, 32)
			_, _ = rand.Read(r)
			id = "sha256:" + hex.EncodeToString(r)
			tok = presign.Sign(wrongKey, id, scopeDigest, "aud:"+partition, exp.Unix())
		case 2: // garbage
			tok = randHex(40) + "." + randHex(16)
		case 3: // a genuine token for another segment
			tok = e.token(e.stormID, exp)
		}
		urls[i] = e.segURL(port, id, tok)
	}
	res := &forgedResult{requests: len(urls), codes: map[int]int{}}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{CheckRedirect: noRedirect, Timeout: 10 * time.Second}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(urls) {
					return
				}
				code := 0
				if resp, err := client.Get(urls[i]); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				res.codes[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // let versitygw flush its log
	res.s3Requests = countLog(e.gwLog, "", "") - before
	metricsAfter, mErr2 := storeOpCount(admin)
	switch {
	case mErr != nil || mErr2 != nil:
		res.storeOps = fmt.Sprintf("unknown (%v)", errors.Join(mErr, mErr2))
	default:
		res.storeOps = strconv.Itoa(metricsAfter - metricsBefore)
	}
	return res, nil
}

// storeOpCount sums the edge's caddy_syncular_store_duration_seconds_count
// series (every store lookup, open and presign of every handler).
func storeOpCount(admin int) (int, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", admin))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, found := 0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "caddy_syncular_store_duration_seconds_count") {
			continue
		}
		found = true
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		n += int(v)
	}
	if !found {
		return 0, errors.New("no caddy_syncular_store_duration_seconds metric")
	}
	return n, sc.Err()
}

// countLog counts versitygw access-log lines of operation op ("" any) on
// key ("" any). Line: owner bucket [time zone] ip requester reqid op key uri status ...
func countLog(path, op, key string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 11 || !strings.HasPrefix(fs[2], "[") {
			continue
		}
		if (op == "" || fs[7] == op) && (key == "" || fs[8] == key) {
			n++
		}
	}
	return n
}

// ---- (c) -------------------------------------------------------------------

type stormResult struct {
	cached            bool
	clients, ok       int
	gets, heads       int
	rssStart, rssPeak int64 // KiB
	took              time.Duration
	cfg               string
}

func (e *env) storm(cached bool) (*stormResult, error) {
	name, extra := "storm-cache", ""
	if !cached {
		name, extra = "storm-nocache", "cache {\n\t\t\tmax_bytes 0\n\t\t}"
	}
	admin, port := freePort(), freePort()
	cfg := fmt.Sprintf(globalOpts, admin) + e.edgeSite(port, e.s3Block(), "delivery proxy\n\t\t"+extra)
	edge, err := e.startCaddy(name, *flagCaddy, cfg)
	if err != nil {
		return nil, err
	}
	defer edge.stop()
	if err := waitHTTP(edge, fmt.Sprintf("http://127.0.0.1:%d/", port)); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	key := store.S3ObjectKey("", e.stormID)
	gets0, heads0 := countLog(e.gwLog, "s3_GetObject", key), countLog(e.gwLog, "s3_HeadObject", key)
	res := &stormResult{cached: cached, clients: *flagClients, cfg: strings.TrimSpace(extra)}
	res.rssStart, _ = procStatus(edge.cmd.Process.Pid, "VmRSS")
	want := sha256.Sum256(e.stormBytes)

	tr := &http.Transport{MaxIdleConnsPerHost: *flagClients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	gate := make(chan struct{})
	var ok atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errMu sync.Mutex
	for i := range *flagClients {
		// Each client holds its own token, as after a real deploy.
		u := e.segURL(port, e.stormID, e.token(e.stormID, time.Now().Add(time.Hour+time.Duration(i)*time.Second)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			err := func() error {
				resp, err := client.Get(u)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				h := sha256.New()
				if _, err := io.Copy(h, resp.Body); err != nil {
					return err
				}
				if resp.StatusCode != 200 || !bytes.Equal(h.Sum(nil), want[:]) {
					return fmt.Errorf("status %d or wrong bytes", resp.StatusCode)
				}
				return nil
			}()
			if err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
				return
			}
			ok.Add(1)
		}()
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	res.took = time.Since(t0)
	res.ok = int(ok.Load())
	res.rssPeak, _ = procStatus(edge.cmd.Process.Pid, "VmHWM")
	time.Sleep(200 * time.Millisecond)
	res.gets = countLog(e.gwLog, "s3_GetObject", key) - gets0
	res.heads = countLog(e.gwLog, "s3_HeadObject", key) - heads0
	log.Printf("storm (cache %v): %d/%d ok, %d GET, %d HEAD, peak RSS %d MiB, %s (first error: %v)",
		cached, res.ok, res.clients, res.gets, res.heads, res.rssPeak>>10, res.took.Round(time.Millisecond), firstErr)
	return res, nil
}

// procCPU is the user+system CPU time of pid, in seconds.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("bad /proc stat")
	}
	ut, _ := strconv.ParseFloat(f[11], 64) // utime, field 14
	st, _ := strconv.ParseFloat(f[12], 64) // stime, field 15
	return (ut + st) / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100

// procStatus reads a kB field of /proc/<pid>/status.
func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%d/status", field, pid)
}

// ---- report ----------------------------------------------------------------

type report struct {
	loadBefore string
	loadAfter  string
	began      time.Time
	took       time.Duration
	pairs      []*pair
	heyExample []string
	storms     []*stormResult
	forged     *forgedResult
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func cmdOut(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return strings.TrimRight(string(out), "\n ")
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return "unknown"
}

func (r *report) markdown() string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	w("# Benchmark results\n\n")
	w("Produced by `make bench` (`go run ./bench/load -o bench/RESULTS.md`); every number below is from one run.\n\n")
	w("## Machine\n\n")
	w("- date: %s (run took %s)\n", r.began.UTC().Format(time.RFC3339), r.took.Round(time.Second))
	w("- `nproc`: %s; CPU: %s\n", cmdOut("nproc"), cpuModel())
	w("- `free -h`:\n\n```\n%s\n```\n\n", strings.TrimLeft(cmdOut("free", "-h"), "\n"))
	w("- load average (1, 5, 15 min) before the run: %s; after: %s (the machine is shared: other jobs run beside the benchmark, which is why sides alternate and medians are reported)\n", r.loadBefore, r.loadAfter)
	w("- kernel %s, %s, Caddy %s\n\n", cmdOut("uname", "-r"), runtime.Version(), firstLine(cmdOut(*flagPlain, "version")))
	w("## Commands\n\n")
	w("- load generator: `%s` against each URL, %d rounds, edge and plain alternated (ABBA), after a 1 s warm-up of every URL\n",
		strings.Join(r.heyExample, " "), *flagRounds)
	w("- edge: `bin/caddy run --config edge.Caddyfile` (this module); plain: `bin/caddy-plain run --config plain.Caddyfile` (stock Caddy, same version); both on 127.0.0.1, same URL path and query on both sides\n")
	w("- S3: versitygw posix backend on 127.0.0.1, its access log counted per object key\n\n")

	w("## Throughput (requests/s, median of %d rounds)\n\n", *flagRounds)
	w("| measurement | edge | plain | ratio (of medians) | median of per-round ratios | target | other answers |\n|---|---:|---:|---:|---:|---|---:|\n")
	targets := []float64{1.0, 0.85}
	for i, p := range r.pairs {
		me, mp := median(p.edge), median(p.plain)
		var ratios []float64
		for j := range p.edge {
			ratios = append(ratios, p.edge[j]/p.plain[j])
		}
		ratio := me / mp
		verdict := "met"
		if ratio < targets[i] {
			verdict = "**missed**"
		}
		w("| %s | %.0f | %.0f | **%.2f×** | %.2f× | ≥ %.2f× (%s) | %d |\n", p.name, me, mp, ratio, median(ratios), targets[i], verdict, p.bad)
	}
	w("\n### Server CPU per request (µs, median of %d rounds)\n\n", *flagRounds)
	w("CPU time (user + system, from `/proc/<pid>/stat`) the serving Caddy process spent during a run, divided by the requests hey completed. Less sensitive to other jobs on the machine than throughput; the ratio is plain ÷ edge, so like the throughput ratio, higher is better for the edge.\n\n")
	w("| measurement | edge µs/req | plain µs/req | ratio plain/edge (of medians) |\n|---|---:|---:|---:|\n")
	for _, p := range r.pairs {
		me, mp := median(p.edgeCPU), median(p.plainCPU)
		w("| %s | %.1f | %.1f | **%.2f×** |\n", p.name, me, mp, mp/me)
	}
	w("\nRaw rounds (req/s):\n\n")
	for _, p := range r.pairs {
		w("- %s: edge %s; plain %s\n", p.name[:3], fmtList(p.edge), fmtList(p.plain))
		w("  - server CPU µs/request: edge %s; plain %s\n", fmtList1(p.edgeCPU), fmtList1(p.plainCPU))
	}

	w("\n## (c) Storm: %d concurrent clients, one 8 MiB segment, proxy mode from versitygw\n\n", *flagClients)
	w("| edge cache | clients with the right bytes (sha256) | object GETs | object HEADs | edge RSS before | edge peak RSS (VmHWM) | wall time |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.storms {
		name := "default (64 MiB budget, 8 MiB max entry)"
		if !s.cached {
			name = "bytes cache off (`" + strings.Join(strings.Fields(s.cfg), " ") + "`), control"
		}
		w("| %s | %d / %d | %d | %d | %.1f MiB | %.1f MiB | %s |\n", name, s.ok, s.clients, s.gets, s.heads,
			float64(s.rssStart)/1024, float64(s.rssPeak)/1024, s.took.Round(time.Millisecond))
	}
	w("\nTarget (default cache): every client right, exactly 1 GET and at most 1 HEAD, peak RSS within the cache budget (64 MiB) plus a small constant over the idle edge.\n")
	if f := r.forged; f != nil {
		w("\n## (d) Forged tokens\n\n")
		w("%d requests (wrong key for real and random segment ids, garbage tokens, genuine tokens for another segment), half to the SQLite site, half to the S3 site.\n\n", f.requests)
		w("| answers | store requests seen by versitygw | store operations counted by the edge (`caddy_syncular_store_duration_seconds_count`, SQLite and S3) |\n|---|---:|---:|\n")
		w("| %s | %d | %s |\n", fmtCodes(f.codes), f.s3Requests, f.storeOps)
	}
	return b.String()
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	if f := strings.Fields(l); len(f) > 0 {
		return f[0]
	}
	return l
}

func fmtList(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(s, ", ")
}

func fmtList1(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.1f", x))
	}
	return strings.Join(s, ", ")
}

func fmtCodes(m map[int]int) string {
	var keys []int
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var s []string
	for _, k := range keys {
		s = append(s, fmt.Sprintf("%d × %d", m[k], k))
	}
	return strings.Join(s, ", ")
}
