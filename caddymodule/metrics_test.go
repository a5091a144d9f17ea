package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// metricValue reads a counter or gauge.
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// requestsOf and slotsOf read one series of the module's collectors
// (they are per process, so tests compare differences), for handlers
// provisioned outside an http app's server.
func requestsOf(outcome, delivery string) float64 {
	return requestsOn(unknownServer, outcome, delivery)
}

func requestsOn(server, outcome, delivery string) float64 {
	return metricValue(moduleCollectors().requests.WithLabelValues(server, outcome, delivery))
}

func slotsOf(slot string) float64 {
	return metricValue(moduleCollectors().verifications.WithLabelValues(unknownServer, slot))
}

func TestMetricsCountDecisions(t *testing.T) {
	fs := newFakeStore()
	body := []byte("SSG2 metrics segment body")
	id := fs.add(body, store.Publication{Partition: "p1", ScopeDigest: digestA, ExpiresAtMs: testNow.UnixMilli() + 3600_000})
	old := []byte("edge-old-key/0123456789abcdef")
	h := newTestHandler(t, fs, func(h *Handler) { h.Keys = []string{string(testKey), string(old)} })
	useMetrics(h, unknownServer)
	logs := observeLogs(h)

	exp := testNow.Unix() + 600
	good := token.Sign(testKey, id, digestA, "aud:p1", exp)
	oldKey := token.Sign(old, id, digestA, "aud:p1", exp)
	expired := token.Sign(testKey, id, digestA, "aud:p1", testNow.Unix()-120)
	badMAC := token.Sign([]byte("unknown"), id, digestA, "aud:p1", exp)
	wrongAud := token.Sign(old, id, digestA, "aud:p2", exp)

	before := map[string]float64{}
	for _, o := range []string{"granted", "sync.forbidden", "next", "not_modified"} {
		before[o] = requestsOf(o, "serve")
	}
	slot1, slot2, none := slotsOf("1"), slotsOf("2"), slotsOf("none")
	served := metricValue(moduleCollectors().bytesServed.WithLabelValues(unknownServer, "serve"))

	for _, tok := range []string{good, good, oldKey, expired, badMAC, wrongAud} {
		serve(t, h, "GET", "/segments/"+id+"?st="+tok, nil)
	}
	serve(t, h, "GET", "/segments/"+id, nil) // no st: next
	rec, repl := serve(t, h, "GET", "/segments/"+id+"?st="+good, map[string]string{"If-None-Match": `"` + id + `"`})
	if rec.Code != 304 {
		t.Fatalf("If-None-Match: %d", rec.Code)
	}
	if v, _ := repl.Get("http.syncular.key_slot"); v != "1" {
		t.Fatalf("key_slot placeholder %v, want 1", v)
	}
	_, repl = serve(t, h, "GET", "/segments/"+id+"?st="+badMAC, nil)
	if v, _ := repl.Get("http.syncular.key_slot"); v != "none" {
		t.Fatalf("key_slot placeholder %v, want none", v)
	}

	for o, want := range map[string]float64{"granted": 3, "sync.forbidden": 4, "next": 1, "not_modified": 1} {
		if got := requestsOf(o, "serve") - before[o]; got != want {
			t.Errorf("requests_total{outcome=%q} +%v, want +%v", o, got, want)
		}
	}
	// good x3 (incl. 304) and expired: slot 1; oldKey and wrongAud: slot
	// 2 (the MAC verified, a later check refused wrongAud); badMAC x2: none.
	if d := slotsOf("1") - slot1; d != 4 {
		t.Errorf("slot 1 +%v, want +4", d)
	}
	if d := slotsOf("2") - slot2; d != 2 {
		t.Errorf("slot 2 +%v, want +2", d)
	}
	if d := slotsOf("none") - none; d != 2 {
		t.Errorf("slot none +%v, want +2", d)
	}
	if d := metricValue(moduleCollectors().bytesServed.WithLabelValues(unknownServer, "serve")) - served; d != float64(3*len(body)) {
		t.Errorf("bytes_served_total +%v, want %d", d, 3*len(body))
	}

	// One debug line per decision, with the documented fields and
	// nothing secret.
	entries := logs.FilterMessage("segment decision").All()
	if len(entries) != 9 {
		t.Fatalf("%d decision lines for 9 requests", len(entries))
	}
	var slots, outcomes []string
	for i, e := range entries {
		f := e.ContextMap()
		for _, k := range []string{"segment_id", "outcome", "reason", "key_slot", "delivery", "store_ms", "aud_hash"} {
			if _, ok := f[k]; !ok {
				t.Errorf("decision line lacks %s: %v", k, f)
			}
		}
		slots = append(slots, f["key_slot"].(string))
		outcomes = append(outcomes, f["outcome"].(string))
		// aud_hash once the token verified (granted, 304, wrong audience).
		verified := i <= 2 || i == 5 || i == 7
		if h := f["aud_hash"].(string); verified != (len(h) == 8) {
			t.Errorf("line %d: aud_hash %q", i, h)
		}
	}
	if got := strings.Join(slots, ","); got != "1,1,2,1,none,2,none,1,none" {
		t.Errorf("key slots %s", got)
	}
	if got := strings.Join(outcomes, ","); got != "granted,granted,granted,sync.forbidden,sync.forbidden,sync.forbidden,next,not_modified,sync.forbidden" {
		t.Errorf("outcomes %s", got)
	}
	if r := entries[3].ContextMap()["reason"]; r != "segment token rejected: token expired" {
		t.Errorf("expired reason %v", r)
	}
	all := ""
	for _, e := range logs.All() {
		all += e.Message
		for k, v := range e.ContextMap() {
			all += " " + k + "=" + toString(v)
		}
	}
	checkNoSecret(t, all, good, oldKey, expired, badMAC, wrongAud, string(testKey), string(old), "aud:p1", "aud:p2", `"p1"`)
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

func checkNoSecret(t *testing.T, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("log contains secret %.12q...", s)
		}
		if _, mac, ok := strings.Cut(s, "."); ok && len(mac) > 20 && strings.Contains(text, mac) {
			t.Errorf("log contains a token MAC")
		}
	}
}

