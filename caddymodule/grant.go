package caddymodule

import (
	"context"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// grant is a request that passed every check.
type grant struct {
	segID   segid.ID
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

// authorize decides the grant (protocol §4) for a verified token: it reads
// the segment's record and asks store.Grant, once. A refusal is decided on
// a fresh record only: when the record may have come from the cache, it is
// re-read and the grant asked again, unless the same refusal was decided
// on a fresh read of this record within the refusal window (recheck). While
// the store cannot be read, a record read within grace decides (d.grace),
// refusals included. On refusal the answer is written and ok is false.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, d *decision, segID segid.ID, claims *token.Claims, now time.Time) (g grant, ok bool) {
	ctx, cancel := h.lookupContext(d.ctx)
	start := d.tick() // the token's check ends, the lookup starts
	d.tr.verified, d.tr.lookupAt = start, start
	rec, err := h.lookupRecord(ctx, segID, d) // tracing.go (d.grace: a grace record)
	d.lookup = d.tick().Sub(start)
	cancel()
	if d.tr.record == store.RecordStore || d.tr.record == store.RecordGrace { // not a cache hit or a follower
		h.metrics.storeOp(opLookup, d.lookup)
	}
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
	if res.Outcome != store.Granted && !d.grace {
		// A grace record was served because the store just failed:
		// re-reading it now would only wait on the store again.
		rec, res = h.recheck(d.ctx, segID, rec, res, claims, nowMs)
		d.tick() // recheck may have read the store
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

// recheck decides a refusal res of rec on a fresh record: when rec may
// have come from the record cache it is re-read and the grant asked again,
// so that a segment re-published with a later expiry, or a new
// publication, is granted as soon as the refusal memo lets it be: a
// refusal for the same reason decided on a fresh read of this very record
// less than the refusal window ago (1s, at most record_ttl) stands without
// a read, so a repeated refused request costs no store read each. A
// refusal decided on a fresh record is remembered; one decided on rec
// because the store cannot be read now is not.
func (h *Handler) recheck(ctx context.Context, segID segid.ID, rec *store.Record, res store.GrantResult, claims *token.Claims, nowMs int64) (*store.Record, store.GrantResult) {
	if h.store.RefusedRecently(segID, rec, res.Reason) {
		return rec, res
	}
	fresh, ok, err := h.store.Revalidate(ctx, segID, rec)
	if err != nil {
		return rec, res // the decision stands on rec, unremembered
	}
	if ok && fresh != nil {
		rec = fresh
		res = store.Grant(rec, claims.SD, claims.Aud, h.audience.Derive, nowMs)
	}
	if res.Outcome != store.Granted {
		h.store.RememberRefusal(segID, rec, res.Reason)
	}
	return rec, res
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
