package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store"
)

func TestCompressPrefs(t *testing.T) {
	good := []struct {
		in   []string
		want []compress.Coding
	}{
		{nil, []compress.Coding{compress.Zstd, compress.Gzip}},
		{[]string{}, []compress.Coding{compress.Zstd, compress.Gzip}},
		{[]string{"off"}, []compress.Coding{}},
		{[]string{"gzip"}, []compress.Coding{compress.Gzip}},
		{[]string{"gzip", "zstd"}, []compress.Coding{compress.Gzip, compress.Zstd}},
	}
	for _, c := range good {
		got, err := compressPrefs(c.in)
		if err != nil || !slices.Equal(got, c.want) || got == nil {
			t.Errorf("compressPrefs(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range [][]string{{"br"}, {"identity"}, {"gzip", "gzip"}, {"off", "gzip"}, {"GZIP"}, {"x-gzip"}, {""}} {
		if got, err := compressPrefs(in); err == nil {
			t.Errorf("compressPrefs(%q) = %v, want an error", in, got)
		}
	}
}

func TestCompressCaddyfile(t *testing.T) {
	for in, want := range map[string][]string{
		"syncular_segments {\n compress zstd gzip\n}": {"zstd", "gzip"},
		"syncular_segments {\n compress off\n}":       {"off"},
		"syncular_segments {\n compress gzip\n}":      {"gzip"},
		"syncular_segments {\n key k\n}":              nil,
	} {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if !slices.Equal(h.Compress, want) {
			t.Errorf("%q: Compress %q, want %q", in, h.Compress, want)
		}
	}
	for in, want := range map[string]string{
		"syncular_segments {\n compress\n}":           "wrong argument count",
		"syncular_segments {\n compress br\n}":        "unknown coding",
		"syncular_segments {\n compress off gzip\n}":  "unknown coding",
		"syncular_segments {\n compress gzip gzip\n}": "listed twice",
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
}

// compressibleBody is a segment that shrinks well.
func compressibleBody(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, `{"id":%d,"title":"task %d","status":"open","owner":"user-%03d"}`+"\n", i, i*7, i%97)
	}
	return b.Bytes()[:n]
}

// newCompressHandler is a serve handler over a cache in front of fs, with
// compression resolved as Provision resolves it.
func newCompressHandler(t *testing.T, fs *fakeStore, mod func(*Handler)) *Handler {
	t.Helper()
	h := newTestHandler(t, store.NewCached(fs, store.DefaultCacheOptions()), mod)
	if err := h.provisionCompress(); err != nil {
		t.Fatal(err)
	}
	return h
}

func decodeBody(t *testing.T, rec *httptest.ResponseRecorder) []byte {
	t.Helper()
	raw := rec.Body.Bytes()
	var r io.Reader
	switch ce := rec.Header().Get("Content-Encoding"); ce {
	case "":
		return raw
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	default:
		t.Fatalf("Content-Encoding %q", ce)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestServeCompressed(t *testing.T) {
	fs := newFakeStore()
	body := compressibleBody(64 << 10)
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newCompressHandler(t, fs, nil)
	url := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
	gz := map[string]string{"Accept-Encoding": "gzip"}

	// The first answer starts the build and waits for it (at most
	// store.WaitBound: 5 ms for 64 KiB, the smallest size that waits),
	// so it is the variant when the build ended in time, identity
	// otherwise; it says it varies.
	rec, _ := serve(t, h, "GET", url, gz)
	if ce := rec.Header().Get("Content-Encoding"); ce == "" {
		if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), body) || rec.Header().Get("ETag") != `"`+id+`"` {
			t.Fatalf("first GET: %d, %v", rec.Code, rec.Header())
		}
	} else if ce != "gzip" {
		t.Fatalf("first GET: %d, %v", rec.Code, rec.Header())
	}
	if rec.Header().Get("Vary") != "Accept-Encoding" {
		t.Fatalf("first GET: %d, %v", rec.Code, rec.Header())
	}
	deadline := time.Now().Add(10 * time.Second)
	for rec.Header().Get("Content-Encoding") != "gzip" {
		if time.Now().After(deadline) {
			t.Fatal("no gzip answer within 10s")
		}
		time.Sleep(5 * time.Millisecond)
		rec, _ = serve(t, h, "GET", url, gz)
	}
	if !bytes.Equal(decodeBody(t, rec), body) || rec.Header().Get("ETag") != `"`+id+`+gzip"` ||
		rec.Header().Get("Content-Length") != strconv.Itoa(rec.Body.Len()) || rec.Header().Get("Vary") != "Accept-Encoding" ||
		rec.Header().Get("Cache-Control") == "" || rec.Header().Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("gzip answer: %v", rec.Header())
	}
	gzLen := rec.Body.Len()

	// HEAD: the variant's headers.
	rec, _ = serve(t, h, "HEAD", url, gz)
	if rec.Code != 200 || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") != strconv.Itoa(gzLen) || rec.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("HEAD: %d %v", rec.Code, rec.Header())
	}
	// HEAD for zstd, not built yet: identity, as a GET now would be.
	rec, _ = serve(t, h, "HEAD", url, map[string]string{"Accept-Encoding": "zstd"})
	if rec.Header().Get("Content-Encoding") != "" || rec.Header().Get("Content-Length") != strconv.Itoa(len(body)) {
		t.Fatalf("HEAD before the zstd variant: %v", rec.Header())
	}

	// Range: identity bytes.
	rec, _ = serve(t, h, "GET", url, map[string]string{"Accept-Encoding": "gzip", "Range": "bytes=10-19"})
	if rec.Code != 206 || !bytes.Equal(rec.Body.Bytes(), body[10:20]) || rec.Header().Get("Content-Encoding") != "" || rec.Header().Get("ETag") != `"`+id+`"` {
		t.Fatalf("Range: %d %v", rec.Code, rec.Header())
	}

	// 304 on any variant's ETag, answered with what a GET would send.
	rec, _ = serve(t, h, "GET", url, map[string]string{"If-None-Match": `"` + id + `+zstd"`, "Accept-Encoding": "gzip"})
	if rec.Code != 304 || rec.Header().Get("ETag") != `"`+id+`+gzip"` || rec.Header().Get("Vary") != "Accept-Encoding" || rec.Header().Get("Content-Encoding") != "" {
		t.Fatalf("If-None-Match: %d %v", rec.Code, rec.Header())
	}

	// No Accept-Encoding: identity.
	rec, _ = serve(t, h, "GET", url, nil)
	if !bytes.Equal(rec.Body.Bytes(), body) || rec.Header().Get("Content-Encoding") != "" {
		t.Fatalf("identity: %v", rec.Header())
	}
}