func TestMetricsRegistration(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	c := moduleCollectors()
	// Twice in one registry (two handlers in one config), and again in a
	// fresh registry (a reload): never an error.
	for range 2 {
		if err := c.register(ctx.GetMetricsRegistry()); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.register(prometheus.NewPedanticRegistry()); err != nil {
		t.Fatal(err)
	}
	// A foreign collector with one of our names is a real conflict.
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "caddy_syncular_requests_total", Help: "x"}))
	if err := c.register(reg); err == nil {
		t.Fatal("conflicting collector accepted")
	}
	mfs, err := ctx.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"caddy_syncular_cache_hits_total", "caddy_syncular_cache_held_bytes",
		"caddy_syncular_cache_evictions_total", "caddy_syncular_cache_coalesced_waits_total"} {
		if !names[n] {
			t.Errorf("%s not gathered", n)
		}
	}
}

func TestMetricsDisabled(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), store.Publication{Partition: "p1", ScopeDigest: digestA, ExpiresAtMs: testNow.UnixMilli() + 3600_000})
	h := newTestHandler(t, fs, func(h *Handler) { h.DisableMetrics = true })
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.provisionMetrics(ctx); err != nil || h.metrics != nil {
		t.Fatalf("disabled: %v %v", err, h.metrics)
	}
	before := requestsOf("granted", "serve")
	rec, _ := serve(t, h, "GET", "/segments/"+id+"?st="+token.Sign(testKey, id, digestA, "aud:p1", testNow.Unix()+60), nil)
	if rec.Code != 200 || requestsOf("granted", "serve") != before {
		t.Fatalf("disabled metrics counted: %d", rec.Code)
	}
	mfs, _ := ctx.GetMetricsRegistry().Gather()
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "caddy_syncular_") {
			t.Fatalf("%s registered with disable_metrics", mf.GetName())
		}
	}
}

// The request path resolves label children at provision: counting does
// not allocate.
func TestMetricsNoAllocs(t *testing.T) {
	m := newHandlerMetrics(moduleCollectors(), "srv-alloc", "s3", "redirect", 2)
	m.withLegacy("s3", 2)
	if n := testing.AllocsPerRun(100, func() {
		m.request("sync.forbidden")
		m.request(outcomeGranted)
		m.verification(1)
		m.verification(-1)
		m.storeOp(opLookup, 1234)
		m.bytes(100)
		m.via(deliveryStreamLegacy).request(outcomeGranted)
		m.via(deliveryStreamLegacy).bytes(100)
		m.via(DeliveryRedirect).request(outcomeGranted)
	}); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}

