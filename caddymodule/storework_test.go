package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// tenantStore records the tenant of every store call (store.TenantOf) and
// holds lookups until released.
type tenantStore struct {
	*fakeStore
	mu      sync.Mutex
	tenants []string
	hold    chan struct{}
}

func (s *tenantStore) Lookup(ctx context.Context, pid segid.ID) (*store.Record, error) {
	id := pid.String()
	s.mu.Lock()
	s.tenants = append(s.tenants, store.TenantOf(ctx))
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.fakeStore.Lookup(ctx, idOf(id))
}

// TestStoreGateAnswersOverloaded: the verified audience reaches the store
// as the request's tenant; a distinct store read finding every slot of
// store_concurrency taken and no room in store_queue is answered 503
// edge.overloaded, retryable, with a jittered Retry-After, and the
// gate's counters are reported in the flow stats the metrics read.
func TestStoreGateAnswersOverloaded(t *testing.T) {
	fs := &tenantStore{fakeStore: newFakeStore(), hold: make(chan struct{})}
	exp := testNow.Add(time.Hour)
	a := fs.add([]byte("segment a of p1"), pub("p1", digestA, exp))
	b := fs.add([]byte("segment b of p2"), pub("p2", digestA, exp))
	spread := -1
	one, zero := 1, 0
	h := newTestHandler(t, nil, withJitter(func(n int) int { spread = n; return 2 }), func(h *Handler) {
		h.StoreConcurrency, h.StoreQueue = &one, &zero
	})
	opts := h.Cache.options(time.Duration(h.StoreTimeout), h.now)
	opts.Fair = h.fairOptions()
	c := store.NewCached(fs, opts)
	t.Cleanup(c.Stop)
	h.setStore(c)
	url := func(id, part string) string {
		return "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:"+part, testNow.Add(time.Minute))
	}

	done := make(chan int, 1)
	go func() {
		rec, _ := serve(t, h, http.MethodGet, url(a, "p1"), nil)
		done <- rec.Code
	}()
	waitUntil(t, "the first lookup holds the slot", func() bool { return c.Flow().Gate.InUse == 1 })
	rec, _ := serve(t, h, http.MethodGet, url(b, "p2"), nil)
	e := wantError(t, rec, http.StatusServiceUnavailable, "edge.overloaded")
	if !e.retryableTrue() || rec.Header().Get("Retry-After") != "3" || spread != overloadRetrySpread {
		t.Fatalf("overloaded answer: retryable %v, Retry-After %q, jitter over %d", e.Retryable, rec.Header().Get("Retry-After"), spread)
	}
	if strings.Contains(rec.Body.String(), "p2") {
		t.Fatalf("the refusal names the partition: %s", rec.Body.String())
	}
	close(fs.hold)
	if code := <-done; code != 200 {
		t.Fatalf("the admitted request: %d", code)
	}
	if g := c.Flow().Gate; g.InUse != 0 || g.Waiting != 0 || g.Refused != 1 {
		t.Fatalf("gate after the requests: %+v", g)
	}
	fs.mu.Lock()
	got := fmt.Sprint(fs.tenants)
	fs.mu.Unlock()
	if got != "[aud:p1]" {
		t.Fatalf("tenants seen by the store %s, want [aud:p1] (the refused read never reached it)", got)
	}

	// The metrics: no tenant label, the refusal counted under the backend.
	fc := newScrapeCollector("t_")
	fc.addCache(c, backendSQLite)
	ch := make(chan prometheus.Metric, 64)
	fc.Collect(ch)
	close(ch)
	seen := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		desc := m.Desc().String()
		if !strings.Contains(desc, "store_reads_") {
			continue
		}
		if len(d.Label) != 1 || d.Label[0].GetName() != "backend" {
			t.Fatalf("%s: labels %v, want backend only", desc, d.Label)
		}
		name := desc[strings.Index(desc, "t_store_reads_"):]
		name = name[:strings.IndexByte(name, '"')]
		seen[name+"/"+d.Label[0].GetValue()] = metricValue(m)
	}
	want := map[string]float64{
		"t_store_reads_in_use/sqlite": 0, "t_store_reads_waiting/sqlite": 0, "t_store_reads_refused_total/sqlite": 1,
		// No S3 store in this process: no s3 series.
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("gate series %v, want %v", seen, want)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
