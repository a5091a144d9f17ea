package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// fakeStore is an in-memory store for unit tests: it counts calls and
// injects faults. The real stores are tested in store/ and integration/.
type fakeStore struct {
	mu        sync.Mutex
	recs      map[string]*store.Record
	data      map[string][]byte
	lookups   int
	opens     int
	lookupErr error
	openErr   error
	delay     time.Duration
}

func newFakeStore() *fakeStore {
	return &fakeStore{recs: map[string]*store.Record{}, data: map[string][]byte{}}
}

func (f *fakeStore) add(b []byte, pubs ...store.Publication) string {
	sum := sha256.Sum256(b)
	id := "sha256:" + hex.EncodeToString(sum[:])
	f.recs[id] = &store.Record{SegmentID: id, ByteLength: int64(len(b)), MediaType: store.MediaRows, Publications: pubs}
	f.data[id] = b
	return id
}

func (f *fakeStore) wait(ctx context.Context) error {
	if f.delay == 0 {
		return nil
	}
	select {
	case <-time.After(f.delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeStore) Lookup(ctx context.Context, pid segid.ID) (*store.Record, error) {
	id := pid.String()
	f.mu.Lock()
	f.lookups++
	rec, err := f.recs[id], f.lookupErr
	f.mu.Unlock()
	if werr := f.wait(ctx); werr != nil {
		return nil, werr
	}
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, store.ErrNotFound
	}
	return rec, nil
}

func (f *fakeStore) Open(ctx context.Context, pid segid.ID, off, n int64) (io.ReadCloser, error) {
	id := pid.String()
	f.mu.Lock()
	f.opens++
	b, ok := f.data[id]
	err := f.openErr
	f.mu.Unlock()
	if werr := f.wait(ctx); werr != nil {
		return nil, werr
	}
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, store.ErrNotFound
	}
	if n < 0 {
		n = int64(len(b)) - off
	}
	return io.NopCloser(bytes.NewReader(b[off : off+n])), nil
}

func (f *fakeStore) Close() error { return nil }

func (f *fakeStore) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups, f.opens
}

var (
	testKey = []byte("edge-test-key-1/0123456789abcdef") // 32 bytes
	testNow = time.UnixMilli(1_750_000_000_000)
	digestA = strings.Repeat("a", 64)
	digestB = strings.Repeat("b", 64)
)

// newTestHandler builds a provisioned handler around st without Caddy's
// module loader: template audience aud:{partition}, fixed clock; opts
// (export_test.go) run before the defaults, in order.
func newTestHandler(t testing.TB, st store.Store, opts ...testOption) *Handler {
	t.Helper()
	h := testHooks(&Handler{
		Keys:     []string{string(testKey)},
		Audience: &AudienceConfig{Kind: "template", Template: "aud:{partition}"},
		Store:    &StoreConfig{Backend: "sqlite", Path: "unused"},
		life:     new(lifetime),
	}, append([]testOption{withClock(func() time.Time { return testNow })}, opts...)...)
	if err := h.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if err := h.buildAuth(caddy.NewReplacer()); err != nil {
		t.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	if st != nil {
		h.setAnyStore(st)
	}
	return h
}

// nextHandler stands for reverse_proxy: it answers 299 with a marker.
var nextHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("X-Next", "reached")
	w.WriteHeader(299)
	return nil
})

func serve(t testing.TB, h *Handler, method, target string, hdr map[string]string) (*httptest.ResponseRecorder, *caddy.Replacer) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	repl := caddyhttp.NewTestReplacer(req)
	req = req.WithContext(context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl))
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nextHandler); err != nil {
		t.Fatalf("ServeHTTP returned %v", err)
	}
	return rec, repl
}

type errBody struct {
	Code              string `json:"code"`
	Category          string `json:"category"`
	Retryable         *bool  `json:"retryable"`
	RecommendedAction string `json:"recommendedAction"`
	Message           string `json:"message"`
}

