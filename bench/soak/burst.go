package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The burst: after the soak's idle sample, n clients open the 4 MiB
// segment at once on a site that keeps no bytes (every answer streams
// from S3 through the edge), read 64 KiB each and stall with the rest
// unread. With all of them stalled the edge's memory is sampled, then
// every client drops its connection, and the memory is sampled again
// burstSettle and burstLate later. It fails when the memory, fds or
// goroutines the crowd took are still held burstLate after it left,
// beyond burstSlack and the soak's bounds. burstLate is past the S3
// client's IdleConnTimeout (90 s, store/s3/s3.go): until then the edge keeps
// up to 128 idle connections to the bucket on purpose (two goroutines and
// an fd each), the ones the crowd's streams opened.
const (
	burstSettle = 4 * time.Second
	burstLate   = 100 * time.Second
	// burstSlack: anonymous memory allowed above the idle sample once the
	// crowd has left; what a crowd of connections leaves that the edge
	// keeps on purpose (pooled buffers of the streams that are still
	// wanted, the runtime's own slack).
	burstSlack = 16 << 20
)

type burstResult struct {
	n                               int
	opened                          int
	idle, open, settled, late       procSample
	heapOpen, heapSettled, heapLate string
}

func (s *soak) burst(n int, idle procSample) (*burstResult, error) {
	r := &burstResult{n: n, idle: idle}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true, ResponseHeaderTimeout: 30 * time.Second}}
	var (
		mu    sync.Mutex
		held  []io.Closer
		wg    sync.WaitGroup
		fails []string
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(s.url(s.s3Stream, s.stallSeg.id, s.token(s.stallSeg.id)))
			if err != nil {
				mu.Lock()
				fails = append(fails, err.Error())
				mu.Unlock()
				return
			}
			_, err = io.CopyN(io.Discard, resp.Body, 64<<10)
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != http.StatusOK || err != nil {
				fails = append(fails, fmt.Sprintf("status %d, %v", resp.StatusCode, err))
				resp.Body.Close()
				return
			}
			held = append(held, resp.Body)
		}()
	}
	wg.Wait()
	r.opened = len(held)
	if r.opened < n*9/10 {
		for _, c := range held {
			c.Close()
		}
		return nil, fmt.Errorf("%d of %d streams opened: %v", r.opened, n, fails[:min(len(fails), 3)])
	}
	time.Sleep(time.Second)
	var err error
	if r.open, err = s.sample(); err != nil {
		return nil, err
	}
	r.heapOpen = s.heapProfile("burst-open")
	// Every client drops its stream mid-body.
	for _, c := range held {
		c.Close()
	}
	client.CloseIdleConnections()
	time.Sleep(burstSettle)
	if r.settled, err = s.sample(); err != nil {
		return nil, err
	}
	r.heapSettled = s.heapProfile("burst-settled")
	time.Sleep(burstLate - burstSettle)
	if r.late, err = s.sample(); err != nil {
		return nil, err
	}
	r.heapLate = s.heapProfile("burst-late")
	s.saveProfile("goroutine?debug=1", "goroutines-burst-late.txt")
	return r, nil
}

// heapProfile saves the admin API's heap profile (pprof format, for go
// tool pprof) under the work directory and returns the runtime's figures.
func (s *soak) heapProfile(name string) string {
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", s.admin)); err == nil {
		if b, err := io.ReadAll(resp.Body); err == nil {
			os.WriteFile(filepath.Join(s.dir, "heap-"+name+".pb.gz"), b, 0o644)
		}
		resp.Body.Close()
	}
	return s.heapStats()
}

// saveProfile saves an admin API pprof answer under the work directory.
func (s *soak) saveProfile(path, name string) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/%s", s.admin, path))
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err == nil {
		os.WriteFile(filepath.Join(s.dir, name), b, 0o644)
	}
}

func (r *burstResult) print() {
	fmt.Printf("\nburst: %d stalled S3 proxy streams at once (%d opened), each 64 KiB read of 4 MiB, then dropped\n", r.n, r.opened)
	fmt.Printf("%-12s %12s %12s %12s %12s\n", "", "idle", "stalled", fmt.Sprintf("+%v", burstSettle), fmt.Sprintf("+%v", burstLate))
	fmt.Printf("%-12s %12s %12s %12s %12s\n", "RSS", mib(r.idle.rss), mib(r.open.rss), mib(r.settled.rss), mib(r.late.rss))
	fmt.Printf("%-12s %12s %12s %12s %12s\n", "anon", mib(r.idle.anon), mib(r.open.anon), mib(r.settled.anon), mib(r.late.anon))
	fmt.Printf("%-12s %12d %12d %12d %12d\n", "fds", r.idle.fds, r.open.fds, r.settled.fds, r.late.fds)
	fmt.Printf("%-12s %12d %12d %12d %12d\n", "goroutines", r.idle.goroutines, r.open.goroutines, r.settled.goroutines, r.late.goroutines)
	fmt.Printf("Go runtime, stalled: %s\n", r.heapOpen)
	fmt.Printf("Go runtime, +%v: %s\n", burstSettle, r.heapSettled)
	fmt.Printf("Go runtime, +%v: %s\n", burstLate, r.heapLate)
	fmt.Printf("burst bound: anon +%v after the crowd left <= idle + %s\n", burstLate, mib(burstSlack))
}

func (r *burstResult) fails() []string {
	var out []string
	if bound := r.idle.anon + burstSlack; r.late.anon > bound {
		out = append(out, fmt.Sprintf("burst: anon memory %s %v after the crowd left, bound idle + %s = %s", mib(r.late.anon), burstLate, mib(burstSlack), mib(bound)))
	}
	if r.late.goroutines > r.idle.goroutines+boundGoroutines {
		out = append(out, fmt.Sprintf("burst: goroutines %d %v after the crowd left, bound idle+%d", r.late.goroutines, burstLate, boundGoroutines))
	}
	if r.late.fds > r.idle.fds+boundFDs {
		out = append(out, fmt.Sprintf("burst: fds %d %v after the crowd left, bound idle+%d", r.late.fds, burstLate, boundFDs))
	}
	return out
}
