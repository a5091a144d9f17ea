package caddymodule

import (
	"sort"
	"strconv"
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
		"cache_hits_total":             "entry=bytes entry=grace entry=record entry=refusal",
		"cache_misses_total":           "entry=bytes entry=record",
		"cache_pass_through_total":     "",
		"cache_held_bytes":             "",
		"cache_held_records":           "",
		"cache_evictions_total":        "entry=bytes entry=record",
		"cache_coalesced_waits_total":  "",
		"variants_total":               "result=incompressible result=made result=rejected",
		"store_breaker_open":           "",
		"store_breaker_trips_total":    "",
		"store_fast_failures_total":    "",
		"store_corrupt_backoffs_total": "",
		// No disk tier: no disk series; a SQLite store only: no s3 series.
		"fills_in_flight":           "tier=memory",
		"fill_followers":            "tier=memory",
		"store_read_bytes_total":    "backend=sqlite",
		"store_reads_in_use":        "backend=sqlite",
		"store_reads_waiting":       "backend=sqlite",
		"store_reads_refused_total": "backend=sqlite",
		"sqlite_record_reads_total": "mode=locked mode=lockfree mode=snapshot",
		"sqlite_fill_reads_total":   "mode=locked mode=lockfree",
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

// TestScrapeCollectorPossibleSeries: the disk tier's series appear with a
// disk tier (usable, with its budget), the S3 faults with an S3 store,
// and the SQLite reads leave with the last SQLite store.
func TestScrapeCollectorPossibleSeries(t *testing.T) {
	c := newScrapeCollector("caddy_syncular_")
	st := store.NewCached(newFakeStore(), store.DefaultCacheOptions())
	defer st.Close()
	d, err := store.NewDiskTier(store.DiskOptions{Dir: t.TempDir(), MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c.addCache(st, backendS3)
	c.addDisk(d)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, mf := range mfs {
		name := strings.TrimPrefix(mf.GetName(), "caddy_syncular_")
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			got[name] = append(got[name], strings.Join(ls, ",")+"="+strconv.FormatFloat(v, 'g', -1, 64))
		}
		sort.Strings(got[name])
	}
	for name, want := range map[string]string{
		"disk_usable":            "=1",
		"disk_max_bytes":         "=1.048576e+06",
		"s3_errors_total":        "class=4xx=0 class=5xx=0 class=network=0 class=timeout=0",
		"store_read_bytes_total": "backend=s3=0",
		"fills_in_flight":        "tier=disk=0 tier=memory=0",
	} {
		if g := strings.Join(got[name], " "); g != want {
			t.Errorf("%s: %q, want %q", name, g, want)
		}
	}
	for _, name := range []string{"sqlite_record_reads_total", "sqlite_fill_reads_total"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s on an edge without a SQLite store", name)
		}
	}
}