// wantError asserts a protocol error answer with the catalog's fields.
func wantError(t testing.TB, rec *httptest.ResponseRecorder, status int, code string) errBody {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d (body %s)", rec.Code, status, rec.Body.String())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var b errBody
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, rec.Body.String())
	}
	if b.Code != code {
		t.Fatalf("code %q, want %q (%s)", b.Code, code, b.Message)
	}
	want := map[string]struct {
		cat   string
		retry bool
		act   string
	}{
		"sync.forbidden":             {"forbidden", false, "checkPermissions"},
		"sync.not_found":             {"not-found", false, "forceResync"},
		"sync.segment_expired":       {"not-found", true, "retryLater"},
		"sync.invalid_request":       {"invalid-request", false, "fixRequest"},
		"edge.method_not_allowed":    {"invalid-request", false, "fixRequest"},
		"edge.range_not_satisfiable": {"invalid-request", false, "fixRequest"},
		"edge.store_unavailable":     {"internal", true, "retryLater"},
		"edge.store_timeout":         {"internal", true, "retryLater"},
		"edge.overloaded":            {"internal", true, "retryLater"},
	}[code]
	if b.Category != want.cat || b.Retryable == nil || *b.Retryable != want.retry || b.RecommendedAction != want.act || b.Message == "" {
		t.Fatalf("catalog fields wrong for %s: %+v", code, b)
	}
	return b
}

func pub(partition, sd string, expiresAt time.Time) store.Publication {
	return store.Publication{Partition: partition, LogEpoch: "e1", Table: "tasks", MediaType: store.MediaRows, ScopeDigest: sd, ExpiresAtMs: expiresAt.UnixMilli()}
}

func mintToken(seg, sd, aud string, exp time.Time) string {
	return token.Sign(testKey, seg, sd, aud, exp.Unix())
}

