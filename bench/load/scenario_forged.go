package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/token"
)

type forgedResult struct {
	requests   int
	codes      map[int]int
	s3Requests int
	storeOps   string // store operations the edge counted, or why unknown
}

// forgedScenario is (d): *flagForged requests whose tokens must all be
// refused before any store read — wrong key (real and random segment
// ids), garbage, and a genuine token for another segment — half to a
// SQLite site, half to an S3 site of one edge.
func forgedScenario(e *env, rep *report) error {
	admin, pSQLite, pS3 := freePort(), freePort(), freePort()
	edge, err := e.startCaddy("forged-edge", *flagCaddy, fmt.Sprintf(globalOpts, admin)+
		edgeSite(pSQLite, audTemplate, "store sqlite "+e.dbPath, "")+
		edgeSite(pS3, audTemplate, e.s3Block(), "delivery redirect"))
	if err != nil {
		return err
	}
	if err := waitHTTP(edge, fmt.Sprintf("http://127.0.0.1:%d/", pS3)); err != nil {
		return err
	}
	// One genuine request per site first: it proves both sites work, and
	// the store metric series exist before they are counted.
	genuine := time.Now().Add(time.Hour)
	if _, err := expectStatus(segURL(pSQLite, e.serveID, e.token(e.serveID, genuine)), http.StatusOK); err != nil {
		return fmt.Errorf("SQLite site: %w", err)
	}
	if _, err := expectStatus(segURL(pS3, e.redir.id, e.token(e.redir.id, genuine)), http.StatusFound); err != nil {
		return fmt.Errorf("S3 site: %w", err)
	}
	time.Sleep(200 * time.Millisecond) // let versitygw flush its log

	before := countLog(e.gw.AccessLog, "", "")
	metricsBefore, mErr := storeOpCount(admin)
	wrongKey, _, err := newKey()
	if err != nil {
		return err
	}
	exp := time.Now().Add(time.Hour)
	urls := make([]string, *flagForged)
	for i := range urls {
		port, id := pSQLite, e.serveID
		if i%2 == 1 {
			port, id = pS3, e.redir.id
		}
		var tok string
		switch i % 8 / 2 {
		case 0: // wrong key, real segment
			tok = token.Sign(wrongKey, id, scopeDigest, "aud:"+partition, exp.Unix())
		case 1: // wrong key, random segment id
			r := make([]byte, 32)
			_, _ = rand.Read(r)
			id = "sha256:" + hex.EncodeToString(r)
			tok = token.Sign(wrongKey, id, scopeDigest, "aud:"+partition, exp.Unix())
		case 2: // garbage
			g := make([]byte, 60)
			_, _ = rand.Read(g)
			tok = hex.EncodeToString(g[:40]) + "." + hex.EncodeToString(g[40:])
		case 3: // a genuine token for another segment
			tok = e.token(e.storm.id, exp)
		}
		urls[i] = segURL(port, id, tok)
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
	res.s3Requests = countLog(e.gw.AccessLog, "", "") - before
	metricsAfter, mErr2 := storeOpCount(admin)
	switch {
	case mErr != nil || mErr2 != nil:
		res.storeOps = fmt.Sprintf("unknown (%v)", errors.Join(mErr, mErr2))
	default:
		res.storeOps = strconv.Itoa(metricsAfter - metricsBefore)
	}
	rep.addSection(res.markdown)
	return nil
}

func (f *forgedResult) markdown(w func(string, ...any)) {
	w("## (d) Forged tokens\n\n")
	w("%d requests (wrong key for real and random segment ids, garbage tokens, genuine tokens for another segment), half to the SQLite site, half to the S3 site.\n\n", f.requests)
	w("| answers | store requests seen by versitygw | store operations counted by the edge (`caddy_syncular_store_duration_seconds_count`, SQLite and S3) |\n|---|---:|---:|\n")
	w("| %s | %d | %s |\n\n", fmtCodes(f.codes), f.s3Requests, f.storeOps)
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
