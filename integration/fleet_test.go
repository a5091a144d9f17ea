package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// fleetClient downloads through the front with many connections.
var fleetClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

// fleetEdge is one edge process of examples/fleet/edge.Caddyfile.
type fleetEdge struct {
	addr, logDir string
	metricsAddr  string // the edge's metrics site (the private interface)
	proc         *caddyProc
}

// edgeLog counts, per segment id, the granted answers an edge logged.
func (e fleetEdge) granted(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	f, err := os.Open(filepath.Join(e.logDir, "syncular-edge.log"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var line struct {
			Outcome string `json:"syncular_outcome"`
			Segment string `json:"syncular_segment_id"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Outcome == "granted" {
			out[line.Segment]++
		}
	}
	return out
}

// TestFleetExample runs examples/fleet: three edges (proxy mode, one
// versitygw bucket) behind one stock front that hashes the segment path.
// 200 clients × 5 segments must all be hash-correct with each segment read
// from the bucket once across the fleet; then the edge owning most
// segments is stopped mid-run: no client fails and its segments move.
// In redirect mode every edge hands out the same Location for a segment.
func TestFleetExample(t *testing.T) {
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"fleet"}})
	const partition = "tenant-fleet"
	segs := putSegments(t, srv, "segments", partition, digest, 5, 64_000)
	segKeyCfg, segKey := exampleKey(t)
	audKeyCfg, audKey := exampleKey(t)
	aud := hmacAud(t, audKey, partition)
	up := newRecordingUpstream(t)
	baseEnv := []string{
		"SYNCULAR_SEGMENT_KEY=" + segKeyCfg,
		"SYNCULAR_AUDIENCE_KEY=" + audKeyCfg,
		"SYNCULAR_S3_ENDPOINT=" + srv.Endpoint,
		"SYNCULAR_S3_ACCESS_KEY_ID=" + srv.AccessKey,
		"SYNCULAR_S3_SECRET_ACCESS_KEY=" + srv.SecretKey,
		"SYNCULAR_S3_BUCKET=segments",
		"SYNCULAR_BIND=127.0.0.1",
		"SYNCULAR_UPSTREAM=" + up.addr,
	}
	startEdges := func(delivery string) []fleetEdge {
		var edges []fleetEdge
		for i := 0; i < 3; i++ {
			port, addr := loopback(t)
			_, admin := loopback(t)
			mport, maddr := loopback(t)
			e := fleetEdge{addr: addr, logDir: t.TempDir(), metricsAddr: maddr}
			env := append(append([]string{}, baseEnv...),
				fmt.Sprintf("SYNCULAR_EDGE_ADDRESS=:%d", port), "SYNCULAR_ADMIN="+admin,
				"SYNCULAR_LOG_DIR="+e.logDir, "SYNCULAR_DELIVERY="+delivery,
				fmt.Sprintf("SYNCULAR_METRICS_PORT=%d", mport), "SYNCULAR_METRICS_BIND=127.0.0.1")
			e.proc = startConfig(t, examplePath(t, "fleet", "edge.Caddyfile"), "caddyfile", env, addr, maddr)
			edges = append(edges, e)
		}
		return edges
	}
	token := func(client int, id string) string {
		// Every client's token differs (its own expiry), as in production.
		return token.Sign(segKey, id, digest, aud, time.Now().Add(10*time.Minute+time.Duration(client)*time.Second).Unix())
	}

	edges := startEdges("proxy")
	frontPort, frontAddr := loopback(t)
	_, frontAdmin := loopback(t)
	var list []string
	for _, e := range edges {
		list = append(list, e.addr)
	}
	front := startConfig(t, examplePath(t, "fleet", "front.Caddyfile"), "caddyfile", []string{
		fmt.Sprintf("SYNCULAR_FRONT_ADDRESS=:%d", frontPort), "SYNCULAR_ADMIN=" + frontAdmin,
		"SYNCULAR_BIND=127.0.0.1", "SYNCULAR_EDGES=" + strings.Join(list, " "), "SYNCULAR_UPSTREAM=" + up.addr,
	}, frontAddr)
	base := "http://" + frontAddr + "/sync/segments/"

	// run downloads clients × segments through the front with 32 workers;
	// after `at` downloads it calls midway once. It returns the failures.
	run := func(clients int, at int64, midway func()) []string {
		type job struct{ client, seg int }
		jobs := make(chan job)
		var mu sync.Mutex
		var fails []string
		var done atomic.Int64
		var once sync.Once
		var wg sync.WaitGroup
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range jobs {
					s := segs[j.seg]
					r, err := get(fleetClient, base+s.id+"?st="+token(j.client, s.id), nil)
					if err == nil && (r.Status != 200 || s3test.SegmentID(r.Body) != s.id) {
						err = fmt.Errorf("status %d, %d bytes", r.Status, len(r.Body))
					}
					if err != nil {
						mu.Lock()
						fails = append(fails, fmt.Sprintf("client %d segment %d: %v", j.client, j.seg, err))
						mu.Unlock()
					}
					if done.Add(1) == at && midway != nil {
						once.Do(midway)
					}
				}
			}()
		}
		for c := 0; c < clients; c++ {
			for s := range segs {
				jobs <- job{c, s}
			}
		}
		close(jobs)
		wg.Wait()
		return fails
	}
	gets := func() []int {
		var n []int
		for _, s := range segs {
			n = append(n, srv.CountRequests(t, "s3_GetObject", s3test.ObjectKey(examplePrefix, s.id)))
		}
		return n
	}
	owners := func(alive []fleetEdge) map[string][]int {
		o := map[string][]int{}
		for i, e := range alive {
			for id := range e.granted(t) {
				o[id] = append(o[id], i)
			}
		}
		return o
	}

	// Phase 1: 200 clients, every edge up.
	if fails := run(200, -1, nil); len(fails) > 0 {
		t.Fatalf("%d of 1000 downloads failed, first: %s", len(fails), fails[0])
	}
	phase1 := gets()
	t.Logf("phase 1: bucket GETs per segment %v", phase1)
	// Each edge's metrics site answers on its own (private) address, and
	// its /healthz reports the store's breaker closed.
	for i, e := range edges {
		r, err := get(http.DefaultClient, "http://"+e.metricsAddr+"/metrics", nil)
		if err != nil || r.Status != 200 || !strings.Contains(string(r.Body), "caddy_syncular_build_info{") {
			t.Errorf("edge %d metrics site: %v %d", i, err, r.Status)
		}
		r, err = get(http.DefaultClient, "http://"+e.addr+"/healthz", nil)
		if err != nil || r.Status != 200 || !strings.Contains(string(r.Body), `"breaker":"closed"`) {
			t.Errorf("edge %d /healthz: %v %d %s", i, err, r.Status, r.Body)
		}
	}
	for i, n := range phase1 {
		if n != 1 {
			t.Errorf("segment %d read from the bucket %d times across the fleet, want 1", i, n)
		}
	}
	own := owners(edges)
	perEdge := make([][]int, len(edges))
	for i, s := range segs {
		if len(own[s.id]) != 1 {
			t.Fatalf("segment %d served by edges %v, want exactly one", i, own[s.id])
		}
		perEdge[own[s.id][0]] = append(perEdge[own[s.id][0]], i)
	}
	t.Logf("phase 1: segments per edge %v", perEdge)
	victim := 0
	for i := range perEdge {
		if len(perEdge[i]) > len(perEdge[victim]) {
			victim = i
		}
	}
	before := make([]map[string]int, len(edges))
	for i, e := range edges {
		before[i] = e.granted(t)
	}

	// Phase 2: 200 more clients; the busiest edge is stopped after 300
	// downloads (Caddy's graceful stop, as an operator takes it out).
	var stopErr error
	fails := run(200, 300, func() { stopErr = edges[victim].proc.stopGraceful(15 * time.Second) })
	if stopErr != nil {
		t.Fatal(stopErr)
	}
	t.Logf("phase 2: edge %d (segments %v) stopped after 300 of 1000 downloads: %d failures", victim, perEdge[victim], len(fails))
	if len(fails) > 0 {
		t.Errorf("%d downloads failed while an edge stopped, first: %s", len(fails), fails[0])
	}
	phase2 := gets()
	t.Logf("phase 2: bucket GETs per segment %v (cumulative)", phase2)
	moved := map[int]bool{}
	for _, i := range perEdge[victim] {
		moved[i] = true
	}
	for i, n := range phase2 {
		want := 1
		if moved[i] {
			want = 2 // once more, by the edge it moved to
		}
		if n != want {
			t.Errorf("segment %d: %d bucket GETs after the stop, want %d", i, n, want)
		}
	}
	for _, si := range perEdge[victim] {
		id := segs[si].id
		var to []int
		for ei, e := range edges {
			if ei != victim && e.granted(t)[id] > before[ei][id] {
				to = append(to, ei)
			}
		}
		t.Logf("phase 2: segment %d moved from edge %d to edges %v", si, victim, to)
		if len(to) != 1 {
			t.Errorf("segment %d went to edges %v after the stop, want exactly one", si, to)
		}
	}
	noneOf(t, "front log", front.Output(), segKeyCfg, audKeyCfg, srv.SecretKey)

	// Redirect mode: three edges, three clients with different tokens,
	// one Location per segment (the URLs are signed on aligned windows).
	t.Run("redirect", func(t *testing.T) {
		redir := startEdges("redirect")
		for si, s := range segs {
			var agreed bool
			for attempt := 0; attempt < 3 && !agreed; attempt++ {
				var locs []string
				dates := map[string]bool{}
				for ei, e := range redir {
					r := do(t, "GET", "http://"+e.addr+"/sync/segments/"+s.id+"?st="+token(ei+attempt*3, s.id), nil)
					if r.Status != 302 {
						t.Fatalf("edge %d: %d %s", ei, r.Status, r.Body)
					}
					loc := r.Header.Get("Location")
					u, err := url.Parse(loc)
					if err != nil {
						t.Fatal(err)
					}
					dates[u.Query().Get("X-Amz-Date")] = true
					locs = append(locs, loc)
				}
				if len(dates) > 1 {
					continue // a signing window ended between the requests
				}
				uniq := map[string]bool{}
				for _, l := range locs {
					uniq[l] = true
				}
				if len(uniq) != 1 {
					keys := make([]string, 0, len(uniq))
					for l := range uniq {
						keys = append(keys, l)
					}
					sort.Strings(keys)
					t.Fatalf("segment %d: %d different Locations in one window:\n%s", si, len(uniq), strings.Join(keys, "\n"))
				}
				b := do(t, "GET", locs[0], nil)
				if b.Status != 200 || s3test.SegmentID(b.Body) != s.id {
					t.Fatalf("segment %d: presigned URL answered %d", si, b.Status)
				}
				agreed = true
			}
			if !agreed {
				t.Fatalf("segment %d: no three requests within one signing window in 3 attempts", si)
			}
		}
	})
}
