package caddymodule

import (
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncular/caddy-syncular/store"
)

// TestScrapeCollectorFamilies: the one scrape-time collector describes
// what it collects (a pedantic registry checks Describe against Collect,
// and every family's help and labels), reports every family of the
// caches, disk tiers and flows, and counts a store shared by two
// handlers once.
func TestScrapeCollectorFamilies(t *testing.T) {
	c := newScrapeCollector("caddy_syncular_")
	st := store.NewCached(newFakeStore(), store.DefaultCacheOptions())
	defer st.Close()
	c.addCache(st, backendSQLite)
	c.addCache(st, backendSQLite) // a second handler on the same store
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(c); err == nil {
		t.Fatal("the collector registered twice in one registry")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		var labels []string
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			labels = append(labels, strings.Join(ls, ","))
		}
		sort.Strings(labels)
		got[strings.TrimPrefix(mf.GetName(), "caddy_syncular_")] = strings.Join(labels, " ")
	}
	want := map[string]string{
		"cache_hits_total":             "cache=bytes cache=grace cache=record cache=refusal",
		"cache_misses_total":           "cache=bytes cache=record",
		"cache_pass_through_total":     "",
		"cache_bytes":                  "",
		"cache_records":                "",
		"cache_evictions_total":        "cache=bytes cache=record",
		"cache_coalesced_waits_total":  "",
		"variants_total":               "result=incompressible result=made result=rejected",
		"store_breaker_open":           "",
		"store_breaker_trips_total":    "",
		"store_fast_failures_total":    "",
		"store_corrupt_backoffs_total": "",
		"disk_bytes":                   "",
		"disk_files":                   "",
		"disk_reserved_bytes":          "",
		"disk_hits_total":              "",
		"disk_fills_total":             "",
		"disk_followers_total":         "",
		"disk_fill_errors_total":       "",
		"disk_handoffs_total":          "",
		"disk_evictions_total":         "",
		"disk_discarded_total":         "",
		"disk_bypasses_total":          "reason=no_room reason=too_large reason=unavailable",
		"fills_in_flight":              "tier=disk tier=memory",
		"fill_followers":               "tier=disk tier=memory",
		"store_read_bytes_total":       "backend=s3 backend=sqlite",
		"store_reads_in_use":           "backend=s3 backend=sqlite",
		"store_reads_waiting":          "backend=s3 backend=sqlite",
		"store_reads_refused_total":    "backend=s3 backend=sqlite",
		"sqlite_record_reads_total":    "how=locked how=lockfree how=snapshot",
		"sqlite_fill_reads_total":      "how=locked how=lockfree",
	}
	for name, labels := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("family %s not collected", name)
		} else if g != labels {
			t.Errorf("family %s: series %q, want %q", name, g, labels)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected family %s", name)
		}
	}

	// Referenced twice, the store is reported until its last handler
	// leaves.
	c.removeCache(st)
	if n := countMembers(c); n != 1 {
		t.Fatalf("%d stores after one of two handlers left, want 1", n)
	}
	c.removeCache(st)
	if n := countMembers(c); n != 0 {
		t.Fatalf("%d stores after both left, want 0", n)
	}
}

func countMembers(c *scrapeCollector) int {
	n := 0
	c.caches.each(func(*store.Cached, string) { n++ })
	return n
}
