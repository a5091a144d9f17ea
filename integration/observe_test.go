package integration

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// Seeing a storm: every cache outcome (a cold fill, its concurrent
// followers, a memory hit, a disk fill and followers, a disk hit, a
// stream with the disk tier off, a redirect, a HEAD) is reported the same
// in {http.syncular.cache} (through log_append in the access log) and in
// the Cache-Status header; a refusal carries neither. The fill and
// in-flight gauges rise while fills are held and while readers stall,
// and return to 0; store_read_bytes_total is the bytes versitygw sent for
// segment objects, by its own access log.

const observeSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log {
		output file {{DIR}}/server.log
	}
}

http://127.0.0.1:{{PORT}} {
	log {
		output file {{DIR}}/access.log
		format filter {
			fields {
				request>uri query {
					delete st
				}
			}
		}
	}
	log_append cache {http.syncular.cache}
	log_append tenant {http.syncular.tenant}
	syncular_segments /proxy/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		STORE
		delivery proxy
		untokened reject
		cache_status on
		cache {
			max_entry 256KiB
			disk {{DIR}}/disk
		}
	}
	syncular_segments /stream/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		STORE
		delivery proxy
		untokened reject
		cache_status on edge-test
		cache {
			max_entry 256KiB
			disk off
		}
	}
	syncular_segments /redirect/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		STORE
		delivery redirect
		untokened reject
		cache_status on
	}
	respond 404
}
`

// gateS3 forwards to versitygw; a GET of an armed segment object sends
// its headers and the first half of the body, then waits for release.
type gateS3 struct {
	URL     string
	mu      sync.Mutex
	armed   string        // object key held, "" none
	release chan struct{} // closed to let it through
	hit     chan struct{} // receives when an armed GET arrives
	// segmentBytes counts the body bytes of GETs of segment objects
	// ({prefix}seg/...) that went through with a 2xx.
	segmentBytes atomic.Int64
}

func newGateS3(t *testing.T, real string) *gateS3 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gateS3{URL: "http://" + l.Addr().String(), hit: make(chan struct{}, 16)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res := forwardHead(w, r, real, nil)
		if res == nil {
			return
		}
		defer res.Body.Close()
		var body io.Reader = res.Body
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/seg/") && res.StatusCode/100 == 2 {
			body = &countReader{r: res.Body, n: &g.segmentBytes}
		}
		g.mu.Lock()
		armed, rel := g.armed, g.release
		g.mu.Unlock()
		if r.Method == http.MethodGet && armed != "" && strings.HasSuffix(r.URL.Path, "/"+armed) && res.ContentLength > 1 {
			io.CopyN(w, body, res.ContentLength/2)
			w.(http.Flusher).Flush()
			g.hit <- struct{}{}
			select {
			case <-rel:
			case <-r.Context().Done():
				return
			}
		}
		io.Copy(w, body)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { g.open(); srv.Close() })
	return g
}

type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// hold arms the gate for object key.
func (g *gateS3) hold(key string) {
	g.mu.Lock()
	g.armed, g.release = key, make(chan struct{})
	g.mu.Unlock()
}

// open disarms the gate and lets held GETs finish.
func (g *gateS3) open() {
	g.mu.Lock()
	if g.release != nil {
		close(g.release)
		g.release = nil
	}
	g.armed = ""
	g.mu.Unlock()
}

// obsSegment puts b as the current reference writers do (the bytes
// without metadata, the record in its own object), so redirect delivery
// redirects it.
func obsSegment(t *testing.T, srv *s3test.Server, b []byte) string {
	t.Helper()
	now := time.Now().UnixMilli()
	id := s3test.PutSegment(t, srv.Client(), "segs", "", b, "")
	s3test.PutRecordObject(t, srv.Client(), "segs", "", id, map[string]any{
		"segmentId": id, "partition": "p1", "logEpoch": "e1", "table": "tasks",
		"schemaVersion": 1, "mediaType": "rows", "scopeDigest": hardDigest, "asOfCommitSeq": 1,
		"rowCount": 1, "rowCursor": nil, "nextRowCursor": nil, "byteLength": len(b),
		"createdAtMs": now, "expiresAtMs": now + 3600_000,
	})
	return id
}

// obsAnswer is what one request got.
type obsAnswer struct {
	status      int
	cacheStatus []string
	id          string
	n           int64
	err         error
}

func obsGet(method, url string, hdr map[string]string) obsAnswer {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return obsAnswer{err: err}
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		return obsAnswer{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return obsAnswer{status: res.StatusCode, cacheStatus: res.Header.Values("Cache-Status"),
		id: s3test.SegmentID(b), n: int64(len(b)), err: err}
}

// accessEntry is one access log line's fields this test reads.
type accessEntry struct {
	Request struct {
		Method string `json:"method"`
		URI    string `json:"uri"`
	} `json:"request"`
	Status      int                 `json:"status"`
	Size        int64               `json:"size"`
	Cache       *string             `json:"cache"`
	Tenant      string              `json:"tenant"`
	RespHeaders map[string][]string `json:"resp_headers"`
}

func readAccess(t *testing.T, path string) []accessEntry {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []accessEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e accessEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("access log line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

func TestObserveCacheOutcomes(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	small := pseudoRandom(64<<10, 51)
	large := pseudoRandom(16<<20, 52)
	sid, lid := obsSegment(t, srv, small), obsSegment(t, srv, large)
	gate := newGateS3(t, srv.Endpoint)
	key := newKey32(t)
	store := `store s3 {
			bucket segs
			region us-east-1
			endpoint ` + gate.URL + `
			access_key_id {env.S3_KEY}
			secret_access_key {env.S3_SECRET}
		}`
	c := startCaddy(t, strings.ReplaceAll(observeSite, "STORE", store),
		"SEG_KEY=hex:"+hex.EncodeToString(key), "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
	sign := func(route, id, aud string) string {
		tok := token.Sign(key, id, hardDigest, aud, time.Now().Add(time.Hour).Unix())
		return c.Base + "/" + route + "/segments/" + id + "?st=" + tok
	}
	metric := func(name string) float64 { return scrape(t, c)[name] }
	const (
		proxyInFlight = `caddy_syncular_downloads_in_flight{delivery="proxy",server="srv0"}`
		memFills      = `caddy_syncular_fills_in_flight{tier="memory"}`
		memFollowers  = `caddy_syncular_fill_followers{tier="memory"}`
		diskFills     = `caddy_syncular_fills_in_flight{tier="disk"}`
		diskFollowers = `caddy_syncular_fill_followers{tier="disk"}`
	)

	// log lists each request sent, its cache outcome and Cache-Status;
	// the access log is checked against it.
	type sent struct {
		method, uri, cache, status string
	}
	var log []sent
	expect := func(method, url, cache, status string, a obsAnswer) {
		t.Helper()
		if a.err != nil {
			t.Fatalf("%s %s: %v", method, url, a.err)
		}
		if len(a.cacheStatus) != 1 || a.cacheStatus[0] != status {
			t.Errorf("%s %s: Cache-Status %q, want %q", method, cache, a.cacheStatus, status)
		}
		u := url[len(c.Base):]
		u = u[:strings.IndexByte(u, '?')]
		log = append(log, sent{method, u, cache, status})
	}

	phase := time.Now()
	lap := func(what string) {
		t.Logf("%s: %v", what, time.Since(phase).Round(time.Millisecond))
		phase = time.Now()
	}
	// storm runs n concurrent GETs of url while the gate holds the
	// object, checks the gauges while they are held, and returns the
	// answers.
	storm := func(url, objKey string, n int, fills, followers string) []obsAnswer {
		t.Helper()
		gate.hold(objKey)
		answers := make([]obsAnswer, n)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); answers[0] = obsGet("GET", url, nil) }()
		select {
		case <-gate.hit:
		case <-time.After(10 * time.Second):
			t.Fatal("the fill never reached the store")
		}
		for i := 1; i < n; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); answers[i] = obsGet("GET", url, nil) }()
		}
		var last map[string]float64
		if waitFor(10*time.Second, func() bool {
			last = scrape(t, c)
			return last[fills] == 1 && last[followers] == float64(n-1) && last[proxyInFlight] == float64(n)
		}) < 0 {
			gate.open()
			wg.Wait()
			t.Fatalf("gauges while the fill is held: %s=%v %s=%v %s=%v", fills, last[fills], followers, last[followers], proxyInFlight, last[proxyInFlight])
		}
		gate.open()
		wg.Wait()
		if waitFor(10*time.Second, func() bool {
			last = scrape(t, c)
			return last[fills] == 0 && last[followers] == 0 && last[proxyInFlight] == 0
		}) < 0 {
			t.Fatalf("gauges after the fill: %s=%v %s=%v %s=%v", fills, last[fills], followers, last[followers], proxyInFlight, last[proxyInFlight])
		}
		return answers
	}
	checkStorm := func(url, id string, size int64, answers []obsAnswer) {
		t.Helper()
		for i, a := range answers {
			if a.err != nil || a.status != 200 || a.id != id || a.n != size {
				t.Fatalf("storm answer %d: %d, %d bytes, %v", i, a.status, a.n, a.err)
			}
			if i == 0 {
				expect("GET", url, "fill", "caddy-syncular; fwd=uri-miss; stored", a)
			} else {
				expect("GET", url, "follower", "caddy-syncular; fwd=uri-miss; collapsed", a)
			}
		}
	}

	// 1. Memory: a cold fill and 3 followers while it is held, then a hit.
	smallURL := sign("proxy", sid, hardAud)
	checkStorm(smallURL, sid, int64(len(small)), storm(smallURL, s3test.ObjectKey("", sid), 4, memFills, memFollowers))
	expect("GET", smallURL, "memory", "caddy-syncular; hit; detail=memory", obsGet("GET", smallURL, nil))
	expect("HEAD", smallURL, "record", "caddy-syncular; hit; detail=record", obsGet("HEAD", smallURL, nil))
	expect("GET", smallURL, "record", "caddy-syncular; hit; detail=record",
		obsGet("GET", smallURL, map[string]string{"If-None-Match": `"` + sid + `"`}))

	lap("memory")
	// 2. Disk: a cold fill and 3 followers reading it as it lands, then a hit.
	largeURL := sign("proxy", lid, hardAud)
	checkStorm(largeURL, lid, int64(len(large)), storm(largeURL, s3test.ObjectKey("", lid), 4, diskFills, diskFollowers))
	expect("GET", largeURL, "disk", "caddy-syncular; hit; detail=disk", obsGet("GET", largeURL, nil))

	lap("disk")
	// 3. The disk tier off: the large segment streams, every time.
	streamURL := sign("stream", lid, hardAud)
	for range 2 {
		a := obsGet("GET", streamURL, nil)
		if a.status != 200 || a.id != lid {
			t.Fatalf("stream: %d %v", a.status, a.err)
		}
		expect("GET", streamURL, "stream", "edge-test; fwd=bypass", a)
	}

	// 4. A redirect (not followed: the client would read the bucket).
	redirURL := sign("redirect", sid, hardAud)
	a := obsGet("GET", redirURL, nil)
	if a.status != http.StatusFound {
		t.Fatalf("redirect: %d", a.status)
	}
	expect("GET", redirURL, "redirect", "caddy-syncular; fwd=bypass; detail=redirect", a)

	// 5. Refusals carry no Cache-Status and no cache outcome: another
	// tenant's token (the bytes are in memory), a forged token.
	for _, u := range []string{sign("proxy", sid, "aud:p2"), c.Base + "/proxy/segments/" + sid + "?st=forged"} {
		a := obsGet("GET", u, nil)
		if a.status != 403 || len(a.cacheStatus) != 0 {
			t.Fatalf("refusal: %d, Cache-Status %q", a.status, a.cacheStatus)
		}
	}

	lap("stream, redirect, refusals")
	// 6. A storm of stalled readers: each asks for the 16 MiB file and
	// reads nothing. The in-flight gauge counts them while they stall,
	// and returns to 0 when they go.
	const stalled = 8
	var conns []net.Conn
	for range stalled {
		conn, err := net.Dial("tcp", strings.TrimPrefix(c.Base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conn.(*net.TCPConn).SetReadBuffer(4096)
		u := largeURL[len(c.Base):]
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u, strings.TrimPrefix(c.Base, "http://"))
		conns = append(conns, conn)
	}
	if waitFor(10*time.Second, func() bool { return metric(proxyInFlight) == stalled }) < 0 {
		t.Fatalf("in_flight with %d stalled readers: %v", stalled, metric(proxyInFlight))
	}
	time.Sleep(300 * time.Millisecond)
	if v := metric(proxyInFlight); v != stalled {
		t.Fatalf("in_flight while %d readers stall: %v", stalled, v)
	}
	for _, conn := range conns {
		conn.Close()
	}
	if waitFor(10*time.Second, func() bool { return metric(proxyInFlight) == 0 }) < 0 {
		t.Fatalf("in_flight after the stalled readers left: %v", metric(proxyInFlight))
	}

	lap("stalled readers")
	// 7. The access log says what the headers said, request by request.
	var entries []accessEntry
	want := len(log) + 2 // the refusals
	waitFor(5*time.Second, func() bool {
		entries = readAccess(t, filepath.Join(c.Dir(), "access.log"))
		return len(entries) >= want
	})
	if raw, err := os.ReadFile(filepath.Join(c.Dir(), "access.log")); err == nil && len(entries) > 0 {
		t.Logf("access log: %d lines, %d bytes a line on average", len(entries), len(raw)/len(entries))
	}
	var granted []accessEntry
	tenant := ""
	for _, e := range entries {
		switch {
		case e.Status == 403:
			if e.Cache != nil && *e.Cache != "" {
				t.Errorf("refusal logged cache %q", *e.Cache)
			}
			if len(e.RespHeaders["Cache-Status"]) != 0 {
				t.Errorf("refusal logged Cache-Status %q", e.RespHeaders["Cache-Status"])
			}
		case e.Cache != nil && *e.Cache != "":
			granted = append(granted, e)
			if tenant == "" {
				tenant = e.Tenant
			}
			if len(e.Tenant) != 16 || strings.Trim(e.Tenant, "0123456789abcdef") != "" || e.Tenant != tenant {
				t.Errorf("tenant %q (first %q): want one 16-hex-digit value for partition p1", e.Tenant, tenant)
			}
		}
	}
	// The stalled readers' aborted answers may or may not be logged with
	// their fields; the requests of the list must all be.
	seen := map[string]int{}
	for _, e := range granted {
		k := e.Request.Method + " " + e.Request.URI + " " + *e.Cache
		if got := e.RespHeaders["Cache-Status"]; len(got) != 1 {
			t.Errorf("%s: logged Cache-Status %q", k, got)
		} else {
			k += " " + got[0]
		}
		seen[k]++
	}
	wantSeen := map[string]int{}
	for _, s := range log {
		wantSeen[s.method+" "+s.uri+" "+s.cache+" "+s.status]++
	}
	for k, n := range wantSeen {
		if seen[k] < n {
			t.Errorf("access log: %d of %q, want %d\nseen: %v", seen[k], k, n, seen)
		}
	}
	if strings.Contains(tenant, "p1") || tenant == "" {
		t.Errorf("tenant %q", tenant)
	}

	lap("access log")
	// 8. The store's egress: store_read_bytes_total is the body bytes
	// versitygw sent for the segment objects (records excluded), counted
	// on the wire by the gate in front of it, and the whole-object
	// GetObjects of them in versitygw's access log (which logs no byte
	// counts) times their sizes.
	size := map[string]int64{s3test.ObjectKey("", sid): int64(len(small)), s3test.ObjectKey("", lid): int64(len(large))}
	var logged int64
	for _, r := range srv.Requests(t) {
		if r.Operation == "s3_GetObject" && r.Status == 200 {
			logged += size[r.Key]
		}
	}
	wire := gate.segmentBytes.Load()
	got := metric(`caddy_syncular_store_read_bytes_total{backend="s3"}`)
	t.Logf("store_read_bytes_total %v; versitygw sent %d bytes of segment objects (gate), %d by its access log", got, wire, logged)
	if got != float64(wire) || wire != logged {
		t.Fatalf("store_read_bytes_total = %v, versitygw sent %d bytes of segment objects (gate), %d by its access log", got, wire, logged)
	}
	// One memory fill, one disk fill, two streams.
	if want := int64(len(small) + 3*len(large)); wire != want {
		t.Fatalf("versitygw sent %d, want %d (one read per fill, one per stream)", wire, want)
	}
}

const observeSQLiteSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /tiers/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite DBPATH
		untokened reject
		cache_status on
		cache {
			max_entry 256KiB
			disk {{DIR}}/disk
		}
	}
	syncular_segments /stream/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite DBPATH
		untokened reject
		cache_status on
		cache {
			max_entry 256KiB
			disk off
		}
	}
	respond 404
}
`