func TestServeGranted(t *testing.T) {
	fs := newFakeStore()
	body := []byte("SSG2 segment bytes for p1")
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	url := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))

	rec, repl := serve(t, h, "GET", url, nil)
	if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), body) {
		t.Fatalf("GET: %d %q", rec.Code, rec.Body.String())
	}
	for k, v := range map[string]string{
		"Content-Type":   "application/octet-stream",
		"Content-Length": "25",
		"ETag":           `"` + id + `"`,
		"Cache-Control":  "private, max-age=660", // token end (exp+skew) comes before the publication's
	} {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if v, _ := repl.GetString("http.syncular.outcome"); v != "granted" {
		t.Errorf("outcome placeholder %q", v)
	}
	if v, _ := repl.GetString("http.syncular.segment_id"); v != id {
		t.Errorf("segment_id placeholder %q", v)
	}

	// HEAD: same headers, no body, no read of the bytes.
	_, opensBefore := fs.counts()
	rec, _ = serve(t, h, "HEAD", url, nil)
	if rec.Code != 200 || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") != "25" || rec.Header().Get("ETag") != `"`+id+`"` {
		t.Fatalf("HEAD: %d len=%d %v", rec.Code, rec.Body.Len(), rec.Header())
	}
	if _, opens := fs.counts(); opens != opensBefore {
		t.Errorf("HEAD opened the bytes")
	}

	// Range.
	rec, _ = serve(t, h, "GET", url, map[string]string{"Range": "bytes=5-11"})
	if rec.Code != 206 || rec.Body.String() != "segment" || rec.Header().Get("Content-Range") != "bytes 5-11/25" || rec.Header().Get("Content-Length") != "7" {
		t.Fatalf("Range: %d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
	rec, _ = serve(t, h, "GET", url, map[string]string{"Range": "bytes=-3"})
	if rec.Code != 206 || rec.Body.String() != " p1" {
		t.Fatalf("suffix Range: %d %q", rec.Code, rec.Body.String())
	}
	rec, _ = serve(t, h, "GET", url, map[string]string{"Range": "bytes=25-"})
	wantError(t, rec, 416, "edge.range_not_satisfiable")
	if rec.Header().Get("Content-Range") != "bytes */25" {
		t.Errorf("416 Content-Range %q", rec.Header().Get("Content-Range"))
	}
	// Multi-range is answered with the whole body.
	rec, _ = serve(t, h, "GET", url, map[string]string{"Range": "bytes=0-1,3-4"})
	if rec.Code != 200 || rec.Body.Len() != 25 {
		t.Fatalf("multi-range: %d %d", rec.Code, rec.Body.Len())
	}
	// If-Range with another validator: whole body.
	rec, _ = serve(t, h, "GET", url, map[string]string{"Range": "bytes=0-1", "If-Range": `"other"`})
	if rec.Code != 200 {
		t.Fatalf("If-Range mismatch: %d", rec.Code)
	}

	// If-None-Match.
	rec, _ = serve(t, h, "GET", url, map[string]string{"If-None-Match": `"x", W/"` + id + `"`})
	if rec.Code != 304 || rec.Body.Len() != 0 || rec.Header().Get("ETag") != `"`+id+`"` {
		t.Fatalf("If-None-Match: %d %v", rec.Code, rec.Header())
	}
	rec, _ = serve(t, h, "GET", url, map[string]string{"If-None-Match": `"sha256:other"`})
	if rec.Code != 200 {
		t.Fatalf("If-None-Match other: %d", rec.Code)
	}
}

func TestRequestShapes(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	tok := mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))

	rec, _ := serve(t, h, "POST", "/segments/"+id+"?st="+tok, nil)
	wantError(t, rec, 405, "edge.method_not_allowed")
	if rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("Allow = %q", rec.Header().Get("Allow"))
	}
	rec, _ = serve(t, h, "GET", "/segments/"+id+"?st="+tok+"&st="+tok, nil)
	wantError(t, rec, 403, "sync.forbidden")
	rec, _ = serve(t, h, "GET", "/segments/"+id+"?%73t="+tok+"&st="+tok, nil)
	wantError(t, rec, 403, "sync.forbidden")

	for _, p := range []string{
		"/segments/sha256:XYZ",
		"/segments/" + strings.ToUpper(id),
		"/segments/" + id + "/",
		"/segments/" + id + "0",
		"/segments/" + id + "%00",
		"/segments/..%2F" + id,
	} {
		rec, _ = serve(t, h, "GET", p+"?st="+tok, nil)
		wantError(t, rec, 404, "sync.not_found")
	}
	// Percent-encoded colon is a segment id.
	rec, _ = serve(t, h, "GET", "/segments/"+strings.Replace(id, ":", "%3A", 1)+"?st="+tok, nil)
	if rec.Code != 200 {
		t.Fatalf("percent-encoded id: %d %s", rec.Code, rec.Body.String())
	}
	// Mount prefix is irrelevant: the id is the last element.
	rec, _ = serve(t, h, "GET", "/any/mount/segments/"+id+"?st="+tok, nil)
	if rec.Code != 200 {
		t.Fatalf("mounted: %d", rec.Code)
	}
	// An empty or unescapable st is a (refused) token, not a missing one.
	for _, q := range []string{"?st=", "?st=%zz", "?a=1&st"} {
		rec, _ = serve(t, h, "GET", "/segments/"+id+q, nil)
		wantError(t, rec, 403, "sync.forbidden")
	}
	// Oversize token: refused before any crypto or store work.
	lookups, _ := fs.counts()
	rec, _ = serve(t, h, "GET", "/segments/"+id+"?st="+strings.Repeat("A", 5000)+"."+tok, nil)
	wantError(t, rec, 403, "sync.forbidden")
	if l, _ := fs.counts(); l != lookups {
		t.Errorf("oversize token reached the store")
	}
}

