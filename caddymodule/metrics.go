package caddymodule

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncular/caddy-syncular/compress"
)

// Prometheus collectors of the module. They are built once per process
// and registered in the metrics registry of every config that provisions
// a handler (Caddy builds a new registry per config load), so counts
// survive reloads. Every series starts with caddy_syncular_. The
// per-request series carry the server label of Caddy's own HTTP metrics
// (the name of the http app's server: srv0, srv1... from a Caddyfile), so
// two sites do not merge into one series.
type collectors struct {
	requests      *prometheus.CounterVec   // {server, outcome, delivery}
	bytesServed   *prometheus.CounterVec   // {server, delivery}
	storeDuration *prometheus.HistogramVec // {server, backend, op}
	verifications *prometheus.CounterVec   // {server, slot}
	codedBytes    *prometheus.CounterVec   // {server, coding}
	grace         *prometheus.CounterVec   // {server, result}
	presignErrs   *prometheus.CounterVec   // {server}
	buildInfo     prometheus.Collector     // buildinfo.go

	scrape *scrapeCollector // scrapemetrics.go
	storm  *stormCollectors // stormmetrics.go
}

var (
	collectorsOnce sync.Once
	collectorsVal  *collectors
)

// storeBuckets span a local SQLite read (sub-millisecond) to a slow
// object store near the default store_timeout (5s).
var storeBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// moduleCollectors returns the process's collectors, building them on
// first use (construction only: registration happens in Provision).
func moduleCollectors() *collectors {
	collectorsOnce.Do(func() {
		const ns, sub = "caddy", "syncular"
		collectorsVal = &collectors{
			requests: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: ns, Subsystem: sub, Name: "requests_total",
				Help: "Requests the handler decided, by server, outcome (granted, not_modified, next, or the error code) and the handler's delivery mode (stream_legacy: a redirect handler streamed an object carrying a legacy record header).",
			}, []string{"server", "outcome", "delivery"}),
			bytesServed: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: ns, Subsystem: sub, Name: "bytes_served_total",
				Help: "Segment body bytes written by the edge (serve, proxy and stream_legacy delivery; redirects write none).",
			}, []string{"server", "delivery"}),
			storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
				Help:    "Latency of the segment store calls a request made (lookup: a record read; open: a fill or a stream until its first byte; presign: a redirect URL), failures included. A record from the record cache, a bytes hit and a wait on another request's read are not store calls and are not counted.",
				Buckets: storeBuckets,
			}, []string{"server", "backend", "op"}),
			verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: ns, Subsystem: sub, Name: "token_verifications_total",
				Help: "Tokens checked, by the 1-based slot of the configured key whose MAC matched (\"none\": no key matched or the token was malformed). Counted even when a later check refused the token.",
			}, []string{"server", "slot"}),
			codedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: ns, Subsystem: sub, Name: "coded_bytes_served_total",
				Help: "Segment body bytes written by the edge, by content coding (identity, gzip, zstd): the bytes on the wire of bytes_served_total.",
			}, []string{"server", "coding"}),
			grace: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: ns, Subsystem: sub, Name: "grace_requests_total",
				Help: "Requests decided on a record kept past record_ttl because the segment store could not be read (grace), by result: served (the bytes or a 304 from memory or the disk tier), unavailable (granted, but not served: the edge does not hold the bytes, or has no capacity now: 503), refused (the record refuses the token).",
			}, []string{"server", "result"}),
			presignErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: ns, Subsystem: sub, Name: "presign_errors_total",
				Help: "Redirect URLs a redirect handler could not sign (credentials not resolved, signer fault): each answered 503 edge.store_unavailable. A grant too short for any URL is streamed instead and not counted.",
			}, []string{"server"}),
			buildInfo: newBuildInfo(ns, sub),
			scrape:    newScrapeCollector(ns + "_" + sub + "_"),
			storm:     newStormCollectors(ns, sub),
		}
	})
	return collectorsVal
}

// all lists every collector for registration.
func (c *collectors) all() []prometheus.Collector {
	return append([]prometheus.Collector{
		c.requests, c.bytesServed, c.storeDuration, c.verifications, c.codedBytes, c.grace, c.presignErrs, c.buildInfo, c.scrape,
	}, c.storm.all()...)
}

// register adds the collectors to reg. A collector already registered
// (a second handler in the same config) is fine: it is this one.
func (c *collectors) register(reg prometheus.Registerer) error {
	for _, col := range c.all() {
		if err := reg.Register(col); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return err
		}
	}
	return nil
}

// Outcomes a handler can record, resolved to counters at provision so the
// request path only indexes a map.
var knownOutcomes = []string{
	outcomeGranted, outcomeNotModified, outcomeNext,
	errForbidden.code, errNotFound.code, errExpired.code, errInvalid.code, errMethod.code,
	errRange.code, errStoreDown.code, errStoreTimeout.code, errOverloaded.code,
}

