package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// Helpers shared by the fault, abuse and reload tests: process
// resource counts, a seeded store, tokens, bounded load.

// hardDigest is the scope digest every hardening segment is published under.
var hardDigest = token.ScopeDigest(map[string][]string{"user_id": {"hardening"}})

// hardAud is the audience of partition p1 under "audience template aud:{partition}".
const hardAud = "aud:p1"

func randKey(t testing.TB) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// hardPub is a publication of partition p1 valid for an hour.
func hardPub() store.Publication {
	now := time.Now().UnixMilli()
	return store.Publication{Partition: "p1", LogEpoch: "e1", Table: "tasks", SchemaVersion: 1,
		ScopeDigest: hardDigest, AsOfCommitSeq: 1, CreatedAtMs: now, ExpiresAtMs: now + 3600_000}
}

// seedStore writes a gen-3 store holding the given segments; journal is
// "wal" (as the sync server runs) or "delete" (rollback journal, where a
// writer's EXCLUSIVE lock blocks readers). It returns the ids.
func seedStore(t testing.TB, path, journal string, segs ...[]byte) []string {
	t.Helper()
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var ids []string
	for _, b := range segs {
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: hardPub()})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if journal == "delete" {
		if err := w.Exec("PRAGMA journal_mode=DELETE"); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// seedOne writes a fresh gen-3 store holding one segment published for
// partition under digest, live for an hour; it returns the file and id.
func seedOne(t testing.TB, partition, digest string, body []byte) (path, id string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	nowMs := time.Now().UnixMilli()
	id, err = w.Put(seed.SegmentInput{Bytes: body, Publication: store.Publication{
		Partition: partition, LogEpoch: "e1", Table: "tasks", SchemaVersion: 1, MediaType: "rows",
		ScopeDigest: digest, RowCount: 1, CreatedAtMs: nowMs, ExpiresAtMs: nowMs + 3600_000,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return path, id
}

// signURL is a signed download URL for id under key, valid ttl.
func signURL(base, key, id string, ttl time.Duration) string {
	tok := token.Sign([]byte(key), id, hardDigest, hardAud, time.Now().Add(ttl).Unix())
	return base + "/segments/" + id + "?st=" + tok
}

// pseudoRandom is n deterministic-but-varied bytes (distinct per seed).
func pseudoRandom(n int, seedByte byte) []byte {
	b := make([]byte, n)
	x := uint32(seedByte)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// pid is the Caddy process id.
func (c *caddyProc) pid() int { return c.cmd.Process.Pid }

// fdCount is the number of open file descriptors of the Caddy process.
func (c *caddyProc) fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", c.pid()))
	if err != nil {
		t.Fatalf("counting fds: %v", err)
	}
	return len(ents)
}

// rssKB is the resident set size of the Caddy process in KiB.
func (c *caddyProc) rssKB(t testing.TB) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.pid()))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

var goroutineTotal = regexp.MustCompile(`goroutine profile: total (\d+)`)

// goroutines reads the process's goroutine count from the admin
// endpoint's pprof handler.
func (c *caddyProc) goroutines(t testing.TB) int {
	t.Helper()
	res, err := adminClient.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", c.AdminPort))
	if err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	m := goroutineTotal.FindSubmatch(b)
	if m == nil {
		t.Fatalf("goroutine profile: %d %.200s", res.StatusCode, b)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

var adminClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// resources is a snapshot of the process's fds and goroutines.
type resources struct{ FDs, Goroutines int }

func (r resources) String() string { return fmt.Sprintf("%d fds, %d goroutines", r.FDs, r.Goroutines) }

func (c *caddyProc) resources(t testing.TB) resources {
	return resources{c.fdCount(t), c.goroutines(t)}
}

// settleTo waits (up to 15 s) for the process to come back within slack
// of base, and returns the last snapshot.
func (c *caddyProc) settleTo(t testing.TB, base resources, fdSlack, grSlack int) resources {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := c.resources(t)
		if r.FDs <= base.FDs+fdSlack && r.Goroutines <= base.Goroutines+grSlack || time.Now().After(deadline) {
			return r
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// hammer sends n GETs of url from workers goroutines (keep-alive clients
// of their own) and tallies status codes; transport errors count as -1.
// It gives up after limit.
func hammer(n, workers int, limit time.Duration, url func(i int) string) map[int]int {
	var (
		mu    sync.Mutex
		tally = map[int]int{}
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				code := -1
				req, _ := http.NewRequestWithContext(ctx, "GET", url(i), nil)
				if res, err := hc.Do(req); err == nil {
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					code = res.StatusCode
				}
				mu.Lock()
				tally[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return tally
}

// faultAnswer checks a store-fault answer: 503 or 504 (as allowed),
// JSON with the catalog fields, Retry-After, no-store, and nothing cached.
func faultAnswer(t testing.TB, r response, allowed ...int) string {
	t.Helper()
	ok := false
	for _, s := range allowed {
		ok = ok || r.Status == s
	}
	if !ok {
		t.Fatalf("status %d, want one of %v: %s", r.Status, allowed, r.Body)
	}
	var e errJSON
	if err := json.Unmarshal(r.Body, &e); err != nil || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("fault body is not JSON: %s", r.Body)
	}
	want := map[int]string{503: "edge.store_unavailable", 504: "edge.store_timeout"}[r.Status]
	if e.Code != want || e.Category != "internal" || e.Retryable == nil || !*e.Retryable || e.RecommendedAction != "retryLater" {
		t.Fatalf("fault body %+v", e)
	}
	if r.Header.Get("Retry-After") == "" || r.Header.Get("Cache-Control") != "no-store" || r.Header.Get("ETag") != "" {
		t.Fatalf("fault headers %v", r.Header)
	}
	return e.Code
}

// waitFor polls f every 20 ms until it returns true or limit passes, and
// returns how long it took (or -1).
func waitFor(limit time.Duration, f func() bool) time.Duration {
	start := time.Now()
	for time.Since(start) < limit {
		if f() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1
}

// copyFile copies src to dst (a new inode).
func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// restoreOver replaces path by a copy of backup the way an operator
// restores a backup: remove -wal/-shm, then rename a copy over the path.
func restoreOver(t testing.TB, backup, path string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".restore-"+filepath.Base(path))
	copyFile(t, backup, tmp)
	os.Remove(path + "-wal")
	os.Remove(path + "-shm")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// fakeS3 stands where the S3 endpoint is: by mode it forwards to a real
// server, hangs without answering, answers 500 or 403 with S3 XML, or
// writes bytes that are not HTTP.
type fakeS3 struct {
	URL     string
	mode    atomic.Value // string
	hits    atomic.Int64
	release chan struct{}
	mu      sync.Mutex
}

func newFakeS3(t testing.TB, real string) *fakeS3 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeS3{URL: "http://" + l.Addr().String(), release: make(chan struct{})}
	f.mode.Store("proxy")
	target := strings.TrimPrefix(real, "http://")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		switch f.mode.Load().(string) {
		case "hang":
			f.mu.Lock()
			rel := f.release
			f.mu.Unlock()
			select {
			case <-r.Context().Done():
			case <-rel:
			}
			return
		case "500":
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(500)
			io.WriteString(w, `<?xml version="1.0"?><Error><Code>InternalError</Code><Message>boom</Message></Error>`)
			return
		case "403":
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(403)
			io.WriteString(w, `<?xml version="1.0"?><Error><Code>AccessDenied</Code><Message>no</Message></Error>`)
			return
		case "garbage":
			hj, ok := w.(http.Hijacker)
			if !ok {
				return
			}
			conn, buf, err := hj.Hijack()
			if err != nil {
				return
			}
			buf.WriteString("\x00\x01SSH-2.0-not-http\r\n\r\n\xff\xfe garbage")
			buf.Flush()
			conn.Close()
			return
		}
		// proxy: forward the signed request unchanged (Host included).
		res := forwardHead(w, r, "http://"+target, r.Body)
		if res == nil {
			return
		}
		defer res.Body.Close()
		io.Copy(w, res.Body)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { f.setMode("proxy"); srv.Close() })
	return f
}

// setMode switches behaviour; leaving "hang" releases the hung requests.
func (f *fakeS3) setMode(m string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mode.Load().(string) == "hang" && m != "hang" {
		close(f.release)
		f.release = make(chan struct{})
	}
	f.mode.Store(m)
}

// forwardHead sends r unchanged (its headers and Host) to base plus its
// request URI, with body, and writes the answer's status line and headers
// to w. The caller copies the answer's body and closes it; on a transport
// failure forwardHead has answered 502 itself and returns nil.
func forwardHead(w http.ResponseWriter, r *http.Request, base string, body io.Reader) *http.Response {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.RequestURI(), body)
	if err != nil {
		w.WriteHeader(502)
		return nil
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host
	res, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		w.WriteHeader(502)
		return nil
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	return res
}