// With a SQLite store: a memory fill (a whole read), a disk fill (the
// store's one-transaction copy) and a stream are each counted once in
// store_read_bytes_total{backend="sqlite"}, hits not at all; a
// compressed variant held in memory reports a memory hit, and the bytes
// served from a cache are counted in bytes_served_by_cache_total, and
// those of a fill or a stream are not.
func TestObserveStoreBytesSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sync.db")
	small := bytes.Repeat([]byte("compressible rows of a segment "), 2048) // 62 KiB
	large := pseudoRandom(3<<20, 71)
	ids := seedStore(t, path, "wal", small, large)
	key := newKey32(t)
	c := startCaddy(t, strings.ReplaceAll(observeSQLiteSite, "DBPATH", path), "SEG_KEY=hex:"+hex.EncodeToString(key))
	sign := func(route, id string) string {
		return c.Base + "/" + route + "/segments/" + id + "?st=" + token.Sign(key, id, hardDigest, hardAud, time.Now().Add(time.Hour).Unix())
	}
	get := func(url string, hdr map[string]string, wantCache string) obsAnswer {
		t.Helper()
		a := obsGet("GET", url, hdr)
		if a.err != nil || a.status != 200 {
			t.Fatalf("%s: %d %v", wantCache, a.status, a.err)
		}
		if len(a.cacheStatus) != 1 || a.cacheStatus[0] != wantCache {
			t.Fatalf("Cache-Status %q, want %q", a.cacheStatus, wantCache)
		}
		return a
	}
	// Identity asked for (Go's client would ask for gzip, and a small
	// segment's first answer may then be the variant it waited for):
	// the byte counts below are the identity sizes.
	plain := map[string]string{"Accept-Encoding": "identity"}
	get(sign("tiers", ids[0]), plain, "caddy-syncular; fwd=uri-miss; stored")
	get(sign("tiers", ids[0]), plain, "caddy-syncular; hit; detail=memory")
	get(sign("tiers", ids[1]), plain, "caddy-syncular; fwd=uri-miss; stored")
	get(sign("tiers", ids[1]), plain, "caddy-syncular; hit; detail=disk")
	get(sign("stream", ids[1]), plain, "caddy-syncular; fwd=bypass")

	// The zstd variant of the small segment is built from the bytes in
	// memory (the first zstd request starts the build and may wait for
	// it); once held, it is a memory hit.
	var coded obsAnswer
	if waitFor(10*time.Second, func() bool {
		req, _ := http.NewRequest("GET", sign("tiers", ids[0]), nil)
		req.Header.Set("Accept-Encoding", "zstd")
		res, err := client.Do(req)
		if err != nil {
			return false
		}
		defer res.Body.Close()
		io.Copy(io.Discard, res.Body)
		coded = obsAnswer{status: res.StatusCode, cacheStatus: res.Header.Values("Cache-Status")}
		return res.Header.Get("Content-Encoding") == "zstd"
	}) < 0 {
		t.Fatal("no zstd variant")
	}
	if len(coded.cacheStatus) != 1 || coded.cacheStatus[0] != "caddy-syncular; hit; detail=memory" {
		t.Fatalf("variant answer: Cache-Status %q", coded.cacheStatus)
	}

	m := scrape(t, c)
	want := float64(len(small) + 2*len(large)) // memory fill, disk fill, one stream
	if got := m[`caddy_syncular_store_read_bytes_total{backend="sqlite"}`]; got != want {
		t.Fatalf("store_read_bytes_total{sqlite} = %v, want %v:\n%s", got, want, dumpSyncular(m))
	}
	if got := m[`caddy_syncular_bytes_served_by_cache_total{cache="disk",server="srv0"}`]; got != float64(len(large)) {
		t.Errorf("bytes_served_by_cache_total{disk} = %v, want %v", got, len(large))
	}
	for _, cache := range []string{"fill", "stream"} {
		if _, ok := m[`caddy_syncular_bytes_served_by_cache_total{cache="`+cache+`",server="srv0"}`]; ok {
			t.Errorf("bytes_served_by_cache_total{%s}: a store read's bytes counted as served by a cache", cache)
		}
	}
	// Memory: the identity hit plus the variant answers (their sizes).
	if got := m[`caddy_syncular_bytes_served_by_cache_total{cache="memory",server="srv0"}`]; got < float64(len(small)) {
		t.Errorf("bytes_served_by_cache_total{memory} = %v, want at least %d", got, len(small))
	}
	if got := m[`caddy_syncular_first_byte_seconds_count{cache="fill",server="srv0"}`]; got != 2 {
		t.Errorf("first_byte_seconds_count{fill} = %v, want 2", got)
	}
}
