package caddymodule

import (
	"math"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
)

// The hooks of a test handler: what no configuration sets (a clock,
// randomness, short keys, an observed logger) and what Provision would
// resolve from a Caddy context (metrics, a presigner). Test code sets a
// handler's unexported fields only here and in newTestHandler.

// testOption configures a test handler before its defaults are applied
// (newTestHandler, testHooks). A func(*Handler) that sets configuration
// fields is one too.
type testOption = func(*Handler)

// withClock injects the handler's clock.
func withClock(now func() time.Time) testOption { return func(h *Handler) { h.now = now } }

// withJitter injects the randomness of the Retry-After of refused answers.
func withJitter(j func(n int) int) testOption { return func(h *Handler) { h.jitter = j } }

// withWeakKeys lets the handler take keys shorter than provision accepts
// (the protocol vectors' keys; the verifier itself takes any non-empty
// key).
func withWeakKeys() testOption { return func(h *Handler) { h.weakKeysOK = true } }

// testHooks applies opts to a handler that a test then provisions itself.
func testHooks(h *Handler, opts ...testOption) *Handler {
	for _, o := range opts {
		if o != nil {
			o(h)
		}
	}
	return h
}

// observeLogs sends the handler's logs, debug level up, to the returned
// observer.
func observeLogs(h *Handler) *observer.ObservedLogs {
	core, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(core)
	return logs
}

// useMetrics turns on the module's metrics for the handler under the
// server label server, as Provision does in a Caddy context; the
// returned function turns them off again.
func useMetrics(h *Handler, server string) (off func()) {
	h.metrics = newHandlerMetrics(moduleCollectors(), server, h.Store.Backend, h.Delivery, len(h.Keys))
	return func() { h.metrics = nil }
}

// usePresigner gives a redirect handler the presigner provisionS3 builds
// over s.
func usePresigner(tb testing.TB, h *Handler, s *s3.Store) {
	tb.Helper()
	p, err := presign.NewS3Signer(s.Client(), s.Bucket(), s.ObjectKey, presign.S3Options{TTL: time.Duration(h.PresignTTL)})
	if err != nil {
		tb.Fatal(err)
	}
	h.presigner = p
}

// setSlotWait sets how long an answer past the SQLite stream cap waits
// for a slot.
func setSlotWait(h *Handler, d time.Duration) { h.slotWait = d }

// setBareStore puts a cache that keeps nothing in front of st (a fake, or
// a backend a test reads directly), so the handler holds the
// *store.Cached it always has while every request still reaches st: no
// record or bytes kept, no breaker that trips on a fake's faults, no
// corrupt-bytes backoff, no refusal memo, each read bounded by
// store_timeout. A bare store keeps no variants either: compression off.
func (h *Handler) setBareStore(st store.Store) {
	h.setStore(store.NewCached(st, store.CacheOptions{
		Timeout:         time.Duration(h.StoreTimeout),
		Now:             h.now,
		BreakerFailures: math.MaxInt32,
		CorruptBackoff:  time.Nanosecond,
	}))
	h.codings = nil
}

// setAnyStore is setStore for a cache and setBareStore for anything else.
func (h *Handler) setAnyStore(st store.Store) {
	if c, ok := st.(*store.Cached); ok {
		h.setStore(c)
		return
	}
	h.setBareStore(st)
}

// setValidatingOnly makes Provision behave as under `caddy validate` (or
// not) for the rest of the test.
func setValidatingOnly(t *testing.T, v bool) {
	t.Helper()
	old := validatingOnly
	validatingOnly = func() bool { return v }
	t.Cleanup(func() { validatingOnly = old })
}
