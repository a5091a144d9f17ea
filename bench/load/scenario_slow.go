package main

import (
	"fmt"
	"log"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

const (
	slowClients = 100
	slowRate    = 1 << 20 // bytes/s per client
	slowFor     = 10 * time.Second
)

type slowResult struct {
	backend                string
	crowd                  *crowd
	reads                  int
	rssIdle, rssPeak       int64
	fdBase, fdPeak, fdLast int
	fdBack                 time.Duration // after the last client left; -1: not back
	minBytes, maxBytes     int
	extraFDs               []string // after: open, not open at the baseline
}

// slowScenario is (f): slowClients clients read the cold 64 MiB segment
// at slowRate each for slowFor, then disconnect; the edge's RSS and open
// file descriptors are watched during and after.
func slowScenario(e *env, rep *report) error {
	l, err := e.large()
	if err != nil {
		return err
	}
	var results []*slowResult
	for _, b := range largeBackends {
		name := "slow-" + b
		edge, err := e.startLargeEdge(name, b, filepath.Join(e.dir, name+"-disk"))
		if err != nil {
			return err
		}
		res := &slowResult{backend: b, fdBase: fdCount(edge.pid())}
		base := fdTargets(edge.pid())
		res.rssIdle, _ = procStatus(edge.pid(), "VmRSS")
		reads0 := edge.storeReads()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // sample the fds while the clients read
			defer wg.Done()
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					res.fdPeak = max(res.fdPeak, fdCount(edge.pid()))
				}
			}
		}()
		res.crowd, err = runCrowd(slowClients, edge.url, l.bytes, slowRate, slowFor, nil)
		close(stop)
		wg.Wait()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		left := time.Now()
		res.fdBack = -1
		for time.Since(left) < 15*time.Second {
			if res.fdLast = fdCount(edge.pid()); res.fdLast <= res.fdBase {
				res.fdBack = time.Since(left)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if res.fdBack < 0 {
			for fd, t := range fdTargets(edge.pid()) {
				if base[fd] != t {
					log.Printf("(f) %s: fd %s → %s (not open at the baseline)", b, fd, t)
					res.extraFDs = append(res.extraFDs, t)
				}
			}
			slices.Sort(res.extraFDs)
		}
		res.reads = edge.storeReads() - reads0
		res.rssPeak, _ = procStatus(edge.pid(), "VmHWM")
		res.minBytes, res.maxBytes = slices.Min(res.crowd.bytes), slices.Max(res.crowd.bytes)
		edge.stop()
		log.Printf("(f) %s: %d/%d ok, read %d..%d bytes each, %d store reads, fds %d → peak %d → %d (back after %v), RSS idle %.1f peak %.1f MiB (first error: %v)",
			b, res.crowd.ok, res.crowd.clients, res.minBytes, res.maxBytes, res.reads, res.fdBase, res.fdPeak, res.fdLast, res.fdBack,
			mib(res.rssIdle), mib(res.rssPeak), res.crowd.firstErr)
		results = append(results, res)
	}
	rep.addSection(func(w func(string, ...any)) {
		w("## (f) %d slow readers of a 64 MiB segment\n\n", slowClients)
		w("Each client reads at %d KiB/s (a rate-limited reader, every byte compared with the segment) for %s, then closes its connection (no keep-alive). The segment is cold when they arrive (they trigger the fill). File descriptors: entries of `/proc/<pid>/fd`, baseline after a HEAD (store connection open), sampled every 250 ms during, then polled every 100 ms for up to 15 s after the last client left.\n\n", slowRate>>10, slowFor)
		w("| backend | clients without error | bytes read per client (min–max) | store reads of the bytes | RSS idle → peak (VmHWM) | fds baseline → peak → after | fds back to baseline |\n|---|---:|---|---:|---|---|---|\n")
		for _, r := range results {
			back := "**no** (after 15 s)"
			if r.fdBack >= 0 {
				back = "yes, " + durMs(r.fdBack) + " after the last client left"
			} else if len(r.extraFDs) > 0 {
				back += "; still open: " + strings.Join(r.extraFDs, ", ")
			}
			w("| %s | %d / %d | %.1f–%.1f MiB | %d | %.1f → %.1f MiB (+%.1f; target ≤ +96: %s) | %d → %d → %d | %s |\n",
				backendName(r.backend), r.crowd.ok, r.crowd.clients, float64(r.minBytes)/(1<<20), float64(r.maxBytes)/(1<<20), r.reads,
				mib(r.rssIdle), mib(r.rssPeak), mib(r.rssPeak-r.rssIdle), verdict(r.rssPeak <= r.rssIdle+budgetKiB),
				r.fdBase, r.fdPeak, r.fdLast, back)
		}
		w("\n")
	})
	return nil
}
