package caddymodule

import (
	"context"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// grant is a request that passed every check.
type grant struct {
	segID   string
	rec     *store.Record
	now     time.Time
	untilMs int64 // epoch ms at which the grant ends
}

// maxAge is the whole seconds left in the grant (never negative).
func (g grant) maxAge() int64 {
	s := (g.untilMs - g.now.UnixMilli()) / 1000
	if s < 0 {
		return 0
	}
	return s
}

func (g grant) etag() string { return `"` + g.segID + `"` }

// authorize decides the grant (protocol §4) for a verified token: it reads
// the segment's record and asks store.Grant, once. A refusal is decided on
// a fresh record only: when the record may have come from the cache, it is
// re-read and the grant asked again. On refusal the answer is written and
// ok is false.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, d *decision, segID string, claims *token.Claims, now time.Time) (g grant, ok bool) {
	ctx, cancel := h.lookupContext(r.Context())
	start := time.Now()
	d.tr.lookupAt = start
	rec, err := h.lookupRecord(ctx, segID, d) // tracing.go
	d.lookup = time.Since(start)
	cancel()
	h.metrics.storeOp(opLookup, d.lookup)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			d.refuse(w, errNotFound, "segment not found")
			return grant{}, false
		}
		h.storeFault(w, r, d, "lookup", err)
		return grant{}, false
	}

	nowMs := now.UnixMilli()
	res := store.Grant(rec, claims.SD, claims.Aud, h.audience.Derive, nowMs)
	if res.Outcome != store.Granted {
		if fresh, ok := h.revalidate(r.Context(), segID, rec); ok {
			rec = fresh
			res = store.Grant(rec, claims.SD, claims.Aud, h.audience.Derive, nowMs)
		}
	}
	if res.Outcome != store.Granted {
		e, msg := grantRefusal(res)
		d.refuse(w, e, msg)
		return grant{}, false
	}
	untilMs := res.UntilMs
	// The grant never outlives the token's acceptance (exp + skew).
	if end := tokenEndMs(claims.Exp, h.skew); end < untilMs {
		untilMs = end
	}
	return grant{segID: segID, rec: rec, now: now, untilMs: untilMs}, true
}

// grantRefusal is the answer and message for a refused grant (§4, §6).
// The message names the failed step, never a partition id.
func grantRefusal(res store.GrantResult) (protoError, string) {
	switch res.Reason {
	case store.ReasonScope:
		return errForbidden, "segment token rejected: " + token.ReasonScope
	case store.ReasonAudience:
		return errForbidden, "segment token rejected: " + token.ReasonAudience
	case store.ReasonFenced:
		return errNotFound, "segment not found: fenced by the partition registry"
	case store.ReasonOvertaken:
		return errExpired, "segment expired: overtaken by a backfill checkpoint"
	case store.ReasonExpired:
		return errExpired, "segment expired"
	}
	// ReasonNoRecord, or a reason this switch does not know: answer by
	// the outcome, refusing whatever it is.
	switch res.Outcome {
	case store.Forbidden:
		return errForbidden, "segment token rejected"
	case store.Expired:
		return errExpired, "segment expired"
	}
	return errNotFound, "segment not found"
}

// tokenEndMs is the epoch ms after which the token is refused.
func tokenEndMs(exp float64, skew time.Duration) int64 {
	end := (exp + skew.Seconds()) * 1000
	if end >= math.MaxInt64/2 || math.IsNaN(end) {
		return math.MaxInt64 / 2
	}
	return int64(math.Floor(end))
}

// revalidate returns a fresh record of segID when rec may have come from
// the record cache, so that a refusal is never decided on a stale record
// (a segment re-published with a later expiry, or a new publication, is
// granted at once). ok is false when rec is already fresh, or when the
// store cannot be read now (the decision then stands on rec).
func (h *Handler) revalidate(ctx context.Context, segID string, rec *store.Record) (*store.Record, bool) {
	if h.reval == nil {
		return rec, false
	}
	fresh, ok, err := h.reval.Revalidate(ctx, segID, rec)
	if err != nil || !ok || fresh == nil {
		return rec, false
	}
	return fresh, true
}

// lookupContext bounds a record lookup by store_timeout. Through the cache
// no timer is needed: a hit never waits, and a miss waits on a shared read
// the cache bounds by the same timeout (504 when it runs out).
func (h *Handler) lookupContext(parent context.Context) (context.Context, context.CancelFunc) {
	if h.lookupBounded {
		return parent, func() {}
	}
	return h.storeContext(parent)
}

// storeContext bounds one store operation.
func (h *Handler) storeContext(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, time.Duration(h.StoreTimeout))
}
