package caddymodule

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
)

// Outcomes published in {http.syncular.outcome} and the debug log.
const (
	outcomeGranted   = "granted"
	outcomeNext      = "next"
	outcomeNotModied = "not_modified"
)

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	h.life.enter()
	defer h.life.leave()
	d := decision{slot: -1}
	defer h.finish(r, &d)
	tokens, signed := stParams(r.URL.RawQuery)
	if hashHidesToken(r) {
		h.refuse(w, r, "", errForbidden, "segment token rejected: '#' in a signed URL")
		return nil
	}
	if !signed {
		if h.Untokened == "reject" {
			h.refuse(w, r, "", errForbidden, "a signed URL (st parameter) is required")
			return nil
		}
		d.outcome = outcomeNext
		setPlaceholder(r, "outcome", outcomeNext)
		return next.ServeHTTP(w, r)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		h.refuse(w, r, "", errMethod, "segment downloads accept GET and HEAD only")
		return nil
	}
	if len(tokens) != 1 {
		h.refuse(w, r, "", errForbidden, "segment token rejected: more than one st parameter")
		return nil
	}
	segID, ok := segmentFromPath(r.URL)
	if !ok {
		h.refuse(w, r, "", errNotFound, "not a segment id")
		return nil
	}
	setPlaceholder(r, "segment_id", segID)
	d.segID = segID

	now := h.now()
	claims, slot, err := h.verifier.Verify(tokens[0], segID, now)
	d.slot = slot
	h.metrics.verification(slot)
	setPlaceholder(r, "key_slot", slotLabel(slot))
	if err != nil {
		var te *presign.Error
		msg := "segment token rejected: malformed token"
		if errors.As(err, &te) {
			msg = te.Error()
		}
		h.refuse(w, r, segID, errForbidden, msg)
		return nil
	}

	d.aud = claims.Aud
	ctx, cancel := h.lookupContext(r.Context())
	start := time.Now()
	rec, err := h.store.Lookup(ctx, segID)
	d.lookup = time.Since(start)
	cancel()
	h.metrics.storeOp(opLookup, d.lookup)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			h.refuse(w, r, segID, errNotFound, "segment not found")
			return nil
		}
		h.storeFault(w, r, segID, "lookup", err)
		return nil
	}

	nowMs := now.UnixMilli()
	res := store.Grant(rec, claims.SD, claims.Aud, h.audience.Derive, nowMs)
	if res.Outcome != store.Granted {
		// Through the cache, refuse only on a fresh record.
		if fresh, ok := h.revalidate(r.Context(), segID, rec); ok {
			rec = fresh
			res = store.Grant(rec, claims.SD, claims.Aud, h.audience.Derive, nowMs)
		}
	}
	if res.Outcome != store.Granted {
		e, msg := grantRefusal(res)
		h.refuse(w, r, segID, e, msg)
		return nil
	}
	untilMs := res.UntilMs
	// The grant never outlives the token's acceptance (exp + skew).
	if end := tokenEndMs(claims.Exp, h.skew); end < untilMs {
		untilMs = end
	}
	g := grant{segID: segID, rec: rec, now: now, untilMs: untilMs, slot: slot}
	setPlaceholder(r, "delivery", h.Delivery)
	return h.deliver(w, r, g, &d)
}

