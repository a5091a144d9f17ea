package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// TestClockGovernsTokenExpiry: a handler reads the wall clock once per
// request and judges the token at that reading, but only when its clock
// is the wall clock: an injected clock still decides expiry.
func TestClockGovernsTokenExpiry(t *testing.T) {
	t.Run("injected", func(t *testing.T) {
		fs := newFakeStore()
		id := fs.add([]byte("injected clock"), pub("p1", digestA, testNow.Add(time.Hour)))
		now := testNow
		h := newTestHandler(t, fs, withClock(func() time.Time { return now }))
		if h.wallClock {
			t.Fatal("an injected clock is taken for the wall clock")
		}
		// Long expired by the wall clock, good by the injected one.
		target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
		if rec, _ := serve(t, h, http.MethodGet, target, nil); rec.Code != http.StatusOK {
			t.Fatalf("status %d at the injected clock: %s", rec.Code, rec.Body.String())
		}
		now = testNow.Add(10*time.Minute + time.Duration(h.skew) + time.Second)
		rec, _ := serve(t, h, http.MethodGet, target, nil)
		if b := wantError(t, rec, http.StatusForbidden, "sync.forbidden"); b.Message != "segment token rejected: token expired" {
			t.Errorf("message %q", b.Message)
		}
	})
	t.Run("wall", func(t *testing.T) {
		fs := newFakeStore()
		wall := time.Now()
		id := fs.add([]byte("wall clock"), pub("p1", digestA, wall.Add(time.Hour)))
		h := newTestHandler(t, fs, func(h *Handler) { h.now = nil }) // setDefaults: the wall clock
		if !h.wallClock {
			t.Fatal("the default clock is not marked as the wall clock")
		}
		good := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", wall.Add(10*time.Minute))
		if rec, _ := serve(t, h, http.MethodGet, good, nil); rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
		old := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", wall.Add(-time.Duration(h.skew)-time.Minute))
		rec, _ := serve(t, h, http.MethodGet, old, nil)
		wantError(t, rec, http.StatusForbidden, "sync.forbidden")
	})
}

// TestClockStepsOrdered: with one clock reading per step boundary, a
// traced request's spans still follow one another, each with a length,
// and the store and first-byte latencies are observed above zero.
func TestClockStepsOrdered(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("timed steps"), pub("p1", digestA, testNow.Add(time.Hour)))
	fs.delay = time.Millisecond // each store call takes a while
	h := newTestHandler(t, fs)
	const server = "clock_steps"
	defer useMetrics(h, server)()

	tp := &recTracerProvider{}
	req := httptest.NewRequest(http.MethodGet, "/sync/segments/"+id+"?st="+mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute)), nil)
	repl := caddyhttp.NewTestReplacer(req)
	ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
	ctx = trace.ContextWithSpan(ctx, recSpan{tp: tp})
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req.WithContext(ctx), nextHandler); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("status %d, %v", rec.Code, err)
	}

	order := []string{"syncular.verify", "syncular.lookup", "syncular.open", "syncular.write"}
	spans := tp.byName()
	var prev recordedSpan
	for i, name := range order {
		s, ok := spans[name]
		if !ok {
			t.Fatalf("no %s span (have %v)", name, spans)
		}
		if !s.end.After(s.start) && name != "syncular.verify" && name != "syncular.write" {
			t.Errorf("%s: %v to %v, no length", name, s.start, s.end)
		}
		if s.end.Before(s.start) {
			t.Errorf("%s ends before it starts", name)
		}
		if i > 0 && s.start.Before(prev.end) {
			t.Errorf("%s starts at %v, before %s ends at %v", name, s.start, order[i-1], prev.end)
		}
		prev = s
	}

	var firstByte, store float64
	c := moduleCollectors()
	for _, k := range cacheNames {
		firstByte += histogramSum(t, c.storm.firstByte.WithLabelValues(server, k))
	}
	for _, op := range []string{"lookup", "open"} {
		s := histogramSum(t, c.storeDuration.WithLabelValues(server, h.Store.Backend, op))
		if s < time.Millisecond.Seconds() {
			t.Errorf("store %s latency %gs, below the store's delay", op, s)
		}
		store += s
	}
	if firstByte < store {
		t.Errorf("first byte after %gs, before the store calls' %gs", firstByte, store)
	}
}

func histogramSum(t *testing.T, o interface{}) float64 {
	t.Helper()
	m, ok := o.(interface{ Write(*dto.Metric) error })
	if !ok {
		t.Fatalf("%T is not a metric", o)
	}
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleSum()
}

// A recording span and the tracer behind it, keeping what the handler's
// child spans say of their times.
type recordedSpan struct{ start, end time.Time }

type recTracerProvider struct {
	tracenoop.TracerProvider
	mu    sync.Mutex
	spans map[string]recordedSpan
}

func (p *recTracerProvider) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return recTracer{tp: p}
}

func (p *recTracerProvider) byName() map[string]recordedSpan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.spans
}

type recTracer struct {
	tracenoop.Tracer
	tp *recTracerProvider
}

func (tr recTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	s := recSpan{tp: tr.tp, name: name, start: cfg.Timestamp()}
	return trace.ContextWithSpan(ctx, s), s
}

type recSpan struct {
	tracenoop.Span
	tp    *recTracerProvider
	name  string
	start time.Time
}

func (s recSpan) IsRecording() bool                    { return true }
func (s recSpan) TracerProvider() trace.TracerProvider { return s.tp }
func (s recSpan) End(opts ...trace.SpanEndOption) {
	if s.name == "" {
		return
	}
	s.tp.mu.Lock()
	defer s.tp.mu.Unlock()
	if s.tp.spans == nil {
		s.tp.spans = map[string]recordedSpan{}
	}
	cfg := trace.NewSpanEndConfig(opts...)
	s.tp.spans[s.name] = recordedSpan{start: s.start, end: cfg.Timestamp()}
}
