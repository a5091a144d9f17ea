package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
)

// testClock is a handler clock tests move by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func graceOf(result string) float64 {
	return metricValue(moduleCollectors().grace.WithLabelValues(unknownServer, result))
}

// errRefused is what a store returns when nothing listens any more.
var errRefused = errors.New("store: sqlite: database file unavailable: no such file or directory")

// outageHandler is a handler over a cached fake store with an injected
// clock and the given grace, its metrics and logs observed.
func outageHandler(t *testing.T, fs *fakeStore, grace time.Duration) (*Handler, *testClock, *observer.ObservedLogs) {
	t.Helper()
	clk := &testClock{now: testNow}
	g := caddy.Duration(grace)
	h := newTestHandler(t, nil, withClock(clk.Now), func(h *Handler) {
		h.Grace = &g
		h.StoreTimeout = caddy.Duration(time.Second)
	})
	logs := observeLogs(h)
	useMetrics(h, unknownServer)
	opts := h.Cache.options(time.Duration(h.StoreTimeout), h.now)
	opts.Grace = h.grace
	opts.OnBreaker = h.breakerLog()
	opts.ProbeInterval = time.Hour // the probe does not close it during the test
	c := store.NewCached(fs, opts)
	t.Cleanup(c.Stop)
	h.setStore(c)
	return h, clk, logs
}

// TestGraceKeepsServingHeldSegments: while the store cannot be read, a
// segment whose record was read within grace and whose bytes the edge
// holds is served (counted as grace "served"), expiry still applies to the
// millisecond, a segment whose bytes it does not hold answers 503
// edge.store_unavailable, and once the breaker is open a segment it never
// read answers 503 without a store call. With grace 0 nothing is served.
func TestGraceKeepsServingHeldSegments(t *testing.T) {
	for _, grace := range []time.Duration{5 * time.Minute, 0} {
		t.Run("grace "+grace.String(), func(t *testing.T) {
			fs := newFakeStore()
			exp := testNow.Add(time.Minute)
			held := fs.add([]byte("bytes the edge holds"), pub("p1", digestA, exp))
			notHeld := fs.add([]byte("record read, bytes never"), pub("p1", digestA, exp))
			never := fs.add([]byte("never read at all"), pub("p1", digestA, exp))
			h, clk, logs := outageHandler(t, fs, grace)
			url := func(id string) string {
				return "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(time.Hour))
			}
			if rec, _ := serve(t, h, http.MethodGet, url(held), nil); rec.Code != 200 {
				t.Fatalf("healthy: %d", rec.Code)
			}
			if rec, _ := serve(t, h, http.MethodHead, url(notHeld), nil); rec.Code != 200 {
				t.Fatalf("healthy HEAD: %d", rec.Code)
			}
			served, unavailable := graceOf("served"), graceOf("unavailable")

			fs.mu.Lock()
			fs.lookupErr, fs.openErr = errRefused, errRefused
			fs.mu.Unlock()
			clk.Advance(10 * time.Second) // past record_ttl
			rec, _ := serve(t, h, http.MethodGet, url(held), nil)
			if grace == 0 {
				wantError(t, rec, http.StatusServiceUnavailable, "edge.store_unavailable")
				if graceOf("served") != served {
					t.Fatal("grace 0 counted a grace request")
				}
				return
			}
			if rec.Code != 200 || rec.Body.String() != "bytes the edge holds" {
				t.Fatalf("held segment during the outage: %d %s", rec.Code, rec.Body.String())
			}
			if got := graceOf("served") - served; got != 1 {
				t.Fatalf("grace served counter moved by %v, want 1", got)
			}
			wantError(t, mustServe(t, h, url(notHeld)), http.StatusServiceUnavailable, "edge.store_unavailable")
			if got := graceOf("unavailable") - unavailable; got != 1 {
				t.Fatalf("grace unavailable counter moved by %v, want 1", got)
			}
			// Three failed calls so far (two lookups, one open): open.
			if !h.store.BreakerOpen() {
				t.Fatal("breaker still closed")
			}
			lookups, opens := fs.counts()
			wantError(t, mustServe(t, h, url(never)), http.StatusServiceUnavailable, "edge.store_unavailable")
			if rec := mustServe(t, h, url(held)); rec.Code != 200 {
				t.Fatalf("held segment, breaker open: %d", rec.Code)
			}
			if l, o := fs.counts(); l != lookups || o != opens {
				t.Fatalf("breaker open: %d lookups and %d opens reached the store", l-lookups, o-opens)
			}
			// Expiry is exact on a grace record.
			clk.Advance(exp.Sub(clk.Now()))
			wantError(t, mustServe(t, h, url(held)), http.StatusNotFound, "sync.segment_expired")
			// One warning for the outage, none per request it answers.
			warns := 0
			for _, e := range logs.All() {
				if e.Level == zapcore.WarnLevel {
					warns++
					if !strings.Contains(e.Message, "segment store unreadable") && !strings.Contains(e.Message, "segment store fault") {
						t.Errorf("warning %q", e.Message)
					}
				}
			}
			if warns > 4 {
				t.Errorf("%d warnings: fast failures are logged one by one", warns)
			}
			if logs.FilterMessageSnippet("segment store unreadable").Len() != 1 {
				t.Errorf("the breaker's opening was not logged once")
			}
		})
	}
}