// grant is a request that passed every check.
type grant struct {
	segID   string
	rec     *store.Record
	now     time.Time
	untilMs int64 // epoch ms at which the grant ends
	slot    int   // index of the key that verified the token
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

// deliver answers a granted request according to the delivery mode.
// d collects the store latencies for the decision line.
func (h *Handler) deliver(w http.ResponseWriter, r *http.Request, g grant, d *decision) error {
	hdr := w.Header()
	etag := g.etag()
	hdr.Set("ETag", etag)
	// Tenant data behind a short-lived grant: only the client's own
	// cache may keep it, and never past the grant.
	hdr.Set("Cache-Control", "private, max-age="+strconv.FormatInt(g.maxAge(), 10))
	streams := h.Delivery != DeliveryRedirect || h.streamsLegacy(g.rec)
	if streams && h.notModified(r, g.segID) {
		h.setNotModifiedHeaders(hdr, r, g.segID)
		setPlaceholder(r, "outcome", outcomeNotModied)
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	if inm := r.Header.Get("If-None-Match"); !streams && inm != "" && etagMatches(inm, etag) {
		setPlaceholder(r, "outcome", outcomeNotModied)
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	if h.Delivery == DeliveryRedirect {
		if !h.streamsLegacy(g.rec) {
			return h.redirect(w, r, g, d)
		}
		d.legacy = true
		setPlaceholder(r, "delivery", deliveryStreamLegacy)
	}
	return h.serve(w, r, g, d)
}

// serve writes the segment's bytes (whole, or one Range) from the store.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, g grant, d *decision) error {
	size := g.rec.ByteLength
	hdr := w.Header()
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Accept-Ranges", "bytes")
	hdr.Set("X-Content-Type-Options", "nosniff")

	br, rr := byteRange{off: 0, n: size}, rangeNone
	if rh := r.Header.Get("Range"); rh != "" {
		if ir := r.Header.Get("If-Range"); ir == "" || ir == g.etag() {
			br, rr = parseRange(rh, size)
			if rr == rangeNone {
				br = byteRange{off: 0, n: size}
			}
		}
	}
	status := http.StatusOK
	switch rr {
	case rangeUnsatisfiable:
		hdr.Del("Cache-Control")
		hdr.Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
		h.refuse(w, r, g.segID, errRange, "range not satisfiable")
		return nil
	case rangePartial:
		status = http.StatusPartialContent
		hdr.Set("Content-Range", br.contentRange(size))
	}
	v := h.chooseVariant(r, g.segID, r.Header.Get("Range") == "")
	defer v.close()
	if v.body != nil {
		return h.serveVariant(w, r, g, d, v)
	}
	h.setVariantHeaders(hdr, g.segID, v)
	setPlaceholder(r, "outcome", outcomeGranted)
	if r.Method == http.MethodHead {
		hdr.Set("Content-Length", strconv.FormatInt(br.n, 10))
		w.WriteHeader(status)
		return nil
	}

	// Bound the time to open the bytes, not the time to stream them.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	timer := time.AfterFunc(time.Duration(h.StoreTimeout), cancel)
	start := time.Now()
	body, err := h.store.Open(ctx, g.segID, br.off, br.n)
	timedOut := !timer.Stop()
	d.open = time.Since(start)
	h.metrics.storeOp(opOpen, d.open)
	if err != nil {
		switch {
		case errors.Is(err, store.ErrNotFound):
			hdr.Del("ETag")
			hdr.Del("Cache-Control")
			h.refuse(w, r, g.segID, errNotFound, "segment not found")
		case timedOut:
			h.storeFault(w, r, g.segID, "open", context.DeadlineExceeded)
		default:
			h.storeFault(w, r, g.segID, "open", err)
		}
		return nil
	}
	defer body.Close()
	h.buildAfterRead(g.segID, v)
	hdr.Set("Content-Length", strconv.FormatInt(br.n, 10))
	w.WriteHeader(status)
	n, err := copyBody(w, body, br.n)
	h.metrics.via(d.legacy).bytes(n)
	h.metrics.codedBytes(compress.Identity, n)
	if err != nil {
		// Headers are gone: the client sees a short body and retries.
		if c := h.logger.Check(zapcore.DebugLevel, "segment body interrupted"); c != nil {
			c.Write(zap.String("segment_id", g.segID), zap.Error(err))
		}
	}
	return nil
}

// refuse writes a protocol error and records the outcome (the debug
// line is written by finish).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, segID string, e protoError, msg string) {
	setPlaceholder(r, "outcome", e.code)
	setPlaceholder(r, "reason", msg)
	e.write(w, msg)
}

// decision is what one request's handling found out, for the metrics and
// the debug line finish writes.
type decision struct {
	outcome string // set for "next" only; otherwise read from the replacer
	segID   string
	slot    int    // key slot that verified the MAC, -1 none
	aud     string // the token's audience (logged only as aud_hash)
	lookup  time.Duration
	open    time.Duration
	presign time.Duration
	legacy  bool // a redirect handler streamed it (legacy record header)
}

// finish counts the request and writes one debug line per decision:
// segment_id, outcome, reason, key_slot, delivery, store_ms and aud_hash
// (never the token, a key, an audience or a partition id).
func (h *Handler) finish(r *http.Request, d *decision) {
	outcome, reason := d.outcome, ""
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		if outcome == "" {
			outcome = replString(repl, "http.syncular.outcome")
		}
		reason = replString(repl, "http.syncular.reason")
	}
	h.metrics.via(d.legacy).request(outcome)
	c := h.logger.Check(zapcore.DebugLevel, "segment decision")
	if c == nil {
		return
	}
	delivery := ""
	if outcome == outcomeGranted || outcome == outcomeNotModied {
		delivery = h.Delivery
		if d.legacy {
			delivery = deliveryStreamLegacy
		}
	}
	aud := ""
	if d.aud != "" {
		aud = audHash(d.aud)
	}
	storeMs := float64(d.lookup+d.open+d.presign) / float64(time.Millisecond)
	c.Write(zap.String("segment_id", d.segID), zap.String("outcome", outcome), zap.String("reason", reason),
		zap.String("key_slot", slotLabel(d.slot)), zap.String("delivery", delivery),
		zap.Float64("store_ms", storeMs), zap.String("aud_hash", aud))
}

