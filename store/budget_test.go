package store

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/compress"
)

// Several caches (several handlers, or a reload's old and new config)
// share one build budget: however many ask at once, no more builds run
// than compress.Builds has slots, and Stop ends the builds a cache
// started and waits for them.
func TestBuildBudgetSharedByCaches(t *testing.T) {
	const caches = 4
	var running, peak, ran atomic.Int64
	release := make(chan struct{})
	hold := func(compress.Coding, []byte) {
		ran.Add(1)
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		running.Add(-1)
	}
	var cs []*Cached
	var ids []string
	for i := range caches {
		c, id := cachedWith(t, DefaultCacheOptions(), rowsLike(32<<10, uint64(i)+100))
		c.vt.corrupt = hold
		cs = append(cs, c)
		ids = append(ids, id)
	}
	for wait := time.Now().Add(10 * time.Second); compress.Builds.InUse() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("%d build slots taken by earlier tests", compress.Builds.InUse())
		}
	}
	started := 0
	for i, c := range cs {
		for _, coding := range []compress.Coding{compress.Gzip, compress.Zstd} {
			if _, _, st := c.variant(idOf(ids[i]), coding); st == variantBuilding {
				started++
			}
		}
	}
	limit := max(1, runtime.GOMAXPROCS(0)/2) // compress.Builds' slots
	if started != limit {
		t.Fatalf("%d builds started by %d caches, want the budget's %d", started, caches, limit)
	}
	deadline := time.Now().Add(10 * time.Second)
	for running.Load() < int64(limit) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := compress.Builds.InUse(); got > limit || peak.Load() > int64(limit) {
		t.Fatalf("%d slots in use, %d builds at once, budget %d", got, peak.Load(), limit)
	}
	close(release)
	for _, c := range cs {
		c.Stop() // waits for its builds
	}
	if got := compress.Builds.InUse(); got != 0 {
		t.Fatalf("%d build slots still taken after Stop", got)
	}
	if peak.Load() > int64(limit) {
		t.Fatalf("%d builds ran at once, budget %d", peak.Load(), limit)
	}
	// A stopped cache starts no build.
	before := ran.Load()
	last := len(cs) - 1
	cs[last].variant(idOf(ids[last]), compress.Zstd)
	time.Sleep(20 * time.Millisecond)
	if ran.Load() != before || compress.Builds.InUse() != 0 {
		t.Fatal("a build started after Stop")
	}
}