func TestUntokened(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	for _, m := range []string{"GET", "POST", "DELETE"} {
		rec, repl := serve(t, h, m, "/segments/"+id+"?other=1", nil)
		if rec.Code != 299 || rec.Header().Get("X-Next") != "reached" {
			t.Fatalf("%s without st: %d", m, rec.Code)
		}
		if v, _ := repl.GetString("http.syncular.outcome"); v != "next" {
			t.Errorf("outcome %q", v)
		}
	}
	if l, _ := fs.counts(); l != 0 {
		t.Errorf("untokened request touched the store")
	}
	hr := newTestHandler(t, fs, func(h *Handler) { h.Untokened = "reject" })
	rec, _ := serve(t, hr, "GET", "/segments/"+id, nil)
	wantError(t, rec, 403, "sync.forbidden")
}

// TestForgedTokensNeverReachStore: the MAC is checked before any store
// read, whatever else is wrong with the request.
func TestForgedTokensNeverReachStore(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	forged := []string{
		token.Sign([]byte("edge-test-key-2"), id, digestA, "aud:p1", testNow.Add(time.Minute).Unix()),
		mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute)) + "x",
		"!!!.???",
		"",
		mintToken(id, digestA, "aud:p1", testNow.Add(-2*time.Minute)),                             // expired
		mintToken("sha256:"+strings.Repeat("0", 64), digestA, "aud:p1", testNow.Add(time.Minute)), // other segment
	}
	for _, tok := range forged {
		rec, _ := serve(t, h, "GET", "/segments/"+id+"?st="+tok, nil)
		wantError(t, rec, 403, "sync.forbidden")
	}
	if l, o := fs.counts(); l != 0 || o != 0 {
		t.Fatalf("forged tokens caused %d lookups, %d opens", l, o)
	}
}

func TestGrantOutcomes(t *testing.T) {
	fs := newFakeStore()
	exp := testNow.Add(time.Minute)
	multi := fs.add([]byte("multi"),
		pub("p1", digestA, testNow.Add(time.Hour)),
		pub("p2", digestB, testNow.Add(-time.Second)), // expired
		pub("p2", digestA, testNow.Add(2*time.Hour)),
	)
	expired := fs.add([]byte("old"), pub("p1", digestA, testNow))
	fenced := fs.add([]byte("fenced"), pub("p1", digestA, testNow.Add(time.Hour)))
	fs.recs[fenced].Fenced = true
	fs.recs[fenced].Epochs = map[string]string{"p1": "e2"}
	unregistered := fs.add([]byte("unregistered"), pub("p1", digestA, testNow.Add(time.Hour)))
	fs.recs[unregistered].Fenced = true
	overtaken := fs.add([]byte("overtaken"), pub("p1", digestA, testNow.Add(time.Hour)), pub("p2", digestA, testNow.Add(time.Hour)))
	fs.recs[overtaken].Checkpoints = map[string]int64{"p1": 1} // publications are at schema version 0
	h := newTestHandler(t, fs, nil)

	cases := []struct {
		name, seg, sd, aud string
		status             int
		code               string
		msg                string
	}{
		{"p1 digest A", multi, digestA, "aud:p1", 200, "", ""},
		{"p2 digest A", multi, digestA, "aud:p2", 200, "", ""},
		{"p2 digest B expired", multi, digestB, "aud:p2", 404, "sync.segment_expired", "segment expired"},
		{"p1 digest B never published", multi, digestB, "aud:p1", 403, "sync.forbidden", "audience mismatch"},
		{"unknown digest", multi, strings.Repeat("c", 64), "aud:p1", 403, "sync.forbidden", "scope-digest mismatch"},
		{"other partition", multi, digestA, "aud:p3", 403, "sync.forbidden", "audience mismatch"},
		{"expires exactly now", expired, digestA, "aud:p1", 404, "sync.segment_expired", "segment expired"},
		{"epoch rotated away", fenced, digestA, "aud:p1", 404, "sync.not_found", "fenced by the partition registry"},
		{"partition not registered", unregistered, digestA, "aud:p1", 404, "sync.not_found", "fenced by the partition registry"},
		{"overtaken by a checkpoint", overtaken, digestA, "aud:p1", 404, "sync.segment_expired", "overtaken by a backfill checkpoint"},
		{"checkpoint of another partition", overtaken, digestA, "aud:p2", 200, "", ""},
		{"unknown segment", "sha256:" + strings.Repeat("1", 64), digestA, "aud:p1", 404, "sync.not_found", "segment not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec, _ := serve(t, h, "GET", "/segments/"+c.seg+"?st="+mintToken(c.seg, c.sd, c.aud, exp), nil)
			if c.status == 200 {
				if rec.Code != 200 {
					t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
				}
				return
			}
			b := wantError(t, rec, c.status, c.code)
			if !strings.Contains(b.Message, c.msg) {
				t.Errorf("message %q lacks %q", b.Message, c.msg)
			}
			if strings.Contains(rec.Body.String(), "p1") || strings.Contains(rec.Body.String(), "p2") {
				t.Errorf("partition id leaked: %s", rec.Body.String())
			}
		})
	}
}