func TestServeCompressOff(t *testing.T) {
	fs := newFakeStore()
	body := compressibleBody(16 << 10)
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newCompressHandler(t, fs, func(h *Handler) { h.Compress = []string{"off"} })
	url := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
	for range 20 {
		rec, _ := serve(t, h, "GET", url, map[string]string{"Accept-Encoding": "gzip, zstd"})
		if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), body) || rec.Header().Get("Content-Encoding") != "" || rec.Header().Get("Vary") != "" {
			t.Fatalf("compress off: %d %v", rec.Code, rec.Header())
		}
		time.Sleep(time.Millisecond)
	}
	if st := h.store.Stats().Variants; st.Made != 0 {
		t.Fatalf("compress off built %d variants", st.Made)
	}
	// With compression on but no bytes cache there is nothing to send
	// but identity.
	h = newTestHandler(t, store.NewCached(fs, store.CacheOptions{}), nil)
	if err := h.provisionCompress(); err != nil {
		t.Fatal(err)
	}
	rec, _ := serve(t, h, "GET", url, map[string]string{"Accept-Encoding": "gzip"})
	if rec.Header().Get("Content-Encoding") != "" || !bytes.Equal(rec.Body.Bytes(), body) {
		t.Fatalf("no bytes cache: %v", rec.Header())
	}
}

// When the preferred coding has no variant yet but another accepted one
// has, that one is sent (not identity), and the preferred one's build
// starts; a HEAD says what a GET would send now and starts no build.
func TestServeFallbackCoding(t *testing.T) {
	fs := newFakeStore()
	body := compressibleBody(16 << 10) // below store.WaitMinSize: nobody waits for a build
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newCompressHandler(t, fs, nil) // prefers zstd, then gzip
	url := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
	c := h.store

	// Only gzip is asked for until its variant is held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, _ := serve(t, h, "GET", url, map[string]string{"Accept-Encoding": "gzip"})
		if rec.Header().Get("Content-Encoding") == "gzip" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no gzip answer within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if made := c.Stats().Variants.Made; made != 1 {
		t.Fatalf("%d variants built, want gzip alone", made)
	}
	both := map[string]string{"Accept-Encoding": "zstd, gzip"}
	// HEAD: gzip, the variant held; no zstd build is started by it.
	for range 3 {
		rec, _ := serve(t, h, "HEAD", url, both)
		if rec.Code != 200 || rec.Header().Get("Content-Encoding") != "gzip" || rec.Header().Get("ETag") != `"`+id+`+gzip"` {
			t.Fatalf("HEAD: %d %v", rec.Code, rec.Header())
		}
	}
	time.Sleep(50 * time.Millisecond)
	if made := c.Stats().Variants.Made; made != 1 {
		t.Fatalf("HEAD built a variant: %d made", made)
	}
	// GET: zstd is preferred but not held: gzip is sent, and zstd built.
	rec, _ := serve(t, h, "GET", url, both)
	if rec.Code != 200 || rec.Header().Get("Content-Encoding") != "gzip" || !bytes.Equal(decodeBody(t, rec), body) ||
		rec.Header().Get("Content-Length") != strconv.Itoa(rec.Body.Len()) {
		t.Fatalf("GET with zstd not built: %d %v, want the gzip variant", rec.Code, rec.Header())
	}
	for {
		rec, _ = serve(t, h, "GET", url, both)
		if rec.Header().Get("Content-Encoding") == "zstd" {
			break
		}
		if ce := rec.Header().Get("Content-Encoding"); ce != "gzip" {
			t.Fatalf("while zstd builds: Content-Encoding %q, want gzip", ce)
		}
		if time.Now().After(deadline) {
			t.Fatal("no zstd answer within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !bytes.Equal(decodeBody(t, rec), body) || rec.Header().Get("ETag") != `"`+id+`+zstd"` {
		t.Fatalf("zstd answer: %v", rec.Header())
	}
}
