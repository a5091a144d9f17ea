package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/token"
)

// The fair store work scenario (m): tenant A's fairAClients clients each
// ask for a distinct cold segment at once, while tenant B's fairBClients
// clients download fairBSegments cold segments of their own, one after
// another; B's download times are compared with B alone on a cold edge.
// Three edges, each fresh (cold memory and disk tier): B alone, B beside
// A's storm with the default store read gate, and the same with the gate
// off (store_concurrency 0) as a control.

const (
	fairAClients  = 400
	fairBClients  = 4
	fairBSegments = 40
	fairSize      = 32 << 10
	fairPartA     = "bench-tenant-a"
	fairPartB     = "bench-tenant-b"
	fairRounds    = 4
)

var flagFairStorm = flag.String("fair-storm", "", "internal: run tenant A's clients of scenario (m) on this URL list")

type fairRun struct {
	name       string
	storm      bool
	rounds     int
	bLat       []time.Duration
	bFirst     []time.Duration // each B client's first download
	bStart     []time.Duration // when each of B's downloads started, after t0
	bOK        int
	aOK, aOver int
	aOther     int
	aSlowest   time.Duration
	took       time.Duration

	// bLate: B's downloads that started after the last of A's requests
	// was sent (A's storm arrived; only its reads remain), and bEarly
	// the others. Beside the storm only.
	bLate, bEarly []time.Duration
}

type fairSeg struct {
	id   string
	part string
	sum  [32]byte
}

func fairScenario(e *env, rep *report) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mk := func(n int, part string, seed uint64) ([]fairSeg, error) {
		var out []fairSeg
		for i := range n {
			b := make([]byte, fairSize+i)
			r := rand.New(rand.NewPCG(seed, uint64(i)))
			for j := range b {
				b[j] = byte(r.Uint32())
			}
			id, err := e.putFor(ctx, part, b)
			if err != nil {
				return nil, err
			}
			out = append(out, fairSeg{id: id, part: part, sum: sha256.Sum256(b)})
		}
		return out, nil
	}
	aSegs, err := mk(fairAClients, fairPartA, 1)
	if err != nil {
		return err
	}
	bSegs, err := mk(fairBSegments, fairPartB, 2)
	if err != nil {
		return err
	}
	type row struct {
		name  string
		storm bool
		extra string
	}
	// B alone and B beside the storm with the defaults alternate
	// (ABBA) over fairRounds rounds, their samples pooled: the machine's
	// other load then weighs on both alike. The other rows run once.
	alone := row{"B alone", false, ""}
	stormed := row{"B beside A's storm (default gate)", true, ""}
	var order []row
	for i := range fairRounds {
		if i%2 == 0 {
			order = append(order, alone, stormed)
		} else {
			order = append(order, stormed, alone)
		}
	}
	order = append(order,
		row{"B beside A's storm, store_concurrency 32", true, "store_concurrency 32"},
		row{"B beside A's storm, store_concurrency 8", true, "store_concurrency 8"},
		row{"B beside A's storm, store_concurrency 4", true, "store_concurrency 4"},
		row{"B beside A's storm, gate off (store_concurrency 0), control", true, "store_concurrency 0"})
	var runs []*fairRun
	pooled := map[string]*fairRun{}
	for i, r := range order {
		res, err := e.fairOnce(fmt.Sprintf("fair-%d", i), r.name, r.storm, r.extra, aSegs, bSegs)
		if err != nil {
			return err
		}
		log.Printf("(m) %s: B %d/%d right, p50 %s p95 %s (first downloads %s, B done at %s; %s); A %d right, %d overloaded, %d other, slowest %s; %s",
			res.name, res.bOK, len(bSegs), pct(res.bLat, 0.5).Round(time.Millisecond), pct(res.bLat, 0.95).Round(time.Millisecond),
			roundAll(res.bFirst), maxDur(res.bStart).Round(time.Millisecond), fairSplit(res),
			res.aOK, res.aOver, res.aOther, res.aSlowest.Round(time.Millisecond), res.took.Round(time.Millisecond))
		p := pooled[r.name]
		if p == nil {
			p = &fairRun{name: r.name, storm: r.storm}
			pooled[r.name] = p
			runs = append(runs, p)
		}
		p.rounds++
		p.bLat = append(p.bLat, res.bLat...)
		p.bLate = append(p.bLate, res.bLate...)
		p.bEarly = append(p.bEarly, res.bEarly...)
		p.bOK += res.bOK
		p.aOK, p.aOver, p.aOther = p.aOK+res.aOK, p.aOver+res.aOver, p.aOther+res.aOther
		p.aSlowest = max(p.aSlowest, res.aSlowest)
		p.took = max(p.took, res.took)
	}
	rep.addSection(func(w func(string, ...any)) { fairMarkdown(w, runs) })
	return nil
}

