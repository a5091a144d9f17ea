package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/syncular/caddy-syncular/internal/busywriter"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
)

// The writer scenario (k): the sync server's writes beside the edge. A
// writer configured as the reference sync server ships (one connection,
// no busy timeout) commits a small transaction every writerInterval for
// the whole of a storm of writerClients cold clients, each downloading
// all 8 segments (7 small, one of 24 MiB, through the disk tier) with a
// token of its own; once with the file in a rollback journal, once in
// WAL.

const (
	writerClients  = 100
	writerInterval = 20 * time.Millisecond
)

var (
	flagWriterRounds = flag.Int("writer-rounds", 1, "cold storms per journal mode in (k), each on a fresh file and edge; the failed commits are summed")
	flagWriterModes  = flag.String("writer-modes", "delete,wal", "journal modes (k) runs, comma-separated")
	flagWriterDur    = flag.Duration("writer-dur", 0, "in (k), clients keep downloading (a random segment, a new token each time) until this long after the storm began; 0: one pass each")
)

// writerSizes: 7 segments for the memory tier and one for the disk tier.
var writerSizes = []int{16 << 10, 64 << 10, 200 << 10, 512 << 10, 1 << 20, 2<<20 + 5, 3 << 20, 24 << 20}

type writerResult struct {
	mode      string
	res       busywriter.Result
	share     float64
	samples   int64
	ok, total int
	took      time.Duration
	fails     map[string]int
	rounds    []string // failed/total per storm
}

func writerScenario(e *env, rep *report) error {
	segs := make([][]byte, len(writerSizes))
	for i, n := range writerSizes {
		segs[i] = make([]byte, n)
		r := rand.New(rand.NewPCG(uint64(i), 99))
		for j := range segs[i] {
			segs[i][j] = byte(r.Uint32())
		}
	}
	var results []*writerResult
	rounds := max(*flagWriterRounds, 1)
	for _, mode := range strings.Split(*flagWriterModes, ",") {
		if mode != "delete" && mode != "wal" {
			return fmt.Errorf("-writer-modes: %q is neither delete nor wal", mode)
		}
		sum := &writerResult{mode: mode, res: busywriter.Result{Errors: map[string]int{}}}
		var lockSamples float64
		for round := 1; round <= rounds; round++ {
			res, err := writerRun(e, mode, round, segs)
			if err != nil {
				return fmt.Errorf("%s: %w", mode, err)
			}
			la, _ := os.ReadFile("/proc/loadavg")
			log.Printf("(k) %s round %d/%d: %d clients x %d segments in %s, %d/%d right; writer: %s; read lock held in %.3f%% of %d samples; load average %s",
				mode, round, rounds, writerClients, len(segs), res.took.Round(time.Millisecond), res.ok, res.total, res.res, 100*res.share, res.samples,
				strings.Join(strings.Fields(string(la))[:min(3, len(strings.Fields(string(la))))], " "))
			sum.res.Commits += res.res.Commits
			sum.res.Failed += res.res.Failed
			for k, v := range res.res.Errors {
				sum.res.Errors[k] += v
			}
			sum.ok += res.ok
			sum.total += res.total
			sum.took += res.took
			sum.samples += res.samples
			lockSamples += res.share * float64(res.samples)
			sum.rounds = append(sum.rounds, fmt.Sprintf("%d/%d", res.res.Failed, res.res.Commits))
		}
		if sum.samples > 0 {
			sum.share = lockSamples / float64(sum.samples)
		}
		results = append(results, sum)
	}
	rep.addSection(func(w func(string, ...any)) {
		w("## (k) The sync server's writes beside a cold storm\n\n")
		w("A writer as the reference sync server ships it (one connection, **no** busy timeout) commits a one-row transaction every %s, from before until after a storm of %d clients, each downloading all %d segments (%s; the largest is a disk-tier fill) from a cold edge with a token of its own, every body checked against its id. Failed commits are the writer's own errors (all \"database is locked\"); target at most 1 in 500 in a rollback journal, 0 in WAL. Read-lock share: a probe in the writer's process samples every 500 µs with fcntl(F_GETLK), which takes no lock, whether another process (the edge) holds a read lock: the database file's SHARED range in a rollback journal, the -shm read marks in WAL (where a reader's lock never blocks the writer's commit; it only holds back checkpoints).\n\n",
			writerInterval, writerClients, len(writerSizes), sizesText(writerSizes))
		if rounds > 1 || *flagWriterDur > 0 {
			w("This run: %d cold storm(s) per mode (each on a fresh file and edge), clients downloading for %s after each storm began (0: one pass); failed/total per storm in the last column.\n\n", rounds, *flagWriterDur)
		}
		w("| journal mode | failed commits / total | per 500 (target) | edge held a read lock (share of samples) | downloads right | storm | per storm |\n|---|---:|---:|---:|---:|---:|---|\n")
		for _, r := range results {
			per := 0.0
			if r.res.Commits > 0 {
				per = 500 * float64(r.res.Failed) / float64(r.res.Commits)
			}
			target, ok := "≤ 1", per <= 1
			if r.mode == "wal" {
				target, ok = "0", r.res.Failed == 0
			}
			name := map[string]string{"delete": "rollback (DELETE)", "wal": "WAL"}[r.mode]
			w("| %s | %d / %d | %.2f (%s, %s) | %.3f%% of %d | %d / %d | %s | %s |\n", name, r.res.Failed, r.res.Commits, per, target,
				verdict(ok), 100*r.share, r.samples, r.ok, r.total, r.took.Round(time.Millisecond), strings.Join(r.rounds, ", "))
		}
		w("\n")
	})
	return nil
}

