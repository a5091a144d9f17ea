package caddymodule

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// Traces: when Caddy's tracing handler wraps the route, the request's
// context carries a recording span, and the handler adds child spans for
// its steps: syncular.verify, syncular.lookup (syncular.record: the
// record cache, this request's store read, or another's), syncular.fill /
// syncular.follow / syncular.open (the bytes, named by how they were
// found), syncular.presign and syncular.write. They are built in finish
// from the times the request recorded on its way, so a request that is
// not traced pays one context lookup, and a traced one no more than its
// spans. Attributes are bounded and never secret: the segment id (a
// content hash), the outcome, the cache outcome, the delivery, the key
// slot, the backend and the content coding; never a token, a key, an
// audience, a partition id or a presigned URL.

// tracerName names the instrumentation scope of the handler's spans.
const tracerName = "github.com/syncular/caddy-syncular"

// traceMarks are the times a traced request records (zero: the step did
// not run).
type traceMarks struct {
	ctx       context.Context // the request's context; nil: not traced
	verified  time.Time
	lookupAt  time.Time
	openAt    time.Time
	presignAt time.Time
	statusAt  time.Time
	coding    string // the answer's content coding, when not identity
	record    store.RecordSource
}

// recordSources are the syncular.record values of the lookup span.
var recordSources = [...]string{store.RecordStore: "store", store.RecordMemory: "memory", store.RecordFollow: "follower",
	store.RecordGrace: "grace"}

// lookupRecord reads the segment's record and notes where it came from:
// the record cache, this request's store read, or another's, or a record
// kept through a store outage (grace, outage.go in store).
func (h *Handler) lookupRecord(ctx context.Context, segID segid.ID, d *decision) (*store.Record, error) {
	rec, src, err := h.store.LookupFrom(ctx, segID)
	d.tr.record = src
	d.grace = src == store.RecordGrace
	return rec, err
}

// startTrace notes the request's context when its span is recording.
func (d *decision) startTrace(ctx context.Context) {
	if trace.SpanFromContext(ctx).IsRecording() {
		d.tr.ctx = ctx
	}
}

// traced reports whether the request is traced.
func (d *decision) traced() bool { return d.tr.ctx != nil }

// endSpans writes the request's child spans, ending at end.
func (h *Handler) endSpans(d *decision, end time.Time) {
	parent := trace.SpanFromContext(d.tr.ctx)
	tr := parent.TracerProvider().Tracer(tracerName)
	backend := ""
	if h.Store != nil {
		backend = h.Store.Backend
	}
	seg := attribute.String("syncular.segment_id", d.segID)
	span := func(name string, from, to time.Time, attrs ...attribute.KeyValue) {
		if from.IsZero() || to.Before(from) {
			return
		}
		_, sp := tr.Start(d.tr.ctx, name, trace.WithTimestamp(from), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(seg), trace.WithAttributes(attrs...))
		sp.End(trace.WithTimestamp(to))
	}
	span("syncular.verify", d.start, d.tr.verified, attribute.String("syncular.key_slot", slotLabel(d.slot)))
	span("syncular.lookup", d.tr.lookupAt, d.tr.lookupAt.Add(d.lookup), attribute.String("syncular.backend", backend),
		attribute.String("syncular.record", recordSources[d.tr.record]))
	cache := ""
	if d.cache != cacheNone {
		cache = cacheNames[d.cache]
	}
	if !d.tr.openAt.IsZero() {
		name := "syncular.open"
		switch d.cache {
		case cacheFill:
			name = "syncular.fill"
		case cacheFollower:
			name = "syncular.follow"
		}
		span(name, d.tr.openAt, d.tr.openAt.Add(d.open),
			attribute.String("syncular.backend", backend), attribute.String("syncular.cache", cache))
	}
	span("syncular.presign", d.tr.presignAt, d.tr.presignAt.Add(d.presign), attribute.String("syncular.backend", backend))
	coding := d.tr.coding
	if coding == "" {
		coding = "identity"
	}
	span("syncular.write", d.tr.statusAt, end, attribute.String("syncular.cache", cache),
		attribute.String("syncular.delivery", d.delivery), attribute.String("syncular.coding", coding))
	attrs := []attribute.KeyValue{seg, attribute.String("syncular.outcome", d.outcome)}
	if cache != "" {
		attrs = append(attrs, attribute.String("syncular.cache", cache), attribute.String("syncular.delivery", d.delivery))
	}
	parent.SetAttributes(attrs...)
}