// handlerMetrics are one handler's label children, resolved once. A nil
// *handlerMetrics (disable_metrics) records nothing.
type handlerMetrics struct {
	c           *collectors
	server      string
	delivery    string
	requests    map[string]prometheus.Counter
	granted     prometheus.Counter // requests[outcomeGranted], the common case, without the map lookup
	served      prometheus.Counter
	lookup      prometheus.Observer
	open        prometheus.Observer
	presign     prometheus.Observer   // nil unless the handler redirects
	presignErrs prometheus.Counter    // nil unless the handler redirects
	slots       []prometheus.Counter  // index: key slot (0-based)
	coded       [3]prometheus.Counter // index: compress.Coding
	noSlot      prometheus.Counter
	grace       [3]prometheus.Counter // index: graceServed, graceUnavailable, graceRefused
	// legacy counts requests a redirect handler streamed because the
	// object carries a legacy record header (delivery="stream_legacy");
	// nil when the handler never does.
	legacy *handlerMetrics
	// proxied counts requests a redirect handler streamed because the
	// grant was too short for any URL (delivery="proxy"); nil on the
	// other handlers.
	proxied *handlerMetrics
	storm   *stormMetrics // stormmetrics.go; nil on the legacy and proxied children
}

func newHandlerMetrics(c *collectors, server, backend, delivery string, keys int) *handlerMetrics {
	m := newLabelMetrics(c, server, backend, delivery, keys)
	if delivery != deliveryStreamLegacy {
		m.storm = newStormMetrics(c.storm, server, delivery)
	}
	return m
}

// newLabelMetrics is newHandlerMetrics without the storm metrics.
func newLabelMetrics(c *collectors, server, backend, delivery string, keys int) *handlerMetrics {
	m := &handlerMetrics{
		c:        c,
		server:   server,
		delivery: delivery,
		requests: make(map[string]prometheus.Counter, len(knownOutcomes)),
		served:   c.bytesServed.WithLabelValues(server, delivery),
		lookup:   c.storeDuration.WithLabelValues(server, backend, "lookup"),
		open:     c.storeDuration.WithLabelValues(server, backend, "open"),
		noSlot:   c.verifications.WithLabelValues(server, "none"),
	}
	if delivery == DeliveryRedirect { // only a redirect handler presigns
		m.presign = c.storeDuration.WithLabelValues(server, backend, "presign")
		m.presignErrs = c.presignErrs.WithLabelValues(server)
	}
	for _, o := range knownOutcomes {
		m.requests[o] = c.requests.WithLabelValues(server, o, delivery)
	}
	m.granted = m.requests[outcomeGranted]
	for i, r := range graceResults {
		m.grace[i] = c.grace.WithLabelValues(server, r)
	}
	for _, k := range []compress.Coding{compress.Identity, compress.Gzip, compress.Zstd} {
		m.coded[k] = c.codedBytes.WithLabelValues(server, k.String())
	}
	for i := range keys {
		m.slots = append(m.slots, c.verifications.WithLabelValues(server, strconv.Itoa(i+1)))
	}
	return m
}

// withLegacy resolves the delivery="stream_legacy" children for a redirect
// handler that streams objects carrying a legacy record header.
func (m *handlerMetrics) withLegacy(backend string, keys int) {
	if m != nil {
		m.legacy = newLabelMetrics(m.c, m.server, backend, deliveryStreamLegacy, keys)
	}
}

// withProxied resolves the delivery="proxy" children for a redirect
// handler, which streams the bytes when the grant is too short for a URL.
func (m *handlerMetrics) withProxied(backend string, keys int) {
	if m != nil {
		m.proxied = newLabelMetrics(m.c, m.server, backend, DeliveryProxy, keys)
	}
}

// via returns the metrics to count a request under, by its delivery
// label (respond.go): the stream_legacy or proxy children of a redirect
// handler when resolved, else m. Nil-safe, allocation-free.
func (m *handlerMetrics) via(delivery string) *handlerMetrics {
	switch {
	case m == nil || delivery == m.delivery:
	case delivery == deliveryStreamLegacy && m.legacy != nil:
		return m.legacy
	case delivery == DeliveryProxy && m.proxied != nil:
		return m.proxied
	}
	return m
}

// request counts one finished request.
func (m *handlerMetrics) request(outcome string) {
	if m == nil || outcome == "" {
		return
	}
	if outcome == outcomeGranted {
		m.granted.Inc()
		return
	}
	if ctr, ok := m.requests[outcome]; ok {
		ctr.Inc()
		return
	}
	m.c.requests.WithLabelValues(m.server, outcome, m.delivery).Inc()
}

// The result label of caddy_syncular_grace_requests_total.
const (
	graceServed = iota
	graceUnavailable
	graceRefused
)

var graceResults = [3]string{"served", "unavailable", "refused"}