func mustServe(t *testing.T, h *Handler, url string) *httptest.ResponseRecorder {
	t.Helper()
	rec, _ := serve(t, h, http.MethodGet, url, nil)
	return rec
}

// TestRefusedTokenCostsFewReads: 100 sequential requests with one valid
// token that the record refuses (forbidden, expired, or no record at all)
// cost at most 5 store reads, however fast they come; with the memo's
// window passed, a refusal is read again.
func TestRefusedTokenCostsFewReads(t *testing.T) {
	for _, tc := range []struct {
		name, code string
		status     int
	}{
		{"scope", "sync.forbidden", 403},
		{"expired", "sync.segment_expired", 404},
		{"no record", "sync.not_found", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFakeStore()
			exp := testNow.Add(time.Hour)
			if tc.name == "expired" {
				exp = testNow.Add(-time.Second)
			}
			id := fs.add([]byte("a refused segment"), pub("p1", digestA, exp))
			sd := digestA
			if tc.name == "scope" {
				sd = digestB
			}
			if tc.name == "no record" {
				delete(fs.recs, id)
			}
			h, clk, _ := outageHandler(t, fs, 5*time.Minute)
			url := "/segments/" + id + "?st=" + mintToken(id, sd, "aud:p1", testNow.Add(time.Hour))
			for range 100 {
				wantError(t, mustServe(t, h, url), tc.status, tc.code)
				clk.Advance(time.Millisecond)
			}
			if l, _ := fs.counts(); l > 5 {
				t.Fatalf("100 refused requests: %d store reads, want at most 5", l)
			}
			before, _ := fs.counts()
			clk.Advance(store.RefusalWindow)
			wantError(t, mustServe(t, h, url), tc.status, tc.code)
			if l, _ := fs.counts(); l != before+1 {
				t.Fatalf("past the window: %d reads, want 1", l-before)
			}
		})
	}
}

// TestUnmarshalGrace: grace takes a duration, 0 turns it off, and a
// negative or missing one is refused.
func TestUnmarshalGrace(t *testing.T) {
	for in, want := range map[string]time.Duration{"grace 90s": 90 * time.Second, "grace 0": 0, "grace 1h": time.Hour} {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("syncular_segments {\n" + in + "\n}")); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if h.Grace == nil || time.Duration(*h.Grace) != want {
			t.Fatalf("%s: Grace %v", in, h.Grace)
		}
	}
	for _, in := range []string{"grace -1s", "grace", "grace 1s 2s", "grace soon", "grace 1s\ngrace 2s"} {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("syncular_segments {\n" + in + "\n}")); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
	h := &Handler{}
	if err := h.setDefaults(); err != nil || h.grace != defaultGrace {
		t.Fatalf("default grace %v, %v", h.grace, err)
	}
	neg := caddy.Duration(-time.Second)
	h = &Handler{Grace: &neg}
	if err := h.setDefaults(); err == nil {
		t.Fatal("negative grace in JSON accepted")
	}
}

// TestReloadDuringOutageLeavesNoProbe: with the SQLite file gone, a
// handler's breaker opens and its probe runs; a reload (a second handler on
// the same, shared handle, then the first one's Cleanup) ends the first
// probe, and the last Cleanup the second: no goroutine outlives its config.
func TestReloadDuringOutageLeavesNoProbe(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	before := runtime.NumGoroutine()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	off := "off"
	mk := func() *Handler {
		h := &Handler{Keys: []string{strongKey}, Audience: &AudienceConfig{Kind: "template", Template: "{partition}"},
			Store: &StoreConfig{Backend: "sqlite", Path: db}, Cache: &CacheConfig{Disk: off}}
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return h
	}
	old := mk()
	if err := os.Rename(db, db+".away"); err != nil {
		t.Fatal(err)
	}
	trip := func(h *Handler) {
		t.Helper()
		for i := range store.DefaultBreakerFailures {
			h.store.Lookup(context.Background(), idOf(fmt.Sprintf("sha256:%064x", i+1)))
		}
		if !h.store.BreakerOpen() {
			t.Fatal("breaker closed with the file gone")
		}
	}
	trip(old)
	neu := mk() // the pooled handle is shared: provision succeeds
	trip(neu)
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := neu.Cleanup(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after both cleanups, %d before", n, before)
	}
}
