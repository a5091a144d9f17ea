package caddymodule

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncular/caddy-syncular/store"
)

// The metrics of a storm in progress: downloads in flight, the time to
// their first byte and their bytes by cache outcome (counted by the
// request path), and, read from the stores at scrape time, the fills in
// flight, the requests following them and the segment bytes read from
// the store.

// stormCollectors are the process's storm series (part of collectors).
type stormCollectors struct {
	inFlight   *prometheus.GaugeVec     // {server, delivery}
	firstByte  *prometheus.HistogramVec // {server, cache}
	cacheBytes *prometheus.CounterVec   // {server, cache}
	flows      *flowCollector
}

func newStormCollectors(ns, sub string) *stormCollectors {
	return &stormCollectors{
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "in_flight",
			Help: "Granted downloads not finished yet (a stalled reader counts while it stalls), by server and the handler's delivery mode.",
		}, []string{"server", "delivery"}),
		firstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "first_byte_seconds",
			Help:    "Time from the request reaching the handler to its granted answer's status line, by cache outcome (memory, disk, fill, follower, stream, redirect, record).",
			Buckets: storeBuckets,
		}, []string{"server", "cache"}),
		cacheBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cache_bytes_served_total",
			Help: "Segment body bytes written by the edge, by cache outcome (memory, disk, fill, follower, stream): bytes_served_total split by where they came from.",
		}, []string{"server", "cache"}),
		flows: newFlowCollector(ns + "_" + sub + "_"),
	}
}

func (s *stormCollectors) all() []prometheus.Collector {
	return []prometheus.Collector{s.inFlight, s.firstByte, s.cacheBytes, s.flows}
}

// stormMetrics are one handler's storm children, resolved once.
type stormMetrics struct {
	inFlight   prometheus.Gauge
	firstByte  [numCacheKinds]prometheus.Observer
	cacheBytes [numCacheKinds]prometheus.Counter
}

func newStormMetrics(s *stormCollectors, server, delivery string) *stormMetrics {
	m := &stormMetrics{inFlight: s.inFlight.WithLabelValues(server, delivery)}
	for k := cacheMemory; k < numCacheKinds; k++ {
		m.firstByte[k] = s.firstByte.WithLabelValues(server, cacheNames[k])
		if k != cacheRedirect && k != cacheRecord { // they write no body
			m.cacheBytes[k] = s.cacheBytes.WithLabelValues(server, cacheNames[k])
		}
	}
	return m
}

// enterDelivery counts a granted download in flight; it reports whether
// it did (leaveDelivery then uncounts it).
func (m *handlerMetrics) enterDelivery() bool {
	if m == nil || m.storm == nil {
		return false
	}
	m.storm.inFlight.Inc()
	return true
}

func (m *handlerMetrics) leaveDelivery() {
	if m != nil && m.storm != nil {
		m.storm.inFlight.Dec()
	}
}

// firstByte records the wait for a granted answer's status line.
func (m *handlerMetrics) firstByte(k cacheKind, d time.Duration) {
	if m == nil || m.storm == nil || k == cacheNone || k >= numCacheKinds {
		return
	}
	m.storm.firstByte[k].Observe(d.Seconds())
}

// cacheBytes counts body bytes written under cache outcome k.
func (m *handlerMetrics) cacheBytes(k cacheKind, n int64) {
	if m == nil || m.storm == nil || n <= 0 || k >= numCacheKinds {
		return
	}
	if c := m.storm.cacheBytes[k]; c != nil {
		c.Add(float64(n))
	}
}

// flowStatser is a store that reports its fills and store reads
// (store.Cached).
type flowStatser interface{ Flow() store.FlowStats }

// flowCollector reports, at scrape time, the fills in flight and the
// requests following them in every live cache and disk tier, and the
// segment bytes each cache read from its store, by backend.
type flowCollector struct {
	fills, followers, readBytes *prometheus.Desc
	// The store read gate (store_concurrency): slots in use, reads
	// waiting, reads refused.
	gateInUse, gateWaiting, gateRefused *prometheus.Desc

	caches refSet[flowStatser, string] // the value: the store's backend
	disks  refSet[*store.DiskTier, struct{}]
}