func sizesText(sizes []int) string {
	s := ""
	for i, n := range sizes {
		if i > 0 {
			s += ", "
		}
		if n >= 1<<20 {
			s += fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
		} else {
			s += fmt.Sprintf("%d KiB", n>>10)
		}
	}
	return s
}

// writerRun seeds a fresh file in mode, starts a cold edge on it, and runs
// the writer beside the storm.
func writerRun(e *env, mode string, round int, segs [][]byte) (*writerResult, error) {
	name := fmt.Sprintf("writer-%s-%d", mode, round)
	path := filepath.Join(e.dir, name+".db")
	w, err := seed.Create(path, 3)
	if err != nil {
		return nil, err
	}
	now := time.Now().UnixMilli()
	var ids []string
	for _, b := range segs {
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: store.Publication{
			Partition: partition, LogEpoch: "e1", Table: "tasks", ScopeDigest: scopeDigest,
			AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
		}})
		if err != nil {
			w.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	if mode == "delete" {
		err = w.Exec("PRAGMA journal_mode=DELETE")
	}
	w.Close()
	if err != nil {
		return nil, err
	}
	if err := busywriter.Prepare(path); err != nil {
		return nil, err
	}
	port := freePort()
	edge, err := e.startCaddy(name, *flagCaddy, fmt.Sprintf(globalOpts, freePort())+
		edgeSite(port, audTemplate, "store sqlite "+path, ""))
	if err != nil {
		return nil, err
	}
	defer edge.stop()
	// Any answer will do: an untokened request reads nothing.
	if err := waitHTTP(edge, fmt.Sprintf("http://127.0.0.1:%d/sync/segments/x", port)); err != nil {
		return nil, err
	}
	probe, err := busywriter.StartProbe(path, 500*time.Microsecond)
	if err != nil {
		return nil, err
	}
	defer probe.Stop() // last: see StartProbe
	wr, err := busywriter.Start(path, writerInterval)
	if err != nil {
		return nil, err
	}
	time.Sleep(300 * time.Millisecond)
	r := &writerResult{mode: mode, fails: map[string]int{}}
	tr := &http.Transport{MaxIdleConnsPerHost: writerClients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 3 * time.Minute}
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range writerClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 5))
			get := func(k int) {
				tok := e.token(ids[k], time.Now().Add(time.Hour+time.Duration(i)*time.Second))
				why := fetchCheck(client, segURL(port, ids[k], tok), ids[k])
				mu.Lock()
				r.total++
				if why == "" {
					r.ok++
				} else {
					r.fails[why]++
				}
				mu.Unlock()
			}
			for _, k := range rng.Perm(len(ids)) {
				get(k)
			}
			for time.Since(t0) < *flagWriterDur {
				get(rng.IntN(len(ids)))
			}
		}()
	}
	wg.Wait()
	r.took = time.Since(t0)
	time.Sleep(300 * time.Millisecond)
	r.res = wr.Stop()
	r.share, r.samples = probe.Share()
	if len(r.fails) > 0 {
		log.Printf("(k) %s: failed downloads: %v", mode, r.fails)
	}
	if len(r.res.FailedAt) > 0 {
		at := make([]string, len(r.res.FailedAt))
		for i, t := range r.res.FailedAt {
			at[i] = strconv.FormatInt(t.UnixMicro(), 10)
		}
		log.Printf("(k) %s: failed commits began at (unix µs): %s", mode, strings.Join(at, " "))
	}
	return r, nil
}

// fetchCheck GETs u and checks the body hashes to id: "" when it does.
func fetchCheck(c *http.Client, u, id string) string {
	resp, err := c.Get(u)
	if err != nil {
		return "request failed"
	}
	defer resp.Body.Close()
	h := sha256.New()
	_, err = io.Copy(h, resp.Body)
	switch {
	case resp.StatusCode != 200:
		return fmt.Sprintf("status %d", resp.StatusCode)
	case err != nil:
		return "body cut short"
	case "sha256:"+hex.EncodeToString(h.Sum(nil)) != id:
		return "wrong bytes"
	}
	return ""
}
