package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	flagOutage        = flag.Duration("outage", 60*time.Second, "length of the store outage in (j)")
	flagOutageWorkers = flag.Int("outage-workers", 16, "concurrent clients in (j)")
)

// Phases and kinds of (j).
const (
	phaseBefore = iota
	phaseDown
	phaseAfter
	nPhases
)

const (
	kindHeld = iota // record and bytes read before the outage
	kindCold        // never read before the outage
	nKinds
)

var (
	phaseNames = [nPhases]string{"before", "outage", "after"}
	kindNames  = [nKinds]string{"held (read before the outage)", "cold (never read)"}
)

// outageCell tallies the answers of one (phase, kind).
type outageCell struct {
	ok, unavailable, timeout, other int
	lat                             []time.Duration
}

type outageArm struct {
	name      string // the grace line
	cells     [nPhases][nKinds]outageCell
	fastLat   []time.Duration // cold 503s after the breaker opened
	openAfter time.Duration   // from the stop to the breaker's gauge at 1
	recovered time.Duration   // from SIGCONT to the first cold 200
	metrics   map[string]float64
}

// outageScenario is (j): versitygw frozen with SIGSTOP for -outage while
// -outage-workers clients download, in proxy mode, segments whose record
// and bytes the edge read before (held: six of 64 KiB in memory, one of
// 16 MiB on the disk tier) and segments it never read (cold), then
// resumed. The default edge (grace 5m, store_timeout 5s) against the same
// edge with grace 0, as a control.
func outageScenario(e *env, rep *report) error {
	var arms []*outageArm
	for _, grace := range []string{"", "grace 0"} {
		a, err := e.runOutage(grace)
		if err != nil {
			return err
		}
		arms = append(arms, a)
	}
	rep.addSection(func(w func(string, ...any)) { outageMarkdown(w, arms) })
	return nil
}

func (e *env) runOutage(grace string) (*outageArm, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type seg struct {
		id   string
		kind int
	}
	var segs []seg
	for i := range 13 {
		size, kind := 64<<10, kindHeld
		switch {
		case i == 6:
			size = 16 << 20 // the disk tier
		case i > 6:
			kind = kindCold
		}
		b := make([]byte, size)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		id, err := e.put(ctx, b)
		if err != nil {
			return nil, err
		}
		segs = append(segs, seg{id, kind})
	}
	name := "outage"
	if grace != "" {
		name = "outage-nograce"
	}
	admin, port := freePort(), freePort()
	cfg := fmt.Sprintf(globalOpts, admin) + edgeSite(port, audTemplate, e.s3Block(), "delivery proxy\n\t\t"+grace)
	edge, err := e.startCaddy(name, *flagCaddy, cfg)
	if err != nil {
		return nil, err
	}
	defer edge.stop()
	if err := waitHTTP(edge, fmt.Sprintf("http://127.0.0.1:%d/", port)); err != nil {
		return nil, err
	}
	arm := &outageArm{name: grace}
	if grace == "" {
		arm.name = "default (grace 5m)"
	}
	urls := make([]string, len(segs))
	for i, s := range segs {
		urls[i] = segURL(port, s.id, e.token(s.id, time.Now().Add(time.Hour)))
	}
	tr := &http.Transport{MaxIdleConnsPerHost: *flagOutageWorkers, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	get := func(i int) (int, time.Duration) {
		start := time.Now()
		resp, err := client.Get(urls[i])
		if err != nil {
			return -1, time.Since(start)
		}
		h := sha256.New()
		_, err = io.Copy(h, resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if resp.StatusCode == 200 && (err != nil || "sha256:"+hex.EncodeToString(h.Sum(nil)) != segs[i].id) {
			return -2, took // cut or wrong bytes
		}
		return resp.StatusCode, took
	}
	for i, s := range segs {
		if s.kind == kindHeld {
			if st, _ := get(i); st != 200 {
				return nil, fmt.Errorf("warm-up of a held segment: %d", st)
			}
		}
	}

	var (
		phase, open atomic.Int64
		mu          sync.Mutex
		wg          sync.WaitGroup
		stop        atomic.Bool
		next        atomic.Int64
		coldSeen    atomic.Bool // a cold segment may be asked for
	)
	record := func(i, st int, took time.Duration) {
		p, k := int(phase.Load()), segs[i].kind
		mu.Lock()
		defer mu.Unlock()
		c := &arm.cells[p][k]
		switch st {
		case 200:
			c.ok++
		case 503:
			c.unavailable++
			if p == phaseDown && k == kindCold && open.Load() == 1 {
				arm.fastLat = append(arm.fastLat, took)
			}
		case 504:
			c.timeout++
		default:
			c.other++
		}
		c.lat = append(c.lat, took)
	}
	for range *flagOutageWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				i := int(next.Add(1)) % len(segs)
				if segs[i].kind == kindCold && !coldSeen.Load() {
					continue
				}
				st, took := get(i)
				record(i, st, took)
			}
		}()
	}
	scrape := func() map[string]float64 { return scrapeSyncular(admin) }
	time.Sleep(2 * time.Second)
	if err := e.gw.Signal(syscall.SIGSTOP); err != nil {
		stop.Store(true)
		wg.Wait()
		return nil, err
	}
	resumed := false
	defer func() {
		if !resumed {
			e.gw.Signal(syscall.SIGCONT)
		}
	}()
	downAt := time.Now()
	phase.Store(phaseDown)
	coldSeen.Store(true)
	for time.Since(downAt) < *flagOutage {
		if open.Load() == 0 && scrape()["caddy_syncular_store_breaker_open"] > 0 {
			open.Store(1)
			arm.openAfter = time.Since(downAt)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := e.gw.Signal(syscall.SIGCONT); err != nil {
		return nil, err
	}
	resumed = true
	upAt := time.Now()
	phase.Store(phaseAfter)
	open.Store(0)
	for time.Since(upAt) < 30*time.Second {
		if st, _ := get(len(segs) - 1); st == 200 {
			arm.recovered = time.Since(upAt)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	arm.metrics = scrape()
	log.Printf("outage (%s): breaker open after %s, recovered %s after SIGCONT; during the outage held %+v, cold %+v",
		arm.name, arm.openAfter.Round(time.Millisecond), arm.recovered.Round(time.Millisecond),
		cellText(arm.cells[phaseDown][kindHeld]), cellText(arm.cells[phaseDown][kindCold]))
	return arm, nil
}

// scrapeSyncular reads the caddy_syncular_* series of the admin endpoint.
func scrapeSyncular(admin int) map[string]float64 {
	m := map[string]float64{}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", admin))
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "caddy_syncular_") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				m[line[:i]] = v
			}
		}
	}
	return m
}

