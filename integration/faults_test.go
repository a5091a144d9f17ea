package integration

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
)

// faultTimeout is the store_timeout the fault tests configure.
const faultTimeout = 500 * time.Millisecond

// faultBound is how long a faulted request may take at most: the store
// timeout plus room for a loaded 2-core machine.
// Without the timeout a hung store would hold a request indefinitely, so
// generous slack keeps the bound meaningful without timing the machine.
const faultBound = faultTimeout + 4*time.Second

const faultSQLiteSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite STORE_PATH
		store_timeout 500ms
		grace 0
		untokened reject
		cache {
			max_bytes 0
			record_ttl 0
		}
	}
	respond "not the segment handler" 418
}
`

// timedGet is one GET and how long it took.
func timedGet(t testing.TB, url string) (response, time.Duration) {
	t.Helper()
	start := time.Now()
	r := do(t, "GET", url, nil)
	return r, time.Since(start)
}

// recoverWithin polls url until it serves the segment id, and returns how
// long that took; it fails the test after limit.
func recoverWithin(t *testing.T, url, id string, limit time.Duration) time.Duration {
	t.Helper()
	d := waitFor(limit, func() bool {
		r, err := try("GET", url, nil)
		if err != nil || r.Status != 200 {
			return false
		}
		sum := sha256.Sum256(r.Body)
		return "sha256:"+hex.EncodeToString(sum[:]) == id
	})
	if d < 0 {
		r, _ := try("GET", url, nil)
		t.Fatalf("service did not resume within %s: last answer %d %s", limit, r.Status, r.Body)
	}
	return d
}

// TestFaultsSQLite: a missing, truncated, table-less or writer-locked
// SQLite file yields a JSON 503/504 with Retry-After within the store
// timeout, never a wrong success, and service resumes by itself once the
// file is right again. 1,000 failed requests leak no fds or goroutines.
func TestFaultsSQLite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sync.db")
	// Rollback journal: the mode in which a writer's lock blocks readers.
	ids := seedStore(t, path, "delete", pseudoRandom(256<<10, 1))
	id := ids[0]
	backup := filepath.Join(dir, "backup.db")
	copyFile(t, path, backup)

	key := randKey(t)
	c := startCaddy(t, strings.Replace(faultSQLiteSite, "STORE_PATH", path, 1), "SEG_KEY="+key)
	url := signURL(c.Base, key, id, 15*time.Minute)
	checkSegment(t, do(t, "GET", url, nil), id)

	fault := func(name string, inject, clear func(), allowed ...int) {
		t.Run(name, func(t *testing.T) {
			inject()
			r, took := timedGet(t, url)
			if r.Status == 200 {
				// Only the right bytes may ever be served.
				checkSegment(t, r, id)
				t.Logf("%s: answered 200 with the right bytes (SQLite still had the pages)", name)
			} else {
				code := faultAnswer(t, r, allowed...)
				if took > faultBound {
					t.Errorf("%s: answer took %s, bound %s", name, took, faultBound)
				}
				t.Logf("%s: %d %s in %s", name, r.Status, code, took.Round(time.Millisecond))
			}
			clear()
			rec := recoverWithin(t, url, id, 10*time.Second)
			t.Logf("%s: recovered %s after the fault cleared", name, rec.Round(time.Millisecond))
		})
	}

	fault("missing", func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}, func() { restoreOver(t, backup, path) }, 503)

	fault("truncated in place", func() {
		if err := os.Truncate(path, 4096); err != nil {
			t.Fatal(err)
		}
	}, func() { restoreOver(t, backup, path) }, 503)

	trunc := filepath.Join(dir, "trunc.db")
	copyFile(t, backup, trunc)
	if err := os.Truncate(trunc, 3*4096); err != nil {
		t.Fatal(err)
	}
	fault("truncated copy restored over it", func() { restoreOver(t, trunc, path) },
		func() { restoreOver(t, backup, path) }, 503)

	fault("tables renamed away", func() {
		w, err := seed.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := w.Exec("ALTER TABLE sync_segments RENAME TO sync_segments_gone"); err != nil {
			t.Fatal(err)
		}
	}, func() {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec("ALTER TABLE sync_segments_gone RENAME TO sync_segments"); err != nil {
			t.Fatal(err)
		}
	}, 503)

	empty := filepath.Join(dir, "empty.db")
	func() {
		db, err := sql.Open("sqlite", "file:"+empty)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec("CREATE TABLE unrelated(x)"); err != nil {
			t.Fatal(err)
		}
	}()
	fault("file without the tables restored over it", func() { restoreOver(t, empty, path) },
		func() { restoreOver(t, backup, path) }, 503)

	// A writer holding an EXCLUSIVE lock longer than the store timeout.
	var (
		lockDB   *sql.DB
		lockConn *sql.Conn
	)
	fault("locked by a writer", func() {
		var err error
		lockDB, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
		if err != nil {
			t.Fatal(err)
		}
		lockConn, err = lockDB.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lockConn.ExecContext(context.Background(), "BEGIN EXCLUSIVE"); err != nil {
			t.Fatal(err)
		}
		if _, err := lockConn.ExecContext(context.Background(), "UPDATE sync_segments SET row_count = row_count"); err != nil {
			t.Fatal(err)
		}
	}, func() {
		lockConn.ExecContext(context.Background(), "ROLLBACK")
		lockConn.Close()
		lockDB.Close()
	}, 503, 504)

	// 1,000 failed requests (file missing): no fd or goroutine growth.
	t.Run("1000 failed requests", func(t *testing.T) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		warm := hammer(100, 8, 30*time.Second, func(int) string { return url })
		base := c.resources(t)
		tally := hammer(1000, 8, 60*time.Second, func(int) string { return url })
		if tally[503] != 1000 {
			t.Errorf("answers %v, want 1000 × 503 (warm-up %v)", tally, warm)
		}
		after := c.settleTo(t, base, 4, 5)
		t.Logf("sqlite missing file: before %s, after 1,000 × 503 %s", base, after)
		if after.FDs > base.FDs+4 || after.Goroutines > base.Goroutines+5 {
			t.Errorf("leak: before %s, after %s", base, after)
		}
		restoreOver(t, backup, path)
		recoverWithin(t, url, id, 10*time.Second)
	})
	if strings.Contains(c.Output(), "panic") {
		t.Errorf("caddy output mentions a panic:\n%s", c.Output())
	}
	if b, _ := os.ReadFile(filepath.Join(c.Dir(), "server.log")); strings.Contains(string(b), "panic") {
		t.Errorf("server log mentions a panic")
	}
}

const faultS3Site = siteGlobals + `http://127.0.0.1:{{PORT}} {
	syncular_segments /direct/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store s3 {
			bucket segs
			region us-east-1
			endpoint REAL_ENDPOINT
			access_key_id {env.S3_KEY}
			secret_access_key {env.S3_SECRET}
		}
		delivery proxy
		store_timeout 500ms
		grace 0
		untokened reject
		cache {
			max_bytes 0
			record_ttl 0
		}
	}
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store s3 {
			bucket segs
			region us-east-1
			endpoint FAKE_ENDPOINT
			access_key_id {env.S3_KEY}
			secret_access_key {env.S3_SECRET}
		}
		delivery proxy
		store_timeout 500ms
		grace 0
		untokened reject
		cache {
			max_bytes 0
			record_ttl 0
		}
	}
	respond "not the segment handler" 418
}
`

// s3Segment writes b to the bucket with a record granting hardDigest/p1.
func s3Segment(t testing.TB, srv *s3test.Server, b []byte) string {
	t.Helper()
	now := time.Now().UnixMilli()
	rec := map[string]any{
		"segmentId": s3test.SegmentID(b), "partition": "p1", "logEpoch": "e1", "table": "tasks",
		"schemaVersion": 1, "mediaType": "rows", "scopeDigest": hardDigest, "asOfCommitSeq": 1,
		"rowCount": 1, "rowCursor": nil, "nextRowCursor": nil, "byteLength": len(b),
		"createdAtMs": now, "expiresAtMs": now + 3600_000,
	}
	return s3test.PutSegment(t, srv.Client(), "segs", "", b, s3test.RecordHeader(rec))
}

// TestFaultsS3: an S3 endpoint that hangs, answers 500 or 403, speaks
// garbage, or is stopped mid-load yields a JSON 503/504 with Retry-After
// within the store timeout, and service resumes by itself when the
// endpoint is healthy again. 1,000 failed requests leak nothing.
func TestFaultsS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	small := pseudoRandom(64<<10, 2)
	big := pseudoRandom(4<<20, 3)
	id := s3Segment(t, srv, small)
	bigID := s3Segment(t, srv, big)
	fake := newFakeS3(t, srv.Endpoint)

	key := randKey(t)
	site := strings.NewReplacer("REAL_ENDPOINT", srv.Endpoint, "FAKE_ENDPOINT", fake.URL).Replace(faultS3Site)
	c := startCaddy(t, site, "SEG_KEY="+key, "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
	url := signURL(c.Base, key, id, 15*time.Minute)
	checkSegment(t, do(t, "GET", url, nil), id)

	for _, f := range []struct {
		mode    string
		allowed []int
	}{
		{"hang", []int{504}},
		{"500", []int{503}},
		{"403", []int{503}},
		{"garbage", []int{503}},
	} {
		t.Run(f.mode, func(t *testing.T) {
			fake.setMode(f.mode)
			r, took := timedGet(t, url)
			code := faultAnswer(t, r, f.allowed...)
			if took > faultBound {
				t.Errorf("answer took %s, bound %s", took, faultBound)
			}
			fake.setMode("proxy")
			rec := recoverWithin(t, url, id, 10*time.Second)
			t.Logf("s3 %s: %d %s in %s; recovered %s after the fault cleared", f.mode, r.Status, code,
				took.Round(time.Millisecond), rec.Round(time.Millisecond))
		})
	}

	t.Run("1000 failed requests", func(t *testing.T) {
		modes := []string{"403", "garbage", "500"}
		fake.setMode(modes[0])
		hammer(60, 8, 30*time.Second, func(int) string { return url })
		base := c.resources(t)
		total := map[int]int{}
		for _, m := range modes {
			fake.setMode(m)
			n := 334
			if m == "500" {
				n = 332
			}
			for k, v := range hammer(n, 8, 60*time.Second, func(int) string { return url }) {
				total[k] += v
			}
		}
		if total[503] != 1000 {
			t.Errorf("answers %v, want 1000 × 503", total)
		}
		after := c.settleTo(t, base, 10, 10)
		t.Logf("s3 403/garbage/500: before %s, after 1,000 × 503 %s", base, after)
		if after.FDs > base.FDs+10 || after.Goroutines > base.Goroutines+10 {
			t.Errorf("leak: before %s, after %s", base, after)
		}

		// Hung endpoint: 100 requests, 50 at a time, each cut at the
		// timeout (504) or, once the breaker is open, failed at once (503).
		fake.setMode("hang")
		start := time.Now()
		tally := hammer(100, 50, 30*time.Second, func(int) string { return url })
		took := time.Since(start)
		if tally[504]+tally[503] != 100 {
			t.Errorf("hung endpoint answers %v, want 100 × 504 or 503", tally)
		}
		fake.setMode("proxy")
		hang := c.settleTo(t, base, 10, 10)
		t.Logf("s3 hang: 100 × 504 in %s; before %s, after %s", took.Round(time.Millisecond), base, hang)
		if hang.Goroutines > base.Goroutines+10 {
			t.Errorf("goroutines after hung requests: before %s, after %s", base, hang)
		}
		recoverWithin(t, url, id, 10*time.Second)
	})

	t.Run("server stopped mid-load", func(t *testing.T) {
		bigURL := strings.Replace(signURL(c.Base, key, bigID, 15*time.Minute), "/segments/", "/direct/segments/", 1)
		checkSegment(t, do(t, "GET", bigURL, nil), bigID)
		var (
			stop                          atomic.Bool
			ok, faults, cut, wrong, other atomic.Int64
			wg                            sync.WaitGroup
			firstWrong                    atomic.Value
		)
		hc := &http.Client{Timeout: 20 * time.Second}
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 2000 && !stop.Load(); i++ {
					res, err := hc.Get(bigURL)
					if err != nil {
						cut.Add(1)
						time.Sleep(20 * time.Millisecond)
						continue
					}
					b, err := io.ReadAll(res.Body)
					res.Body.Close()
					switch {
					case err != nil || (res.StatusCode == 200 && len(b) != len(big)):
						cut.Add(1) // body cut when S3 died: the client sees a short read
					case res.StatusCode == 200:
						if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != bigID {
							wrong.Add(1)
						} else {
							ok.Add(1)
						}
					case res.StatusCode == 503 || res.StatusCode == 504:
						if res.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"edge.store_`) {
							wrong.Add(1)
							firstWrong.CompareAndSwap(nil, string(b))
						}
						faults.Add(1)
						time.Sleep(20 * time.Millisecond)
					default:
						other.Add(1)
						firstWrong.CompareAndSwap(nil, res.Status+" "+string(b))
					}
				}
			}()
		}
		time.Sleep(700 * time.Millisecond)
		okBefore := ok.Load()
		srv.Stop()
		stoppedAt := time.Now()
		// While it is down every answer is a fault, within the bound.
		r, took := timedGet(t, bigURL)
		faultAnswer(t, r, 503, 504)
		if took > faultBound {
			t.Errorf("answer while S3 is down took %s", took)
		}
		time.Sleep(time.Second)
		faultsDown := faults.Load()
		srv.Restart()
		restarted := time.Now()
		rec := recoverWithin(t, bigURL, bigID, 10*time.Second)
		time.Sleep(300 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		t.Logf("s3 stopped mid-load: %d ok before the stop, %d ok in all, %d fault answers (%d while down, %s), %d bodies cut by the stop, %d wrong, %d other; down answer %d in %s; recovered %s after restart",
			okBefore, ok.Load(), faults.Load(), faultsDown, restarted.Sub(stoppedAt).Round(time.Millisecond),
			cut.Load(), wrong.Load(), other.Load(), r.Status, took.Round(time.Millisecond), rec.Round(time.Millisecond))
		if wrong.Load() != 0 || other.Load() != 0 {
			t.Errorf("wrong answers under the fault: %d wrong, %d other (first: %v)", wrong.Load(), other.Load(), firstWrong.Load())
		}
		if faultsDown == 0 {
			t.Errorf("no fault answers while S3 was down")
		}
		if cut.Load() > 8 {
			t.Errorf("%d bodies cut: more than the ones in flight at the stop", cut.Load())
		}
	})
}
