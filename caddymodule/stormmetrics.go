package caddymodule

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of a storm in progress: downloads in flight, the time to
// their first byte and their bytes by cache outcome, counted by the
// request path. The fills in flight, the requests following them and the
// segment bytes read from the store are read from the stores at scrape
// time (scrapemetrics.go).

// stormCollectors are the process's storm series (part of collectors).
type stormCollectors struct {
	inFlight   *prometheus.GaugeVec     // {server, delivery}
	firstByte  *prometheus.HistogramVec // {server, cache}
	cacheBytes *prometheus.CounterVec   // {server, cache}
}

func newStormCollectors(ns, sub string) *stormCollectors {
	return &stormCollectors{
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "downloads_in_flight",
			Help: "Granted downloads not finished yet (a stalled reader counts while it stalls), by server and the handler's delivery mode.",
		}, []string{"server", "delivery"}),
		firstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "first_byte_seconds",
			Help:    "Time from the request reaching the handler to its granted answer's status line, by cache outcome (memory, disk, fill, follower, stream, redirect, record).",
			Buckets: storeBuckets,
		}, []string{"server", "cache"}),
		cacheBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "bytes_served_by_cache_total",
			Help: "Segment body bytes the edge wrote without reading the store for them, by cache outcome (memory, disk: a hit; follower: a fill another request started). Fill and stream bytes are not counted: bytes_served_total less these is what this edge's own store reads served.",
		}, []string{"server", "cache"}),
	}
}

func (s *stormCollectors) all() []prometheus.Collector {
	return []prometheus.Collector{s.inFlight, s.firstByte, s.cacheBytes}
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
		if servedByCache(k) {
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

// servedByCache reports the outcomes whose bytes come from a cache and
// not from a store read of this request: bytes_served_by_cache_total's
// cache label. A redirect and a record answer write no body.
func servedByCache(k cacheKind) bool {
	return k == cacheMemory || k == cacheDisk || k == cacheFollower
}

// cacheBytes counts body bytes written under cache outcome k, when a
// cache served them (servedByCache).
func (m *handlerMetrics) cacheBytes(k cacheKind, n int64) {
	if m == nil || m.storm == nil || n <= 0 || k >= numCacheKinds {
		return
	}
	if c := m.storm.cacheBytes[k]; c != nil {
		c.Add(float64(n))
	}
}