func replString(repl *caddy.Replacer, key string) string {
	v, _ := repl.Get(key)
	s, _ := v.(string)
	return s
}

// storeFault answers a store that failed or timed out.
func (h *Handler) storeFault(w http.ResponseWriter, r *http.Request, segID, op string, err error) {
	e, msg := errStoreDown, "segment store unavailable"
	if errors.Is(err, context.DeadlineExceeded) {
		e, msg = errStoreTimeout, "segment store timed out"
	}
	if r.Context().Err() != nil {
		// The client left; nobody reads the answer.
		msg = "request canceled"
	}
	h.logger.Warn("segment store fault", zap.String("segment_id", segID), zap.String("op", op), zap.Error(err))
	w.Header().Del("ETag")
	w.Header().Del("Cache-Control")
	h.refuse(w, r, segID, e, msg)
}

// grantRefusal is the answer and message for a refused grant (§4, §6).
// The message names the failed step, never a partition id.
func grantRefusal(res store.GrantResult) (protoError, string) {
	switch res.Reason {
	case store.ReasonScope:
		return errForbidden, "segment token rejected: " + presign.ReasonScope
	case store.ReasonAudience:
		return errForbidden, "segment token rejected: " + presign.ReasonAudience
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

// stParams returns the values of every st parameter in a raw query, and
// whether any was present. A value that cannot be unescaped is returned
// as an empty token, which verification refuses.
func stParams(rawQuery string) (tokens []string, present bool) {
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != "st" {
			if !strings.Contains(k, "%") {
				continue
			}
			uk, err := url.QueryUnescape(k)
			if err != nil || uk != "st" {
				continue
			}
		}
		tok := v // a token is base64url: nothing to unescape, usually
		if strings.IndexByte(v, '%') >= 0 || strings.IndexByte(v, '+') >= 0 {
			var err error
			if tok, err = url.QueryUnescape(v); err != nil {
				tok = ""
			}
		}
		tokens = append(tokens, tok)
	}
	return tokens, len(tokens) > 0
}

// hashHidesToken reports a raw '#' in the request target together with an
// st parameter before or after it. Go's server keeps such a '#' in the
// path or query, while URL parsers (log filters among them) end the URL
// there: the token would be read here but missed by the filter that keeps
// it out of the access log. Both the target as received and as parsed
// are checked, so a rewrite cannot hide the '#'.
func hashHidesToken(r *http.Request) bool {
	if strings.IndexByte(r.RequestURI, '#') < 0 && strings.IndexByte(r.URL.RawQuery, '#') < 0 &&
		strings.IndexByte(r.URL.RawPath, '#') < 0 {
		return false // the common case, without building strings
	}
	for _, target := range [2]string{r.RequestURI, r.URL.RawPath + "?" + r.URL.RawQuery} {
		i := strings.IndexAny(target, "?#")
		if i < 0 || strings.IndexByte(target[i:], '#') < 0 {
			continue
		}
		if _, present := stParams(strings.NewReplacer("#", "&", "?", "&").Replace(target[i+1:])); present {
			return true
		}
	}
	return false
}

// segmentFromPath returns the last element of the request path,
// percent-decoded, when it is a well-formed segment id.
func segmentFromPath(u *url.URL) (string, bool) {
	p := u.EscapedPath()
	last := p[strings.LastIndexByte(p, '/')+1:]
	if len(last) > 3*71 {
		return "", false
	}
	id, err := url.PathUnescape(last)
	if err != nil || !store.ValidSegmentID(id) {
		return "", false
	}
	return id, true
}

// setPlaceholder publishes {http.syncular.<name>} for logs and headers.
func setPlaceholder(r *http.Request, name, value string) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.syncular."+name, value)
	}
}
