package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// outageSite serves an S3 bucket (proxy: the edge streams the bytes) with a
// short record_ttl so records go stale at once, a grace period longer than
// any test, segments above 64 KiB on the disk tier, and a store timeout
// (outageTimeout) well above what a fast failure takes on a loaded
// machine. STORE is the store line or block.
const outageSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		STORE
		DELIVERY
		store_timeout 2s
		grace 10m
		untokened reject
		cache {
			record_ttl 200ms
			max_entry 64KiB
			disk {{DIR}}/segments
		}
	}
	respond "not the segment handler" 418
}
`

// outageTimeout is outageSite's store_timeout: an answer that took it
// waited on the store.
const outageTimeout = 2 * time.Second

func outageConfig(store, delivery string) string {
	return strings.NewReplacer("STORE", store, "DELIVERY", delivery).Replace(outageSite)
}

func s3OutageStore(srv *s3test.Server) string {
	return `store s3 {
			bucket segs
			region us-east-1
			endpoint ` + srv.Endpoint + `
			access_key_id {env.S3_KEY}
			secret_access_key {env.S3_SECRET}
		}`
}

// tally counts answers of one kind of segment during a storm.
type tally struct {
	ok, unavailable, timeout, wrong, cut atomic.Int64
	slowFast                             atomic.Int64 // 503s after the breaker opened that took >= store_timeout
	mu                                   sync.Mutex
	firstWrong                           string
}

func (t *tally) String() string {
	return fmt.Sprintf("%d × 200, %d × 503, %d × 504, %d wrong, %d cut", t.ok.Load(), t.unavailable.Load(), t.timeout.Load(), t.wrong.Load(), t.cut.Load())
}

// storm GETs urls round robin from workers until stop, checking each 200
// against its id, and tallies the answers in tallies[kind(i)].
type stormURL struct {
	url, id string
	kind    int
}

func storm(ctx context.Context, workers int, urls []stormURL, tallies []*tally, breakerOpen func() bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	var next atomic.Int64
	// The breaker's gauge, polled apart from the requests.
	var openNow atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			openNow.Store(breakerOpen())
			time.Sleep(50 * time.Millisecond)
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
			for ctx.Err() == nil {
				u := urls[int(next.Add(1))%len(urls)]
				tl := tallies[u.kind]
				open := openNow.Load()
				start := time.Now()
				res, err := hc.Get(u.url)
				if err != nil {
					tl.cut.Add(1)
					continue
				}
				b, err := io.ReadAll(res.Body)
				res.Body.Close()
				took := time.Since(start)
				switch {
				case err != nil:
					tl.cut.Add(1)
				case res.StatusCode == 200:
					sum := sha256.Sum256(b)
					if "sha256:"+hex.EncodeToString(sum[:]) != u.id {
						tl.wrong.Add(1)
					} else {
						tl.ok.Add(1)
					}
				case res.StatusCode == 503 && strings.Contains(string(b), `"edge.store_unavailable"`) && res.Header.Get("Retry-After") != "":
					tl.unavailable.Add(1)
					if open && took >= outageTimeout {
						tl.slowFast.Add(1)
					}
				case res.StatusCode == 504 && strings.Contains(string(b), `"edge.store_timeout"`):
					tl.timeout.Add(1)
				default:
					tl.wrong.Add(1)
					tl.mu.Lock()
					if tl.firstWrong == "" {
						tl.firstWrong = fmt.Sprintf("%d %s", res.StatusCode, b)
					}
					tl.mu.Unlock()
				}
			}
		}()
	}
	return &wg
}

// breakerGauge reads caddy_syncular_store_breaker_open from the admin
// endpoint without failing the test (it runs in storm goroutines too).
func breakerGauge(c *caddyProc) func() bool {
	return func() bool {
		r, err := try("GET", fmt.Sprintf("http://127.0.0.1:%d/metrics", c.AdminPort), nil)
		if err != nil {
			return false
		}
		for _, line := range strings.Split(string(r.Body), "\n") {
			if strings.HasPrefix(line, "caddy_syncular_store_breaker_open ") {
				return strings.TrimSpace(strings.TrimPrefix(line, "caddy_syncular_store_breaker_open ")) != "0"
			}
		}
		return false
	}
}

// TestOutageS3Grace: versitygw frozen (SIGSTOP) and killed (SIGKILL), each
// mid-storm. Segments the edge holds (memory and disk tier, records read
// before the outage) keep answering 200 with the right bytes within grace;
// segments it never read answer 503 edge.store_unavailable (504 while the
// first calls still wait on the store), and fast once the breaker is open;
// after the store is back every segment serves again.
func TestOutageS3Grace(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	var held []string
	cold := map[string][]string{} // per outage: never read before it
	for i := range 4 {
		size := 16 << 10
		if i == 0 {
			size = 512 << 10 // above max_entry: the disk tier
		}
		held = append(held, s3Segment(t, srv, pseudoRandom(size, byte(10+i))))
		cold["SIGSTOP"] = append(cold["SIGSTOP"], s3Segment(t, srv, pseudoRandom(16<<10, byte(20+i))))
		cold["SIGKILL"] = append(cold["SIGKILL"], s3Segment(t, srv, pseudoRandom(16<<10, byte(30+i))))
	}
	key := randKey(t)
	c := startCaddy(t, outageConfig(s3OutageStore(srv), "delivery proxy"),
		"SEG_KEY="+key, "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
	for _, id := range held {
		checkSegment(t, do(t, "GET", signURL(c.Base, key, id, time.Hour), nil), id)
	}
	var heldURLs []stormURL
	for _, id := range held {
		heldURLs = append(heldURLs, stormURL{signURL(c.Base, key, id, time.Hour), id, 0})
	}
	open := breakerGauge(c)

	for _, how := range []string{"SIGSTOP", "SIGKILL"} {
		t.Run(how, func(t *testing.T) {
			var coldURLs []stormURL
			for _, id := range cold[how] {
				coldURLs = append(coldURLs, stormURL{signURL(c.Base, key, id, time.Hour), id, 1})
			}
			urls := append(append([]stormURL(nil), heldURLs...), coldURLs...)
			tallies := []*tally{{}, {}}
			ctx, cancel := context.WithCancel(context.Background())
			wg := storm(ctx, 6, heldURLs, tallies, open)
			time.Sleep(300 * time.Millisecond)
			okBefore := tallies[0].ok.Load()
			if how == "SIGSTOP" {
				if err := srv.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
			} else {
				srv.Kill()
			}
			downAt := time.Now()
			// Segments it never read join the storm once the store is down.
			wgCold := storm(ctx, 4, coldURLs, tallies, open)
			if d := waitFor(15*time.Second, open); d < 0 {
				cancel()
				wg.Wait()
				wgCold.Wait()
				t.Fatalf("breaker never opened: held %s, cold %s", tallies[0], tallies[1])
			}
			openAfter := time.Since(downAt)
			// The outage lasts 2 s past the breaker's opening.
			time.Sleep(2 * time.Second)
			// A cold segment now: 503 without waiting on the store.
			r, took := timedGet(t, urls[len(urls)-1].url)
			faultAnswer(t, r, 503)
			if took >= outageTimeout {
				t.Errorf("cold segment with the breaker open took %v (store_timeout %v)", took, outageTimeout)
			}
			heldDown, coldDown := tallies[0].String(), tallies[1].String()
			if how == "SIGSTOP" {
				if err := srv.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			} else {
				srv.Restart()
			}
			upAt := time.Now()
			for _, u := range urls {
				recoverWithin(t, u.url, u.id, 15*time.Second)
			}
			recovered := time.Since(upAt)
			cancel()
			wg.Wait()
			wgCold.Wait()
			t.Logf("%s: breaker open %s after the stop; during the outage held %s, cold %s; every segment served again %s after the store was back; %d held 200s before the stop",
				how, openAfter.Round(time.Millisecond), heldDown, coldDown, recovered.Round(time.Millisecond), okBefore)
			h, cl := tallies[0], tallies[1]
			if h.wrong.Load()+cl.wrong.Load() != 0 {
				t.Errorf("wrong answers: held %s (%s), cold %s (%s)", h, h.firstWrong, cl, cl.firstWrong)
			}
			if h.unavailable.Load()+h.timeout.Load()+h.cut.Load() != 0 {
				t.Errorf("held segments failed during the outage: %s", h)
			}
			if cl.unavailable.Load() == 0 {
				t.Errorf("cold segments never answered 503: %s", cl)
			}
			if n := cl.slowFast.Load(); n > 0 {
				t.Errorf("%d cold answers took a store timeout with the breaker open", n)
			}
		})
	}
	m := scrape(t, c)
	if m[`caddy_syncular_grace_requests_total{result="served",server="srv0"}`] == 0 {
		t.Errorf("no grace-served requests counted:\n%s", dumpSyncular(m))
	}
	if m["caddy_syncular_store_breaker_trips_total"] < 2 || m["caddy_syncular_store_breaker_open"] != 0 {
		t.Errorf("breaker metrics:\n%s", dumpSyncular(m))
	}
	log, _ := os.ReadFile(filepath.Join(c.Dir(), "server.log"))
	if n := strings.Count(string(log), "segment store unreadable"); n < 2 || n > 4 {
		t.Errorf("%d breaker warnings in the log for two outages", n)
	}
	if strings.Contains(string(log), "panic") {
		t.Error("server log mentions a panic")
	}
}

// TestOutageSQLiteGrace: the SQLite file moved away (the edge's stat of the
// path fails: as root, chmod cannot make a file unreadable), then a file
// of garbage in its place, each restored: held segments keep serving, a
// segment whose record was never read answers 503, and after the restore
// every segment serves again.
func TestOutageSQLiteGrace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sync.db")
	ids := seedStore(t, path, "wal", pseudoRandom(32<<10, 31), pseudoRandom(256<<10, 32),
		pseudoRandom(32<<10, 33), pseudoRandom(32<<10, 34))
	heldIDs := ids[:2]
	key := randKey(t)
	c := startCaddy(t, outageConfig("store sqlite "+path, ""), "SEG_KEY="+key)
	for _, id := range heldIDs {
		checkSegment(t, do(t, "GET", signURL(c.Base, key, id, time.Hour), nil), id)
	}
	away := filepath.Join(dir, "moved-away.db")
	for _, fault := range []struct {
		name           string
		coldID         string // never read before the fault
		inject, repair func()
	}{
		{"moved away", ids[2], func() {
			if err := os.Rename(path, away); err != nil {
				t.Fatal(err)
			}
		}, func() {
			if err := os.Rename(away, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"garbage in its place", ids[3], func() {
			if err := os.Rename(path, away); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, bytes.Repeat([]byte("not a database "), 4096), 0o644); err != nil {
				t.Fatal(err)
			}
		}, func() {
			if err := os.Rename(away, path); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(fault.name, func(t *testing.T) {
			fault.inject()
			time.Sleep(300 * time.Millisecond) // records past record_ttl
			for range 5 {
				for _, id := range heldIDs {
					checkSegment(t, do(t, "GET", signURL(c.Base, key, id, time.Hour), nil), id)
				}
				faultAnswer(t, do(t, "GET", signURL(c.Base, key, fault.coldID, time.Hour), nil), 503)
			}
			fault.repair()
			for _, id := range append([]string{fault.coldID}, heldIDs...) {
				recoverWithin(t, signURL(c.Base, key, id, time.Hour), id, 15*time.Second)
			}
		})
	}
	m := scrape(t, c)
	if got := m[`caddy_syncular_grace_requests_total{result="served",server="srv0"}`]; got < 20 {
		t.Errorf("grace served %v requests, want 20:\n%s", got, dumpSyncular(m))
	}
}

// TestCorruptObjectBacksOff: an S3 object whose bytes do not hash to its id
// (small: memory tier; large: disk tier) requested 20 times in a row is
// read from the store once (GETs of the object in versitygw's access log),
// every answer a store fault (or the first one cut), with the warning in
// the log.
func TestCorruptObjectBacksOff(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	key := randKey(t)
	c := startCaddy(t, outageConfig(s3OutageStore(srv), "delivery proxy"),
		"SEG_KEY="+key, "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
	for _, size := range []int{16 << 10, 1 << 20} {
		t.Run(fmt.Sprint(size>>10, " KiB"), func(t *testing.T) {
			good := pseudoRandom(size, byte(size>>10))
			id := s3Segment(t, srv, good)
			bad := bytes.Clone(good)
			bad[size-3] ^= 0xff
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			in := &s3.PutObjectInput{
				Bucket: aws.String("segs"), Key: aws.String(s3test.ObjectKey("", id)),
				Body: bytes.NewReader(bad), ContentLength: aws.Int64(int64(size)),
			}
			if rec := headRecord(t, srv, id); rec != "" {
				in.Metadata = map[string]string{"syncular-record": rec}
			}
			if _, err := srv.Client().PutObject(ctx, in); err != nil {
				t.Fatal(err)
			}
			url := signURL(c.Base, key, id, time.Hour)
			for i := range 20 {
				aborted := neverComplete(t, url, size)
				if aborted && i > 0 {
					t.Fatalf("request %d streamed the corrupt bytes again", i+1)
				}
			}
			time.Sleep(300 * time.Millisecond) // access log lines land
			if gets := srv.CountRequests(t, "s3_GetObject", s3test.ObjectKey("", id)); gets != 1 {
				t.Fatalf("20 requests for a corrupt object made %d GETs of it, want 1", gets)
			}
		})
	}
	log, _ := os.ReadFile(filepath.Join(c.Dir(), "server.log"))
	if !strings.Contains(string(log), "do not match their id") && !strings.Contains(string(log), "fill failed") {
		t.Fatalf("no warning about the corrupt bytes in the log:\n%s", log)
	}
	m := scrape(t, c)
	if m["caddy_syncular_store_corrupt_backoffs_total"] < 38 {
		t.Errorf("backoff answers not counted:\n%s", dumpSyncular(m))
	}
}

// TestRefusedTokenStoreReads: 100 sequential requests with one valid-MAC
// token that the record refuses (another scope digest: 403) cost at most 5
// record reads (HEADs of the object in versitygw's access log), and so do
// 100 with a token for a segment the store does not have (404).
func TestRefusedTokenStoreReads(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	id := s3Segment(t, srv, pseudoRandom(8<<10, 41))
	missing := s3test.SegmentID(pseudoRandom(8<<10, 42))
	key := randKey(t)
	// record_ttl 2s (the default): the refusal window is then 1 s.
	c := startCaddy(t, strings.Replace(outageConfig(s3OutageStore(srv), "delivery proxy"), "record_ttl 200ms", "record_ttl 2s", 1),
		"SEG_KEY="+key, "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
	otherDigest := token.ScopeDigest(map[string][]string{"user_id": {"someone else"}})
	for _, tc := range []struct {
		name, id, digest string
		status           int
		code             string
	}{
		{"forbidden", id, otherDigest, 403, "sync.forbidden"},
		{"not found", missing, hardDigest, 404, "sync.not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := token.Sign([]byte(key), tc.id, tc.digest, hardAud, time.Now().Add(time.Hour).Unix())
			url := c.Base + "/segments/" + tc.id + "?st=" + tok
			start := time.Now()
			for range 100 {
				checkError(t, do(t, "GET", url, nil), tc.status, tc.code)
			}
			took := time.Since(start)
			time.Sleep(300 * time.Millisecond)
			heads := srv.CountRequests(t, "s3_HeadObject", s3test.ObjectKey("", tc.id))
			t.Logf("%s: 100 refused requests in %s: %d record reads (%d S3 requests in all)", tc.name,
				took.Round(time.Millisecond), heads, srv.CountRequests(t, "", ""))
			if heads < 1 || heads > 5 {
				t.Fatalf("100 refused requests made %d record reads, want 1 to 5", heads)
			}
		})
	}
}