// graceRequest counts a request decided on a grace record, by its outcome.
func (m *handlerMetrics) graceRequest(outcome string) {
	if m == nil {
		return
	}
	switch outcome {
	case outcomeGranted, outcomeNotModified:
		m.grace[graceServed].Inc()
	case errStoreDown.code, errStoreTimeout.code, errOverloaded.code:
		m.grace[graceUnavailable].Inc()
	default:
		m.grace[graceRefused].Inc()
	}
}

// verification counts a token check by the slot of the key that matched.
func (m *handlerMetrics) verification(slot int) {
	if m == nil {
		return
	}
	if slot >= 0 && slot < len(m.slots) {
		m.slots[slot].Inc()
		return
	}
	m.noSlot.Inc()
}

// storeOp records one store operation's latency under op.
func (m *handlerMetrics) storeOp(op storeOpKind, d time.Duration) {
	if m == nil {
		return
	}
	var o prometheus.Observer
	switch op {
	case opLookup:
		o = m.lookup
	case opOpen:
		o = m.open
	default:
		o = m.presign
	}
	if o != nil {
		o.Observe(d.Seconds())
	}
}

// presignError counts a redirect URL that could not be signed.
func (m *handlerMetrics) presignError() {
	if m != nil && m.presignErrs != nil {
		m.presignErrs.Inc()
	}
}

// storeOpKind is the op label of caddy_syncular_store_duration_seconds.
type storeOpKind uint8

const (
	opLookup storeOpKind = iota
	opOpen
	opPresign
)

// bytes counts body bytes written.
func (m *handlerMetrics) bytes(n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.served.Add(float64(n))
}

// codedBytes counts body bytes written with coding k.
func (m *handlerMetrics) codedBytes(k compress.Coding, n int64) {
	if m == nil || n <= 0 || int(k) >= len(m.coded) {
		return
	}
	m.coded[k].Add(float64(n))
}

// slotLabel is the metric label and placeholder value of a key slot:
// "1" for the first configured key, "none" when no key matched.
func slotLabel(slot int) string {
	if slot < 0 {
		return "none"
	}
	return strconv.Itoa(slot + 1)
}

// audHash returns a short keyed hash of an audience for log correlation:
// the first 8 hex digits of HMAC-SHA256(per-process random key, aud). It
// links log lines of one audience within a process without revealing it.
func audHash(aud string) string {
	audHashOnce.Do(func() {
		audHashKey = make([]byte, 32)
		if _, err := rand.Read(audHashKey); err != nil {
			audHashKey = nil
		}
	})
	if audHashKey == nil {
		return ""
	}
	m := hmac.New(sha256.New, audHashKey)
	m.Write([]byte(aud))
	var sum [sha256.Size]byte
	return hex.EncodeToString(m.Sum(sum[:0])[:4])
}

var (
	audHashOnce sync.Once
	audHashKey  []byte
)

// provisionMetrics registers the collectors in this config's registry and
// resolves the handler's label children, and reports the store and disk
// tier to syncular_health. With disable_metrics it does
// nothing and the request path records nothing.
func (h *Handler) provisionMetrics(ctx caddy.Context) error {
	h.joinHealth() // health.go: reported with metrics on or off
	if h.DisableMetrics {
		return nil
	}
	c := moduleCollectors()
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := c.register(reg); err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	h.metrics = newHandlerMetrics(c, serverName(ctx), h.Store.Backend, h.Delivery, len(h.Keys))
	if h.streamLegacy {
		h.metrics.withLegacy(h.Store.Backend, len(h.Keys))
	}
	if h.Delivery == DeliveryRedirect {
		h.metrics.withProxied(h.Store.Backend, len(h.Keys))
	}
	if h.store != nil {
		c.scrape.addCache(h.store, h.Store.Backend)
		h.scraped = h.store
	}
	if h.disk != nil {
		c.scrape.addDisk(h.disk)
		h.scrapedDisk = h.disk
	}
	return nil
}

// unknownServer is the server label outside an http app's server, the
// value Caddy's own HTTP metrics use in that case.
const unknownServer = "UNKNOWN"

// serverName is the name of the http app's server this handler belongs
// to. Caddy's metrics read it from each request's context; it is
// already in the provision context (the http app provisions every
// server's routes, error routes and named routes with the server under
// caddyhttp.ServerCtxKey, and a handler instance belongs to one server),
// so the label children are resolved here once and counting stays
// allocation-free.
func serverName(ctx caddy.Context) string {
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil && srv.Name() != "" {
		return srv.Name()
	}
	return unknownServer
}

// cleanupMetrics stops reporting the handler's cache and disk tier.
func (h *Handler) cleanupMetrics() {
	h.leaveHealth()
	if h.scraped != nil {
		moduleCollectors().scrape.removeCache(h.scraped)
		h.scraped = nil
	}
	if h.scrapedDisk != nil {
		moduleCollectors().scrape.removeDisk(h.scrapedDisk)
		h.scrapedDisk = nil
	}
}
