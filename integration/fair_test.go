package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// fairSite is an S3 proxy edge with a small store read gate: 4 reads at
// once, 64 waiting, 1 s of wait, so that a storm of one tenant fills it.
const fairSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log {
		level DEBUG
		output file {{DIR}}/server.log
	}
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store s3 {
			bucket segs
			region us-east-1
			endpoint {env.S3_ENDPOINT}
			access_key_id {env.S3_KEY}
			secret_access_key {env.S3_SECRET}
		}
		delivery proxy
		untokened reject
		store_timeout 5s
		store_concurrency 4
		store_queue 64
		store_queue_wait 1s
		cache {
			max_entry 64KiB
			disk {{DIR}}/segments
		}
	}
	respond "not the segment handler" 418
}
`

// Partition ids of the two tenants: distinctive, so that the test can
// look for them in the log and the metrics.
const (
	fairPartA = "storming-tenant-partition-a1"
	fairPartB = "quiet-tenant-partition-b2"
)

// fairSegment writes b to the bucket with a record granting hardDigest to
// partition part.
func fairSegment(t testing.TB, srv *s3test.Server, part string, b []byte) string {
	t.Helper()
	now := time.Now().UnixMilli()
	rec := map[string]any{
		"segmentId": s3test.SegmentID(b), "partition": part, "logEpoch": "e1", "table": "tasks",
		"schemaVersion": 1, "mediaType": "rows", "scopeDigest": hardDigest, "asOfCommitSeq": 1,
		"rowCount": 1, "rowCursor": nil, "nextRowCursor": nil, "byteLength": len(b),
		"createdAtMs": now, "expiresAtMs": now + 3600_000,
	}
	return s3test.PutSegment(t, srv.Client(), "segs", "", b, s3test.RecordHeader(rec))
}

// fairOutcome is one download: its status, whether the body hashed to its
// id, the error code of a refusal, its Retry-After, and how long it took.
type fairOutcome struct {
	status     int
	bytesOK    bool
	code       string
	retryAfter string
	took       time.Duration
	err        error
}

var fairClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}

func fairFetch(url, id string) fairOutcome {
	start := time.Now()
	res, err := fairClient.Get(url)
	if err != nil {
		return fairOutcome{err: err, took: time.Since(start)}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	o := fairOutcome{status: res.StatusCode, retryAfter: res.Header.Get("Retry-After"), took: time.Since(start), err: err}
	sum := sha256.Sum256(body)
	o.bytesOK = "sha256:"+hex.EncodeToString(sum[:]) == id
	if res.StatusCode != 200 {
		var e struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(body, &e)
		o.code = e.Code
	}
	return o
}

// fairURL signs id for partition part.
func fairURL(base, key, id, part string) string {
	tok := token.Sign([]byte(key), id, hardDigest, "aud:"+part, time.Now().Add(time.Hour).Unix())
	return base + "/segments/" + id + "?st=" + tok
}

// metricSum is the sum of the series of name (any labels) on the admin
// endpoint.
func metricSum(t *testing.T, c *caddyProc, name string) (float64, string) {
	t.Helper()
	r := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/metrics", c.AdminPort), nil)
	var sum float64
	for _, line := range strings.Split(string(r.Body), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum, string(r.Body)
}

// TestFairStoreWorkS3: tenant A's clients ask for 300 distinct cold
// segments at once (280 for the memory cache, 20 for the disk tier)
// while tenant B asks for 4 (one for the disk tier); the store read gate
// (4 reads, 64 waiting, 1 s) is contended. Every download of B succeeds
// with its bytes; every download of A gets its bytes or a 503
// edge.overloaded with a Retry-After of 1 to 5 s, none later than the
// wait and the store timeout allow; the gate's series show the refusals
// and end at zero; neither partition id is in the log or the metrics.
func TestFairStoreWorkS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	var aIDs, bIDs []string
	for i := range 300 {
		size := 6 << 10
		if i%15 == 0 {
			size = 96 << 10 // above max_entry: a disk tier fill
		}
		aIDs = append(aIDs, fairSegment(t, srv, fairPartA, pseudoRandom(size+i, byte(i))))
	}
	for i := range 4 {
		size := 6 << 10
		if i == 0 {
			size = 96 << 10
		}
		bIDs = append(bIDs, fairSegment(t, srv, fairPartB, pseudoRandom(size+i, byte(200+i))))
	}
	key := randKey(t)
	c := startCaddy(t, fairSite, "SEG_KEY="+key, "S3_ENDPOINT="+srv.Endpoint,
		"S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)

	aOut := make([]fairOutcome, len(aIDs))
	bOut := make([]fairOutcome, len(bIDs))
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := make(chan struct{})
	for i, id := range aIDs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-started
			aOut[i] = fairFetch(fairURL(c.Base, key, id, fairPartA), id)
		}()
	}
	close(started)
	// B asks once A's reads fill the gate's waiting list.
	for ctx.Err() == nil {
		if w, _ := metricSum(t, c, "caddy_syncular_store_reads_waiting"); w >= 32 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitingAtB, _ := metricSum(t, c, "caddy_syncular_store_reads_waiting")
	var wgB sync.WaitGroup
	for i, id := range bIDs {
		wgB.Add(1)
		go func() {
			defer wgB.Done()
			bOut[i] = fairFetch(fairURL(c.Base, key, id, fairPartB), id)
		}()
	}
	wgB.Wait()
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("the storm did not end within a minute")
	}

	for i, o := range bOut {
		if o.err != nil || o.status != 200 || !o.bytesOK {
			t.Errorf("tenant B download %d: status %d, bytes ok %v, code %q, err %v (took %v)", i, o.status, o.bytesOK, o.code, o.err, o.took)
		}
	}
	// A download reads a record and then the bytes: each waits at most
	// store_queue_wait for a slot and store_timeout for the read.
	const bound = 2*(time.Second+5*time.Second) + 2*time.Second
	var ok, refused int
	var slowest time.Duration
	for i, o := range aOut {
		slowest = max(slowest, o.took)
		switch {
		case o.err != nil:
			t.Errorf("tenant A download %d: %v", i, o.err)
		case o.status == 200 && o.bytesOK:
			ok++
		case o.status == 503 && o.code == "edge.overloaded":
			if ra, err := strconv.Atoi(o.retryAfter); err != nil || ra < 1 || ra > 5 {
				t.Errorf("tenant A download %d: Retry-After %q, want 1 to 5", i, o.retryAfter)
			}
			refused++
		default:
			t.Errorf("tenant A download %d: status %d, code %q, bytes ok %v", i, o.status, o.code, o.bytesOK)
		}
		if o.took > bound {
			t.Errorf("tenant A download %d took %v, past the gate's bound %v", i, o.took, bound)
		}
	}
	t.Logf("tenant A: %d with their bytes, %d refused 503 edge.overloaded, slowest %v; B asked with %v reads waiting", ok, refused, slowest, waitingAtB)
	if refused == 0 || ok == 0 {
		t.Errorf("the gate was not contended (%d ok, %d refused): the test proves nothing", ok, refused)
	}
	if waitingAtB < 32 {
		t.Errorf("B asked with %v reads waiting, want the list contended", waitingAtB)
	}
	refusedTotal, text := metricSum(t, c, "caddy_syncular_store_reads_refused_total")
	if refusedTotal < float64(refused) {
		t.Errorf("store_reads_refused_total %v, fewer than the %d refused downloads", refusedTotal, refused)
	}
	inUse, _ := metricSum(t, c, "caddy_syncular_store_reads_in_use")
	waiting, _ := metricSum(t, c, "caddy_syncular_store_reads_waiting")
	if inUse != 0 || waiting != 0 {
		t.Errorf("after the storm: %v reads in use, %v waiting (a slot leaked)", inUse, waiting)
	}
	// Every refused download of A can be retried: they all get their
	// bytes once the storm is over.
	for i, o := range aOut {
		if o.status == 503 {
			if r := fairFetch(fairURL(c.Base, key, aIDs[i], fairPartA), aIDs[i]); r.status != 200 || !r.bytesOK {
				t.Fatalf("retry of tenant A download %d: status %d", i, r.status)
			}
		}
	}
	logText, err := os.ReadFile(filepath.Join(c.Dir(), "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fairPartA, fairPartB} {
		if strings.Contains(string(logText), p) || strings.Contains(text, p) {
			t.Errorf("partition id %s in the log or the metrics", p)
		}
	}
}
