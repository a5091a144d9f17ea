package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/store/s3"
)

type stormResult struct {
	cached            bool
	clients, ok       int
	gets, heads       int
	rssStart, rssPeak int64 // KiB
	took              time.Duration
	cfg               string
}

// stormScenario is (c): *flagClients concurrent clients, each with its own
// token, download the 8 MiB segment in proxy mode at once; once with the
// default cache and once with the bytes cache off, as a control.
func stormScenario(e *env, rep *report) error {
	var res []*stormResult
	for _, cached := range []bool{true, false} {
		r, err := e.runStorm(cached)
		if err != nil {
			return err
		}
		res = append(res, r)
	}
	rep.addSection(func(w func(string, ...any)) { stormMarkdown(w, res) })
	return nil
}

func (e *env) runStorm(cached bool) (*stormResult, error) {
	name, extra := "storm-cache", ""
	if !cached {
		name, extra = "storm-nocache", "cache {\n\t\t\tmax_bytes 0\n\t\t}"
	}
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
	key := s3.ObjectKey("", e.storm.id)
	gets0, heads0 := countLog(e.gw.AccessLog, "s3_GetObject", key), countLog(e.gw.AccessLog, "s3_HeadObject", key)
	res := &stormResult{cached: cached, clients: *flagClients, cfg: strings.TrimSpace(extra)}
	res.rssStart, _ = procStatus(edge.pid(), "VmRSS")
	want := sha256.Sum256(e.storm.bytes)

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
		u := segURL(port, e.storm.id, e.token(e.storm.id, time.Now().Add(time.Hour+time.Duration(i)*time.Second)))
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
	res.rssPeak, _ = procStatus(edge.pid(), "VmHWM")
	time.Sleep(200 * time.Millisecond) // let versitygw flush its log
	res.gets = countLog(e.gw.AccessLog, "s3_GetObject", key) - gets0
	res.heads = countLog(e.gw.AccessLog, "s3_HeadObject", key) - heads0
	log.Printf("storm (cache %v): %d/%d ok, %d GET, %d HEAD, peak RSS %d MiB, %s (first error: %v)",
		cached, res.ok, res.clients, res.gets, res.heads, res.rssPeak>>10, res.took.Round(time.Millisecond), firstErr)
	return res, nil
}

func stormMarkdown(w func(string, ...any), storms []*stormResult) {
	w("## (c) Storm: %d concurrent clients, one 8 MiB segment, proxy mode from versitygw\n\n", *flagClients)
	w("| edge cache | clients with the right bytes (sha256) | object GETs | object HEADs | edge RSS before | edge peak RSS (VmHWM) | wall time |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range storms {
		name := "default (64 MiB budget, 8 MiB max entry)"
		if !s.cached {
			name = "bytes cache off (`" + strings.Join(strings.Fields(s.cfg), " ") + "`), control"
		}
		w("| %s | %d / %d | %d | %d | %.1f MiB | %.1f MiB | %s |\n", name, s.ok, s.clients, s.gets, s.heads,
			float64(s.rssStart)/1024, float64(s.rssPeak)/1024, s.took.Round(time.Millisecond))
	}
	w("\nTarget (default cache): every client right, exactly 1 GET and at most 1 HEAD, peak RSS within the cache budget (64 MiB) plus a small constant over the idle edge.\n\n")
}