func TestStoreFaults(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, func(h *Handler) { h.StoreTimeout = caddy.Duration(50 * time.Millisecond) })
	url := "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))

	fs.lookupErr = errors.New("database disk image is malformed")
	rec, _ := serve(t, h, "GET", url, nil)
	wantError(t, rec, 503, "edge.store_unavailable")
	if rec.Header().Get("Retry-After") == "" || rec.Header().Get("ETag") != "" {
		t.Errorf("fault headers: %v", rec.Header())
	}
	if strings.Contains(rec.Body.String(), "malformed") {
		t.Errorf("internal error text leaked: %s", rec.Body.String())
	}
	fs.lookupErr = nil
	fs.openErr = errors.New("connection reset")
	rec, _ = serve(t, h, "GET", url, nil)
	wantError(t, rec, 503, "edge.store_unavailable")
	fs.openErr = nil

	fs.delay = 10 * time.Second
	start := time.Now()
	rec, _ = serve(t, h, "GET", url, nil)
	wantError(t, rec, 504, "edge.store_timeout")
	if time.Since(start) > 5*time.Second { // 50ms timeout vs a 10s store
		t.Errorf("store timeout not enforced")
	}
	fs.delay = 0
	rec, _ = serve(t, h, "GET", url, nil)
	if rec.Code != 200 {
		t.Fatalf("no recovery after fault: %d", rec.Code)
	}
}

func TestKeyRotation(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, func(h *Handler) { h.Keys = []string{strongKey2, "hex:" + hex.EncodeToString(testKey)} })
	rec, _ := serve(t, h, "GET", "/segments/"+id+"?st="+mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute)), nil)
	if rec.Code != 200 {
		t.Fatalf("old key not accepted during rotation: %d", rec.Code)
	}
	newKey, _ := token.ParseKey(strongKey2)
	tok := token.Sign(newKey, id, digestA, "aud:p1", testNow.Add(time.Minute).Unix())
	rec, _ = serve(t, h, "GET", "/segments/"+id+"?st="+tok, nil)
	if rec.Code != 200 {
		t.Fatalf("new key not accepted: %d", rec.Code)
	}
}

// TestHashInSignedURL: a raw '#' in the request target of a request with
// st anywhere (before or after the '#', in the query or after a '#' in the
// path) is refused before any token or store work: a log filter reading
// the target as a URL would end it at the '#' and keep the token.
func TestHashInSignedURL(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	tok := mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))
	seg := "/sync/segments/" + id
	for _, target := range []string{
		seg + "?x=#&st=" + tok,
		seg + "?st=" + tok + "&x=#",
		seg + "?st=" + tok + "#",
		seg + "?#st=" + tok,
		seg + "?x#st=" + tok,
		seg + "?x=1&#&%73t=" + tok,
		seg + "#?st=" + tok,
		seg + "#st=" + tok,
		seg + "#x?y=1&st=" + tok,
		"http://edge.example" + seg + "?x=#&st=" + tok, // absolute form
	} {
		rec, repl := serve(t, h, "GET", target, nil)
		wantError(t, rec, 403, "sync.forbidden")
		if v, _ := repl.GetString("http.syncular.key_slot"); v != "" {
			t.Errorf("%s: the token was checked (key_slot %q)", target, v)
		}
	}
	if l, o := fs.counts(); l != 0 || o != 0 {
		t.Fatalf("'#' requests caused %d lookups, %d opens", l, o)
	}
	// An escaped '#' is data, not a fragment; a '#' without st is not ours.
	rec, _ := serve(t, h, "GET", seg+"?x=%23&st="+tok, nil)
	if rec.Code != 200 {
		t.Fatalf("%%23 in the query: %d %s", rec.Code, rec.Body.String())
	}
	rec, _ = serve(t, h, "GET", seg+"?x=#&y=1", nil)
	if rec.Code != 299 {
		t.Fatalf("'#' without st: %d, want the next handler", rec.Code)
	}
}