func (e *env) fairOnce(name, label string, storm bool, extra string, aSegs, bSegs []fairSeg) (*fairRun, error) {
	admin, port := freePort(), freePort()
	cfg := fmt.Sprintf(globalOpts, admin) + edgeSite(port, audTemplate, e.s3Block(), "delivery proxy\n\t\t"+extra)
	edge, err := e.startCaddy(name, *flagCaddy, cfg)
	if err != nil {
		return nil, err
	}
	defer edge.stop()
	if err := waitHTTP(edge, fmt.Sprintf("http://127.0.0.1:%d/", port)); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	tr := &http.Transport{MaxIdleConnsPerHost: fairAClients + fairBClients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	get := func(s fairSeg) (status int, code string, right bool, took time.Duration) {
		tok := token.Sign(e.key, s.id, scopeDigest, "aud:"+s.part, time.Now().Add(time.Hour).Unix())
		t0 := time.Now()
		resp, err := client.Get(segURL(port, s.id, tok))
		if err != nil {
			return 0, err.Error(), false, time.Since(t0)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		took = time.Since(t0)
		if err != nil {
			return resp.StatusCode, err.Error(), false, took
		}
		if resp.StatusCode != 200 {
			var eb struct {
				Code string `json:"code"`
			}
			_ = json.Unmarshal(body, &eb)
			return resp.StatusCode, eb.Code, false, took
		}
		return 200, "", sha256.Sum256(body) == s.sum, took
	}

	res := &fairRun{name: label, storm: storm}
	var bAt []time.Time // when each of res.bLat started
	var mu sync.Mutex
	var wgB sync.WaitGroup
	// Tenant A's clients run in a process of their own (as they would on
	// machines of their own): their goroutines do not delay B's in the
	// scheduler of the process that times B.
	var child *exec.Cmd
	var childOut bytes.Buffer
	if storm {
		list := filepath.Join(e.dir, name+"-a.txt")
		var lines strings.Builder
		for _, s := range aSegs {
			tok := token.Sign(e.key, s.id, scopeDigest, "aud:"+s.part, time.Now().Add(time.Hour).Unix())
			fmt.Fprintf(&lines, "%s %x\n", segURL(port, s.id, tok), s.sum)
		}
		if err := os.WriteFile(list, []byte(lines.String()), 0o600); err != nil {
			return nil, err
		}
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		// With -pin, on the load generators' CPUs like hey and vegeta.
		prog, argv := pinned(loadCPUs(), self, []string{"-fair-storm", list})
		child = exec.Command(prog, argv...)
		child.Stdout, child.Stderr = &childOut, os.Stderr
		stdin, err := child.StdinPipe()
		if err != nil {
			return nil, err
		}
		if err := child.Start(); err != nil {
			return nil, err
		}
		time.Sleep(300 * time.Millisecond) // its goroutines are parked on the start line
		if *flagPprof != "" {
			// The edge's CPU profile of the storm (-pprof DIR,
			// -pprof-crowd long from A's release).
			profErr := make(chan error, 1)
			go func() {
				profErr <- saveProfile(admin, *flagPprofCrowd, filepath.Join(*flagPprof, name+"-storm-cpu.pprof"))
			}()
			defer func() {
				if err := <-profErr; err != nil {
					log.Printf("(m) %s: pprof: %v", name, err)
				}
			}()
		}
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			return nil, err
		}
		stdin.Close()
	}
	t0 := time.Now()
	if storm {
		time.Sleep(20 * time.Millisecond) // A's requests are in
	}
	for c := range fairBClients {
		wgB.Add(1)
		go func() {
			defer wgB.Done()
			for i := c; i < len(bSegs); i += fairBClients {
				startedAt := time.Now()
				started := startedAt.Sub(t0)
				_, _, right, took := get(bSegs[i])
				mu.Lock()
				res.bLat = append(res.bLat, took)
				res.bStart = append(res.bStart, started)
				bAt = append(bAt, startedAt)
				if i == c {
					res.bFirst = append(res.bFirst, took)
				}
				if right {
					res.bOK++
				}
				mu.Unlock()
			}
		}()
	}
	wgB.Wait()
	var lastSent int64 // when A's last request was written, Unix ns
	if child != nil {
		if err := child.Wait(); err != nil {
			return nil, fmt.Errorf("storm child: %w", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(childOut.String()), "\n") {
			var status, right int
			var code string
			var took time.Duration
			var sent int64
			if _, err := fmt.Sscanf(line, "%d %s %d %d %d", &status, &code, &right, &took, &sent); err != nil {
				return nil, fmt.Errorf("storm child line %q: %w", line, err)
			}
			lastSent = max(lastSent, sent)
			res.aSlowest = max(res.aSlowest, took)
			switch {
			case right == 1:
				res.aOK++
			case status == 503 && code == "edge.overloaded":
				res.aOver++
			default:
				res.aOther++
			}
		}
	}
	if child != nil {
		for i, at := range bAt {
			if at.UnixNano() > lastSent {
				res.bLate = append(res.bLate, res.bLat[i])
			} else {
				res.bEarly = append(res.bEarly, res.bLat[i])
			}
		}
	}
	res.took = time.Since(t0)
	return res, nil
}

// fairStormChild is tenant A's clients: one concurrent download of each
// "<url> <sha256 hex>" line of list, all started when stdin says go; one
// line per download on stdout: status, error code ("-" for none), 1 when
// the body hashed right, its time in nanoseconds, and when its request
// was written whole (Unix nanoseconds; 0 if never).
func fairStormChild(list string) error {
	raw, err := os.ReadFile(list)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	tr := &http.Transport{MaxIdleConnsPerHost: len(lines), DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	out := make([]string, len(lines))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, l := range lines {
		u, sum, _ := strings.Cut(l, " ")
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			var sent atomic.Int64
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				WroteRequest: func(httptrace.WroteRequestInfo) { sent.Store(time.Now().UnixNano()) },
			})
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				out[i] = "0 request 0 0 0"
				return
			}
			t0 := time.Now()
			status, code, right := 0, "-", 0
			if resp, err := client.Do(req); err != nil {
				code = "transport"
			} else {
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
				h := sha256.Sum256(body)
				switch {
				case err != nil:
					code = "cut"
				case status == 200 && fmt.Sprintf("%x", h) == sum:
					right = 1
				case status != 200:
					var eb struct {
						Code string `json:"code"`
					}
					if json.Unmarshal(body, &eb) == nil && eb.Code != "" {
						code = eb.Code
					}
				}
			}
			out[i] = fmt.Sprintf("%d %s %d %d %d", status, code, right, time.Since(t0), sent.Load())
		}()
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	close(gate)
	wg.Wait()
	_, err = fmt.Println(strings.Join(out, "\n"))
	return err
}

