package caddymodule

import (
	"github.com/caddyserver/caddy/v2"

	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/store"
)

// Through a cached store: the first GET fills memory, the next is a hit,
// a HEAD and a 304 are answered from the record; each says so in
// {http.syncular.cache} and in Cache-Status (named as configured). A
// refusal has neither. {http.syncular.tenant} is the keyed hash of the
// audience: 16 hex digits, not the audience, the same for a second
// handler with the same config, different under another tenant_key.
func TestCacheStatusAndPlaceholders(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("cache status bytes"), pub("p1", digestA, testNow.Add(time.Hour)))
	cached := store.NewCached(fs, store.DefaultCacheOptions())
	h := newTestHandler(t, cached, func(h *Handler) { h.CacheStatus, h.CacheStatusName = true, "edge-1" })
	tok := mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
	url := "/sync/segments/" + id + "?st=" + tok

	steps := []struct {
		method string
		hdr    map[string]string
		code   int
		cache  string
		status string
	}{
		{http.MethodHead, nil, 200, "record", "edge-1; hit; detail=record"}, // the record read; no bytes
		{http.MethodGet, nil, 200, "fill", "edge-1; fwd=uri-miss; stored"},
		{http.MethodGet, nil, 200, "memory", "edge-1; hit; detail=memory"},
		{http.MethodGet, map[string]string{"Range": "bytes=0-3"}, 206, "memory", "edge-1; hit; detail=memory"},
		{http.MethodGet, map[string]string{"If-None-Match": `"` + id + `"`}, 304, "record", "edge-1; hit; detail=record"},
	}
	var tenant string
	for i, s := range steps {
		rec, repl := serve(t, h, s.method, url, s.hdr)
		if rec.Code != s.code {
			t.Fatalf("step %d: %d %s", i, rec.Code, rec.Body)
		}
		if got := replString(repl, placeholderPrefix+"cache"); got != s.cache {
			t.Errorf("step %d: {http.syncular.cache} = %q, want %q", i, got, s.cache)
		}
		if got := rec.Header().Values("Cache-Status"); len(got) != 1 || got[0] != s.status {
			t.Errorf("step %d: Cache-Status %q, want %q", i, got, s.status)
		}
		tn := replString(repl, placeholderPrefix+"tenant")
		if len(tn) != tenantHexDigits || strings.Trim(tn, "0123456789abcdef") != "" {
			t.Fatalf("step %d: tenant %q is not 16 hex digits", i, tn)
		}
		if tenant != "" && tn != tenant {
			t.Fatalf("step %d: tenant %q changed from %q", i, tn, tenant)
		}
		tenant = tn
	}
	if tenant != tenantOf(h.obs.tenantKey, "aud:p1") || strings.Contains(tenant, "p1") {
		t.Fatalf("tenant %q is not the keyed hash of the audience", tenant)
	}

	// Same configuration elsewhere: same tenant. Another tenant_key: another.
	h2 := newTestHandler(t, cached, nil)
	if _, repl := serve(t, h2, http.MethodGet, url, nil); replString(repl, placeholderPrefix+"tenant") != tenant {
		t.Fatal("a second handler with the same keys gives another tenant value")
	}
	h3 := newTestHandler(t, cached, func(h *Handler) { h.TenantKey = "another tenant key 0123456789" })
	if _, repl := serve(t, h3, http.MethodGet, url, nil); replString(repl, placeholderPrefix+"tenant") == tenant {
		t.Fatal("tenant_key does not change the tenant value")
	}
	// cache_status off (h2): no header, the placeholder still set.
	rec, repl := serve(t, h2, http.MethodGet, url, nil)
	if rec.Header().Get("Cache-Status") != "" || replString(repl, placeholderPrefix+"cache") != "memory" {
		t.Fatalf("cache_status off: header %q, cache %q", rec.Header().Get("Cache-Status"), replString(repl, placeholderPrefix+"cache"))
	}

	// Refusals: another tenant's token, a forged one, an unknown segment.
	other := mintToken(id, digestA, "aud:p2", testNow.Add(10*time.Minute))
	for _, target := range []string{
		"/sync/segments/" + id + "?st=" + other,
		"/sync/segments/" + id + "?st=forged",
		"/sync/segments/sha256:" + strings.Repeat("b", 64) + "?st=" + tok,
	} {
		rec, repl := serve(t, h, http.MethodGet, target, nil)
		if rec.Code < 400 {
			t.Fatalf("%s: %d", target, rec.Code)
		}
		if v := rec.Header().Values("Cache-Status"); len(v) != 0 {
			t.Errorf("refusal %d carries Cache-Status %q", rec.Code, v)
		}
		if _, ok := repl.Get(placeholderPrefix + "cache"); ok {
			t.Errorf("refusal %d publishes {http.syncular.cache}", rec.Code)
		}
	}
}

// Without a tiered store the bytes are a stream; a redirect says
// redirect (redirect_test.go covers the presigned answer itself).
func TestCacheStatusStream(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("streamed bytes"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, func(h *Handler) { h.CacheStatus = true })
	tok := mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
	rec, repl := serve(t, h, http.MethodGet, "/sync/segments/"+id+"?st="+tok, nil)
	if rec.Code != 200 || replString(repl, placeholderPrefix+"cache") != "stream" ||
		rec.Header().Get("Cache-Status") != "caddy-syncular; fwd=bypass" {
		t.Fatalf("%d cache %q status %q", rec.Code, replString(repl, placeholderPrefix+"cache"), rec.Header().Get("Cache-Status"))
	}
}

func TestCacheStatusConfig(t *testing.T) {
	for name, mod := range map[string]func(*Handler){
		"name without cache_status": func(h *Handler) { h.CacheStatusName = "x" },
		"name not a token":          func(h *Handler) { h.CacheStatus, h.CacheStatusName = true, "a b" },
		"weak tenant_key":           func(h *Handler) { h.TenantKey = "short" },
	} {
		h := &Handler{Keys: []string{string(testKey)}, Audience: &AudienceConfig{Kind: "template", Template: "a:{partition}"},
			Store: &StoreConfig{Backend: "sqlite", Path: "unused"}}
		mod(h)
		if err := h.setDefaults(); err != nil {
			t.Fatal(err)
		}
		if err := h.buildAuth(caddy.NewReplacer()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The cost of reading {http.syncular.tenant}: one HMAC-SHA256 of the
// audience (paid only by requests whose log or header reads it).
func BenchmarkTenantOf(b *testing.B) {
	key := make([]byte, 32)
	b.ReportAllocs()
	for b.Loop() {
		tenantOf(key, "aud:0123456789abcdef0123456789abcdef")
	}
}