func TestCaddyfileOperationsOptions(t *testing.T) {
	for _, tc := range []struct {
		in      string
		disable bool
		verify  *bool
		err     string
	}{
		{"syncular_segments {\n key k\n disable_metrics\n verify_store_on_start false\n}", true, new(false), ""},
		{"syncular_segments {\n key k\n verify_store_on_start true\n}", false, new(true), ""},
		{"syncular_segments {\n key k\n}", false, nil, ""},
		{"syncular_segments {\n disable_metrics yes\n}", false, nil, "wrong argument count"},
		{"syncular_segments {\n verify_store_on_start\n}", false, nil, "wrong argument count"},
		{"syncular_segments {\n verify_store_on_start maybe\n}", false, nil, `not "maybe", at Testfile:2`},
		{"syncular_segments {\n disable_metrics\n disable_metrics\n}", false, nil, "specified more than once"},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || h.DisableMetrics != tc.disable || (h.VerifyStoreOnStart == nil) != (tc.verify == nil) ||
			(tc.verify != nil && *h.VerifyStoreOnStart != *tc.verify) {
			t.Errorf("%q: %v disable=%v verify=%v", tc.in, err, h.DisableMetrics, h.VerifyStoreOnStart)
		}
	}
}

// Two servers of one config each get their own server label, taken
// from the http app at provision: the children exist (at zero) as soon
// as the config is provisioned, one set per server.
func TestMetricsServerLabelFromConfig(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	db := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	handler := fmt.Sprintf(`{"handler":"syncular_segments","keys":["%s"],"audience":{"kind":"template","template":"aud:{partition}"},"store":{"backend":"sqlite","path":%q},"delivery":"serve"}`, strings.Repeat("k", 32), db)
	server := func(port int) string {
		return fmt.Sprintf(`{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s]}]}`, port, handler)
	}
	// Names no other test uses, so the children seen are this config's.
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"apps":{"http":{"servers":{"metrics-site-a":%s,"metrics-site-b":%s}}}}`, server(1), server(2))
	var c caddy.Config
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&c); err != nil {
		t.Fatal(err)
	}
	servers := map[string]bool{}
	ch := make(chan prometheus.Metric, 1024)
	go func() { moduleCollectors().requests.Collect(ch); close(ch) }()
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "server" && strings.HasPrefix(l.GetValue(), "metrics-site-") {
				servers[l.GetValue()] = true
			}
		}
	}
	if len(servers) != 2 || !servers["metrics-site-a"] || !servers["metrics-site-b"] {
		t.Fatalf("server labels %v, want metrics-site-a and metrics-site-b", servers)
	}

	// Outside an http app (no server in the context): Caddy's UNKNOWN.
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if got := serverName(ctx); got != unknownServer {
		t.Fatalf("server outside an http app %q, want %q", got, unknownServer)
	}
}

// Requests through handlers of two servers count apart.
func TestMetricsServerLabelCountsApart(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("SSG2 two sites"), store.Publication{Partition: "p1", ScopeDigest: digestA, ExpiresAtMs: testNow.UnixMilli() + 3600_000})
	sites := map[string]*Handler{}
	for _, name := range []string{"count-site-a", "count-site-b"} {
		h := newTestHandler(t, fs, nil)
		useMetrics(h, name)
		sites[name] = h
	}
	aBefore, bBefore := requestsOn("count-site-a", "granted", "serve"), requestsOn("count-site-b", "granted", "serve")
	tok := token.Sign(testKey, id, digestA, "aud:p1", testNow.Unix()+600)
	for range 3 {
		serve(t, sites["count-site-a"], "GET", "/segments/"+id+"?st="+tok, nil)
	}
	serve(t, sites["count-site-b"], "GET", "/segments/"+id+"?st="+tok, nil)
	if a, b := requestsOn("count-site-a", "granted", "serve")-aBefore, requestsOn("count-site-b", "granted", "serve")-bBefore; a != 3 || b != 1 {
		t.Fatalf("granted: site a +%v, site b +%v, want +3 and +1", a, b)
	}
}

// TestMetricsGrantedPreResolved: the granted outcome, counted through the
// child resolved at provision time, moves exactly its own series
// (requests_total{outcome="granted"} under the request's delivery) on a
// redirect handler and its stream_legacy and proxy children.
func TestMetricsGrantedPreResolved(t *testing.T) {
	const server = "granted_pre_resolved"
	m := newHandlerMetrics(moduleCollectors(), server, "s3", DeliveryRedirect, 1)
	m.withLegacy("s3", 1)
	m.withProxied("s3", 1)
	for _, delivery := range []string{DeliveryRedirect, deliveryStreamLegacy, DeliveryProxy} {
		before := map[string]float64{}
		for _, o := range knownOutcomes {
			before[o] = requestsOn(server, o, delivery)
		}
		m.via(delivery).request(outcomeGranted)
		for _, o := range knownOutcomes {
			want := before[o]
			if o == outcomeGranted {
				want++
			}
			if got := requestsOn(server, o, delivery); got != want {
				t.Errorf("%s, outcome %s: %v, want %v", delivery, o, got, want)
			}
		}
	}
}