func newFlowCollector(prefix string) *flowCollector {
	return &flowCollector{
		fills: prometheus.NewDesc(prefix+"fills_in_flight",
			"Store reads filling a tier now, by tier (memory: the bytes cache; disk: the disk tier).", []string{"tier"}, nil),
		followers: prometheus.NewDesc(prefix+"fill_followers",
			"Requests attached now to a fill another request started, by tier (memory: waiting for the fill; disk: reading the fill as it lands).", []string{"tier"}, nil),
		readBytes: prometheus.NewDesc(prefix+"store_read_bytes_total",
			"Segment bytes read from the store (memory and disk fills, streamed bodies; records not counted), by backend: the store's egress.", []string{"backend"}, nil),
		gateInUse: prometheus.NewDesc(prefix+"store_reads_in_use",
			"Distinct store reads (record lookups, memory and disk fills) holding a slot of store_concurrency now, by backend.", []string{"backend"}, nil),
		gateWaiting: prometheus.NewDesc(prefix+"store_reads_waiting",
			"Store reads waiting for a slot of store_concurrency now (in store_queue), by backend.", []string{"backend"}, nil),
		gateRefused: prometheus.NewDesc(prefix+"store_reads_refused_total",
			"Store reads refused for want of a slot (store_queue full, or store_queue_wait passed): their requests were answered 503 edge.overloaded, by backend.", []string{"backend"}, nil),
	}
}

func (c *flowCollector) addCache(s flowStatser, backend string) { c.caches.add(s, backend) }
func (c *flowCollector) removeCache(s flowStatser)              { c.caches.remove(s) }
func (c *flowCollector) addDisk(d *store.DiskTier)              { c.disks.add(d, struct{}{}) }
func (c *flowCollector) removeDisk(d *store.DiskTier)           { c.disks.remove(d) }

func (c *flowCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.fills
	ch <- c.followers
	ch <- c.readBytes
	ch <- c.gateInUse
	ch <- c.gateWaiting
	ch <- c.gateRefused
}

func (c *flowCollector) Collect(ch chan<- prometheus.Metric) {
	var memFills, memWaiting, diskFills, diskFollowing int64
	read := map[string]int64{backendSQLite: 0, backendS3: 0}
	inUse := map[string]int64{backendSQLite: 0, backendS3: 0}
	waiting := map[string]int64{backendSQLite: 0, backendS3: 0}
	refused := map[string]int64{backendSQLite: 0, backendS3: 0}
	c.caches.each(func(s flowStatser, backend string) {
		f := s.Flow()
		memFills += f.MemoryFills
		memWaiting += f.MemoryWaiting
		read[backend] += f.StoreReadBytes
		inUse[backend] += f.Gate.InUse
		waiting[backend] += f.Gate.Waiting
		refused[backend] += f.Gate.Refused
	})
	c.disks.each(func(d *store.DiskTier, _ struct{}) {
		st := d.Stats()
		diskFills += st.FillsInFlight
		diskFollowing += st.Following
	})
	gauge := func(d *prometheus.Desc, v int64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), label)
	}
	gauge(c.fills, memFills, "memory")
	gauge(c.fills, diskFills, "disk")
	gauge(c.followers, memWaiting, "memory")
	gauge(c.followers, diskFollowing, "disk")
	for b, v := range read {
		ch <- prometheus.MustNewConstMetric(c.readBytes, prometheus.CounterValue, float64(v), b)
		gauge(c.gateInUse, inUse[b], b)
		gauge(c.gateWaiting, waiting[b], b)
		ch <- prometheus.MustNewConstMetric(c.gateRefused, prometheus.CounterValue, float64(refused[b]), b)
	}
}

// provisionFlows reports the handler's cache and disk tier in the flow
// series (called by provisionMetrics).
func (h *Handler) provisionFlows(c *collectors) {
	if fs, ok := h.store.(flowStatser); ok && h.Store != nil {
		c.storm.flows.addCache(fs, h.Store.Backend)
		h.obs.flowCache = fs
	}
	if h.disk != nil {
		c.storm.flows.addDisk(h.disk)
		h.obs.flowDisk = h.disk
	}
}

// cleanupFlows stops reporting them (called by cleanupMetrics).
func (h *Handler) cleanupFlows() {
	if h.obs.flowCache != nil {
		moduleCollectors().storm.flows.removeCache(h.obs.flowCache)
		h.obs.flowCache = nil
	}
	if h.obs.flowDisk != nil {
		moduleCollectors().storm.flows.removeDisk(h.obs.flowDisk)
		h.obs.flowDisk = nil
	}
}

// Interface guards
var (
	_ prometheus.Collector = (*flowCollector)(nil)
	_ flowStatser          = (*store.Cached)(nil)
)