func cellText(c outageCell) string {
	return fmt.Sprintf("%d×200 %d×503 %d×504 %d other", c.ok, c.unavailable, c.timeout, c.other)
}

func pct(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func outageMarkdown(w func(string, ...any), arms []*outageArm) {
	w("## (j) Store outage: versitygw frozen (SIGSTOP) for %s under %d clients, proxy mode\n\n", *flagOutage, *flagOutageWorkers)
	w("Held segments: six of 64 KiB (memory) and one of 16 MiB (disk tier), record and bytes read before the outage; cold: six of 64 KiB never read before it. store_timeout 5s (default).\n\n")
	w("| edge | phase | segments | 200 | 503 store_unavailable | 504 store_timeout | other | median | p99 |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range arms {
		for p := range nPhases {
			for k := range nKinds {
				c := a.cells[p][k]
				w("| %s | %s | %s | %d | %d | %d | %d | %s | %s |\n", a.name, phaseNames[p], kindNames[k], c.ok, c.unavailable, c.timeout, c.other,
					pct(c.lat, 0.5).Round(time.Microsecond), pct(c.lat, 0.99).Round(time.Microsecond))
			}
		}
	}
	w("\n| edge | breaker open after | cold 503s with the breaker open: median / p99 | grace-served requests | fast failures | first cold 200 after SIGCONT |\n|---|---:|---:|---:|---:|---:|\n")
	for _, a := range arms {
		var served float64
		for k, v := range a.metrics {
			if strings.HasPrefix(k, "caddy_syncular_grace_requests_total{") && strings.Contains(k, `result="served"`) {
				served += v
			}
		}
		w("| %s | %s | %s / %s | %.0f | %.0f | %s |\n", a.name, a.openAfter.Round(time.Millisecond),
			pct(a.fastLat, 0.5).Round(time.Microsecond), pct(a.fastLat, 0.99).Round(time.Microsecond),
			served, a.metrics["caddy_syncular_store_fast_failures_total"], a.recovered.Round(time.Millisecond))
	}
	w("\nTarget: with the default grace every held request of the outage is a 200 with the right bytes; cold requests are 503 (504 only until the breaker opens) and, once it is open, answered without waiting store_timeout; after SIGCONT everything serves within a probe interval (1 s) or so. With grace 0 held requests fail like cold ones.\n\n")
}
