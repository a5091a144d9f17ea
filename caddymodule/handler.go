package caddymodule

import (
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// Outcomes published in {http.syncular.outcome} and the debug log, besides
// the error codes of refusals.
const (
	outcomeGranted     = "granted"
	outcomeNext        = "next"
	outcomeNotModified = "not_modified"
)

// ServeHTTP implements caddyhttp.MiddlewareHandler. A request walks three
// steps, each once: the request's shape and its token are verified here,
// the grant is decided against the store (grant.go), and the answer is
// planned and written (respond.go). Every step records what it found in the request's
// decision (decision.go), which finish turns into metrics and the debug
// line.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	h.life.enter()
	defer h.life.leave()
	ctx := r.Context()
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	start := time.Now()
	d := &decision{ph: placeholdersFor(ctx, repl), slot: -1, start: start, last: start}
	defer h.finish(d)

	// 1. Verify: the request's shape, then the token.
	var one [1]string
	tokens := appendStParams(one[:0], r.URL.RawQuery)
	signed := len(tokens) > 0
	if hashHidesToken(r) {
		d.refuse(w, errForbidden, reasonHashInURL)
		return nil
	}
	if !signed {
		if h.Untokened == untokenedReject {
			d.refuse(w, errForbidden, "a signed URL (st parameter) is required")
			return nil
		}
		d.setOutcome(outcomeNext)
		return next.ServeHTTP(w, r)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		d.refuse(w, errMethod, "segment downloads accept GET and HEAD only")
		return nil
	}
	if len(tokens) != 1 {
		d.refuse(w, errForbidden, "segment token rejected: more than one st parameter")
		return nil
	}
	segID, ok := segmentFromPath(r.URL)
	if !ok {
		d.refuse(w, errNotFound, "not a segment id")
		return nil
	}
	d.setSegment(segID)

	// The token and the grant are judged at the request's start, the
	// one wall-clock reading they need; an injected clock (tests) is
	// asked instead.
	now := start
	if !h.wallClock {
		now = h.now()
	}
	var claims token.Claims
	d.startTrace(ctx) // tracing.go
	slot, err := h.verifier.VerifyInto(&claims, tokens[0], segID.String(), now)
	d.setSlot(slot)
	h.metrics.verification(slot)
	if err != nil {
		var te *token.Error
		msg := "segment token rejected: malformed token"
		if errors.As(err, &te) {
			msg = te.Error()
		}
		d.refuse(w, errForbidden, msg)
		return nil
	}
	d.aud = claims.Aud
	d.ph.publishTenant(claims.Aud, h.obs.tenantKey)
	// The store shares its read slots fairly between tenants (the
	// verified audience, in memory only: store.WithTenant). The steps
	// below read the store under d.ctx; the request itself is not copied
	// for it.
	d.ctx = store.WithTenant(ctx, claims.Aud)

	// 2. Grant: may this token have these bytes now?
	g, ok := h.authorize(w, r, d, segID, &claims, now)
	if !ok {
		return nil
	}

	// 3. Respond: plan the answer, then write it.
	h.respond(w, r, g, d)
	return nil
}