func fairMarkdown(w func(string, ...any), runs []*fairRun) {
	w("## (m) Fair store work: tenant B beside tenant A's cold storm, proxy mode from versitygw\n\n")
	w("Tenant A: %d clients, each asking at once for a distinct cold segment of %d KiB; tenant B: %d clients downloading %d cold segments of their own one after another (from 20 ms after A's start). A's clients run in a process of their own. Each round is a fresh edge (cold memory and disk tier); B alone and B beside the storm alternate over %d rounds (ABBA) and pool their samples; default settings (store_concurrency 16, store_queue 1024, store_queue_wait 2s) unless named. Target: B's p95 beside the storm at most 3× B's p95 alone; A's downloads each get their bytes or 503 edge.overloaded (A's counts are summed over the rounds).\n\n",
		fairAClients, fairSize>>10, fairBClients, fairBSegments, fairRounds)
	w("| edge | rounds | B right | B p50 | B p95 | B p95 / alone | B p95 while A's requests arrive / after (downloads) | A with bytes | A 503 edge.overloaded | A other | A slowest | slowest round |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var alone time.Duration
	for _, r := range runs {
		if !r.storm {
			alone = pct(r.bLat, 0.95)
		}
	}
	for _, r := range runs {
		ratio, a, split := "—", "—", "—"
		if alone > 0 {
			ratio = fmt.Sprintf("%.2f×", float64(pct(r.bLat, 0.95))/float64(alone))
		}
		if r.storm {
			split = fairSplit(r)
			a = fmt.Sprintf("%d | %d | %d | %s", r.aOK, r.aOver, r.aOther, r.aSlowest.Round(time.Millisecond))
		} else {
			a = "— | — | — | —"
		}
		w("| %s | %d | %d / %d | %s | %s | %s | %s | %s | %s |\n", r.name, r.rounds, r.bOK, len(r.bLat), pct(r.bLat, 0.5).Round(100*time.Microsecond),
			pct(r.bLat, 0.95).Round(100*time.Microsecond), ratio, split, a, r.took.Round(time.Millisecond))
	}
	w("\n%s\n\n", fmt.Sprintf("B's segments are read in both rows from a cold edge: a record lookup and a fill each, so B's time is two store reads; beside the storm each waits for its tenant's turn at a slot. "+
		"The split column parts B's downloads beside the storm by when they started: before the last of A's %d requests was sent (while the edge accepts, parses and verifies them, work done before the tenant is known, on the same cores as the store and A's clients) and after it (A's storm is then only its store reads, in the gate's turns).", fairAClients))
}

// fairSplit is B's p95 of the downloads that started while A's requests
// were still being sent, and of those that started after, with counts.
func fairSplit(r *fairRun) string {
	f := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "— (0)"
		}
		return fmt.Sprintf("%s (%d)", pct(ds, 0.95).Round(100*time.Microsecond), len(ds))
	}
	return f(r.bEarly) + " / " + f(r.bLate)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

func maxDur(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}
