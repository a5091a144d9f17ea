package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// decision is the one record of what a request's handling found out. Each
// step writes it (the setters also publish the {http.syncular.*}
// placeholders, before the response is written, so a header directive
// sees them too); finish reads only this struct.
type decision struct {
	ph       *placeholders // the request's placeholders; nil without a replacer
	outcome  string        // granted, not_modified, next or an error code
	reason   string        // the refusal message
	segID    string
	slot     int    // key slot that verified the MAC, -1 none
	aud      string // the token's audience (logged only as aud_hash)
	delivery string // how the bytes went: serve, redirect, proxy, stream_legacy (respond.go)
	grace    bool   // decided on a record kept through a store outage
	lookup   time.Duration
	open     time.Duration
	presign  time.Duration
	start    time.Time  // when the handler got the request (first-byte time)
	last     time.Time  // the latest clock reading (tick)
	cache    cacheKind  // how a granted answer was made (cachestatus.go)
	inFlight bool       // counted in caddy_syncular_downloads_in_flight until finish
	tr       traceMarks // when traced: the steps' times (tracing.go)
	// ctx is the request's context with the verified audience as the
	// store's tenant (store.WithTenant): the context of every store call
	// once the token is verified.
	ctx context.Context
}

// tick reads the wall clock and keeps the reading as d.last. A request
// reads the clock once per step boundary: the reading that ends one step
// (a lookup, a presign, an open) also starts the next when nothing in
// between can wait (no I/O, no lock held for long), so its durations are
// measured with no more readings than boundaries.
func (d *decision) tick() time.Time {
	d.last = time.Now()
	return d.last
}

func (d *decision) setOutcome(outcome string) {
	d.outcome = outcome
	d.ph.publish(phOutcome, outcome)
}

func (d *decision) setSegment(id segid.ID) {
	d.segID = id.String()
	d.ph.publish(phSegmentID, d.segID)
}

func (d *decision) setSlot(slot int) {
	d.slot = slot
	d.ph.publishSlot(slot)
}

func (d *decision) setDelivery(delivery string) {
	d.delivery = delivery
	d.ph.publish(phDelivery, delivery)
}

// refuse writes a protocol error and records it as the outcome (the debug
// line is written by finish).
func (d *decision) refuse(w http.ResponseWriter, e protoError, msg string) {
	d.setOutcome(e.code)
	d.reason = msg
	d.ph.publish(phReason, msg)
	e.write(w, msg)
}

// storeFault answers a store that failed or timed out.
func (h *Handler) storeFault(w http.ResponseWriter, r *http.Request, d *decision, op string, err error) {
	if errors.Is(err, store.ErrOverloaded) {
		// The store's read slots and waiting list are taken (the
		// store was not called): a retry later, spread.
		h.refuseOverloaded(w, d, "too many segment store reads in progress")
		return
	}
	e, msg := errStoreDown, "segment store unavailable"
	if errors.Is(err, context.DeadlineExceeded) {
		e, msg = errStoreTimeout, "segment store timed out"
	}
	if r.Context().Err() != nil {
		// The client left; nobody reads the answer.
		msg = "request canceled"
	}
	// A breaker open or a corrupt segment backing off is logged once, when
	// it starts (store.go, disktier.go), not on every request it answers.
	lvl := zapcore.WarnLevel
	if errors.Is(err, store.ErrStoreDown) || errors.Is(err, store.ErrCorruptBackoff) {
		lvl = zapcore.DebugLevel
	}
	if c := h.logger.Check(lvl, "segment store fault"); c != nil {
		c.Write(zap.String("segment_id", d.segID), zap.String("op", op), zap.Error(err))
	}
	d.refuse(w, e, msg)
}

// finish counts the request and writes one debug line per decision:
// segment_id, outcome, reason, key_slot, delivery, store_ms and aud_hash
// (never the token, a key, an audience or a partition id). The line's
// delivery is the metrics label and the placeholder's, set once by plan
// (respond.go).
func (h *Handler) finish(d *decision) {
	if d.traced() {
		h.endSpans(d, time.Now()) // tracing.go
	}
	if d.inFlight {
		h.metrics.leaveDelivery()
	}
	h.metrics.via(d.delivery).request(d.outcome)
	if d.grace {
		h.metrics.graceRequest(d.outcome)
	}
	c := h.logger.Check(zapcore.DebugLevel, "segment decision")
	if c == nil {
		return
	}
	delivery := ""
	if d.outcome == outcomeGranted || d.outcome == outcomeNotModified {
		delivery = d.delivery
	}
	aud := ""
	if d.aud != "" {
		aud = audHash(d.aud)
	}
	storeMs := float64(d.lookup+d.open+d.presign) / float64(time.Millisecond)
	c.Write(zap.String("segment_id", d.segID), zap.String("outcome", d.outcome), zap.String("reason", d.reason),
		zap.String("key_slot", slotLabel(d.slot)), zap.String("delivery", delivery),
		zap.Float64("store_ms", storeMs), zap.String("aud_hash", aud), zap.Bool("grace", d.grace))
}