// TestShippedLogFilterRemovesTokens checks the request>uri filter the
// shipped configurations put on every logger against the parsers that
// read st: whenever the handler, or a URL parser as other loggers use
// it, would read a token from a request target, the filtered target (what
// the log keeps) must not contain it. Targets are built at random from
// the pieces that make parsers disagree.
func TestShippedLogFilterRemovesTokens(t *testing.T) {
	var expr string
	for _, file := range []string{"../Caddyfile.example", "../examples/s3-redirect.Caddyfile"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "request>uri ") {
				continue
			}
			f := strings.Split(line, `"`)
			if len(f) != 5 || strings.TrimSpace(f[0]) != "request>uri regexp" || f[3] != "$1" {
				t.Fatalf("%s: unexpected request>uri filter %q", file, line)
			}
			if expr != "" && f[1] != expr {
				t.Fatalf("%s: request>uri filters differ: %q and %q", file, expr, f[1])
			}
			expr = f[1]
			n++
		}
		if n != 2 { // the site's access log and the default log
			t.Fatalf("%s: %d request>uri filters, want 2", file, n)
		}
	}
	re := regexp.MustCompile(expr)

	const mark = "TOKMARK"
	pieces := []string{
		"st=" + mark, "%73t=" + mark, "s%74=" + mark, "%73%74=" + mark, "ST=" + mark, "st%3D" + mark,
		"st=", "x=1", "x=", "#", "?", "&", ";", "%23", "%26", "=", "+", mark,
	}
	markRe := regexp.MustCompile(mark + `[0-9]+Z`)
	rng := mrand.New(mrand.NewPCG(1, 2))
	checked := 0
	for i := 0; i < 3000; i++ {
		var b strings.Builder
		if rng.IntN(4) == 0 {
			b.WriteString("http://edge.example")
		}
		b.WriteString("/sync/segments/sha256:" + digestA)
		if rng.IntN(3) != 0 {
			b.WriteString("?")
		}
		for n := 1 + rng.IntN(5); n > 0; n-- { // each mark numbered: TOKMARK<n>Z
			b.WriteString(strings.ReplaceAll(pieces[rng.IntN(len(pieces))], mark, fmt.Sprintf("%s%dZ", mark, n)))
		}
		target := b.String()
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + target + " HTTP/1.1\r\nHost: h\r\n\r\n")))
		if err != nil {
			continue // Go's server would answer 400 before any handler or log
		}
		var read []string
		if toks, _ := stParams(req.URL.RawQuery); !hashHidesToken(req) {
			read = append(read, toks...)
		}
		for _, parse := range []func(string) (*url.URL, error){url.Parse, url.ParseRequestURI} {
			if u, err := parse(req.RequestURI); err == nil {
				read = append(read, u.Query()["st"]...)
			}
		}
		logged := re.ReplaceAllString(req.RequestURI, "$1")
		for _, tok := range read {
			for _, m := range markRe.FindAllString(tok, -1) {
				checked++
				if strings.Contains(logged, m) {
					t.Fatalf("target %q: a parser reads st=%q, the log keeps %q", target, tok, logged)
				}
			}
		}
	}
	if checked < 500 {
		t.Fatalf("only %d targets carried a readable token: the check proves little", checked)
	}
	t.Logf("%d token readings checked", checked)
}

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
