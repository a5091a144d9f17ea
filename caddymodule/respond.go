package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
)

// The answer of a granted request, in two steps: plan decides everything
// the answer is (a redirect or one of its fall-backs, 304, 416, 206 or
// 200, HEAD, the codings the body may have, every header, the delivery
// label the placeholder, the debug line and the metrics all read) from
// the request, the grant and what the store and the presigner say without
// side effects; write then carries it out, and is the one place a body is
// opened and written (and an answer whose body fails is aborted).
//
// Compressed delivery (docs/large-segments.md "Compression", protocol
// §6): serve and proxy answers (and a redirect handler's streamed
// fall-backs) send a zstd or gzip variant of the segment when the
// request's Accept-Encoding allows it and the store holds one (in the
// bytes cache, or as a file of the disk tier for a large segment: sent
// with sendfile). The store builds a variant once per (segment, coding)
// in the background from verified identity bytes and decides when a
// request waits for one or follows one being encoded (store.Want); a
// range is always answered from the identity bytes.

// Delivery modes (Handler.Delivery), and the delivery label of a request
// a redirect handler streamed because of a legacy record header.
const (
	DeliveryServe        = "serve"    // the edge writes the bytes itself
	DeliveryRedirect     = "redirect" // 302 to a presigned S3 URL
	DeliveryProxy        = "proxy"    // the edge streams the S3 object
	deliveryStreamLegacy = "stream_legacy"
)

// answerKind is what plan decided.
type answerKind uint8

const (
	answerBytes         answerKind = iota // 200 or 206 (HEAD: its headers)
	answerRedirect                        // 302 to a signed URL
	answerNotModified                     // 304
	answerUnsatisfiable                   // 416
	answerPresignFault                    // the presigner failed: a store fault
)

// answer is the plan of one granted request's answer.
type answer struct {
	kind answerKind
	// delivery is the label of how the bytes go: the handler's mode,
	// stream_legacy (fall-back 1 of a redirect handler), or proxy (its
	// fall-back 2, the grant too short for a URL: the edge streams the
	// bytes as proxy delivery does).
	delivery string
	status   int  // answerBytes: 200 or 206
	head     bool // answerBytes: headers only
	br       byteRange
	partial  bool
	// want is what a GET asks the store for (the codings accepted,
	// preferred first; none for a range).
	want store.Want
	// coding and codedSize are, for a HEAD or a 304, the representation
	// a GET would get now (store.Server.Coding).
	coding    compress.Coding
	codedSize int64
	maxAge    int64 // Cache-Control max-age of a 2xx or 304
	vary      bool  // Vary: Accept-Encoding (a compressing handler)

	location string // answerRedirect
	life     int64  // answerRedirect: the URL's seconds left
	err      error  // answerPresignFault
}

// signed is the presigner's answer for a redirect handler's request.
type signed struct {
	url     string
	expires time.Time
	err     error
}

// respond answers a granted request: plan, then write. Success headers
// (ETag, Cache-Control, Content-Type...) are set only by the answers that
// succeed; a refusal on the way carries none of them.
func (h *Handler) respond(w http.ResponseWriter, r *http.Request, g grant, d *decision) {
	d.inFlight = h.metrics.enterDelivery() // left in finish
	var s signed
	if h.Delivery == DeliveryRedirect && !h.streamsLegacy(g.rec) {
		s = h.sign(d.ctx, g, d)
	}
	a := h.plan(r, g, s)
	d.setDelivery(a.delivery)
	h.write(w, r, g, d, &a)
}

// sign presigns the redirect URL, timed as a store operation.
func (h *Handler) sign(ctx context.Context, g grant, d *decision) signed {
	start := d.last        // the lookup's end: nothing waited since
	d.tr.presignAt = start // tracing.go
	var s signed
	s.url, s.expires, s.err = h.presignURL(ctx, g)
	d.presign = d.tick().Sub(start)
	h.metrics.storeOp(opPresign, d.presign)
	if s.err != nil && !errors.Is(s.err, presign.ErrGrantTooShort) && !errors.Is(s.err, presign.ErrGrantEnded) {
		h.metrics.presignError() // a grant too short for a URL is streamed (plan), not a failure
	}
	return s
}

// plan decides the answer. It writes nothing and changes nothing: the
// store is asked only what it holds (Coding).
func (h *Handler) plan(r *http.Request, g grant, s signed) answer {
	a := answer{delivery: h.Delivery, maxAge: g.maxAge(), vary: h.compressing()}
	if h.Delivery == DeliveryRedirect {
		switch {
		case h.streamsLegacy(g.rec):
			// Fall-back 1: the object carries a legacy record header
			// a client following the redirect would receive.
			a.delivery = deliveryStreamLegacy
		case errors.Is(s.err, presign.ErrGrantTooShort) || errors.Is(s.err, presign.ErrGrantEnded):
			// Fall-back 2: the grant is too short for any URL (SigV4
			// counts whole seconds) but live: the edge streams the
			// bytes itself rather than hand out a URL that outlives it.
			a.delivery = DeliveryProxy
		case s.err != nil:
			a.kind, a.err = answerPresignFault, s.err
			return a
		default:
			// A 302 carries no ETag and ignores If-None-Match
			// (setRedirectHeaders).
			a.kind, a.location = answerRedirect, s.url
			a.life = max(int64(s.expires.Sub(g.now)/time.Second), 0)
			return a
		}
	}
	rangeHdr := r.Header.Get("Range")
	var codings []compress.Coding
	if a.vary && rangeHdr == "" { // a range is answered from the identity bytes
		codings = compress.AcceptedValues(r.Header.Values("Accept-Encoding"), h.codings)
	}
	// 304 when If-None-Match names what a GET would send now: any
	// variant's ETag matches (every variant decodes to the same bytes).
	if inm := r.Header.Values("If-None-Match"); len(inm) > 0 && compress.MatchIfNoneMatch(g.segID.String(), inm...) {
		a.kind = answerNotModified
		a.coding, _ = h.store.Coding(g.segID, codings)
		return a
	}
	size := g.rec.ByteLength
	a.br = byteRange{off: 0, n: size}
	if rangeHdr != "" {
		if ir := r.Header.Get("If-Range"); ir == "" || ir == compress.ETag(g.segID.String(), compress.Identity) {
			switch br, rr := parseRange(rangeHdr, size); rr {
			case rangePartial:
				a.br, a.partial = br, true
			case rangeUnsatisfiable:
				a.kind = answerUnsatisfiable
				return a
			}
		}
	}
	a.kind, a.status = answerBytes, http.StatusOK
	if a.partial {
		a.status = http.StatusPartialContent
	}
	if r.Method == http.MethodHead {
		a.head = true
		a.coding, a.codedSize = h.store.Coding(g.segID, codings)
		return a
	}
	a.want = store.Want{Codings: codings, Off: a.br.off, N: a.br.n, Size: size, Wait: true}
	return a
}

// write carries out the plan.
func (h *Handler) write(w http.ResponseWriter, r *http.Request, g grant, d *decision, a *answer) {
	hdr := w.Header()
	switch a.kind {
	case answerPresignFault:
		h.storeFault(w, r, d, "presign", a.err)
	case answerRedirect:
		setRedirectHeaders(hdr, a.life, a.location)
		d.setOutcome(outcomeGranted)
		h.markCache(w, d, cacheRedirect)
		w.WriteHeader(http.StatusFound)
	case answerNotModified:
		setGrantHeaders(hdr, g.segID.String(), a.coding, a.maxAge)
		if a.vary {
			hdr.Add("Vary", "Accept-Encoding")
		}
		d.setOutcome(outcomeNotModified)
		h.markCache(w, d, cacheRecord)
		w.WriteHeader(http.StatusNotModified)
	case answerUnsatisfiable:
		hdr.Set("Content-Range", "bytes */"+strconv.FormatInt(g.rec.ByteLength, 10))
		d.refuse(w, errRange, "range not satisfiable")
	case answerBytes:
		if a.head {
			size := a.br.n
			if a.coding != compress.Identity {
				size = a.codedSize
			}
			a.setBytesHeaders(hdr, g, a.coding, size, d)
			h.markCache(w, d, cacheRecord)
			w.WriteHeader(a.status)
			return
		}
		h.writeBody(w, r, g, d, a)
	}
}

// setBytesHeaders sets the headers of a 200/206 answer whose body has the
// coding and size bytes (-1: unknown, no Content-Length), and records the
// grant. Every answer sets them, so they cost two allocations whatever
// their number: one string holds the ETag, Cache-Control and
// Content-Length texts, and one array the values, each header its own
// element capped at its length, so that an append elsewhere (Header.Add)
// copies instead of writing into its neighbour. The keys are written in
// canonical form.
func (a *answer) setBytesHeaders(hdr http.Header, g grant, coding compress.Coding, size int64, d *decision) {
	etag, cacheControl, length := grantHeaderText(g.segID.String(), coding, a.maxAge, size)
	vals := new([bytesHeaderSlots]string)
	i := 0
	put := func(key, v string) {
		vals[i] = v
		hdr[key] = vals[i : i+1 : i+1]
		i++
	}
	put("Etag", etag)
	put("Cache-Control", cacheControl)
	put("Content-Type", "application/octet-stream")
	put("Accept-Ranges", "bytes")
	put("X-Content-Type-Options", "nosniff")
	if size >= 0 {
		put("Content-Length", length)
	}
	if a.partial {
		put("Content-Range", a.br.contentRange(g.rec.ByteLength))
	}
	// Vary on every answer of a compressing handler, identity included,
	// so a shared cache keys on Accept-Encoding (added to a Vary already
	// set, as Header.Add does).
	if a.vary {
		if prev := hdr["Vary"]; len(prev) > 0 {
			hdr["Vary"] = append(prev, "Accept-Encoding")
		} else {
			put("Vary", "Accept-Encoding")
		}
	}
	if coding != compress.Identity {
		put("Content-Encoding", coding.String())
		d.tr.coding = coding.String()
	}
	d.setOutcome(outcomeGranted)
}

// bytesHeaderSlots is the most values setBytesHeaders sets.
const bytesHeaderSlots = 9

// writeBody opens the planned body, writes its headers and the bytes. A
// variant still being encoded has no Content-Length (HTTP/1.1 sends it
// chunked); like every body, it fails rather than end when its bytes do
// not verify, and the answer is then aborted.
func (h *Handler) writeBody(w http.ResponseWriter, r *http.Request, g grant, d *decision, a *answer) {
	// Bound the time to open the bytes, not the time to stream them.
	ctx, cancel := context.WithCancel(d.ctx)
	defer cancel()
	timer := time.AfterFunc(time.Duration(h.StoreTimeout), cancel)
	start := d.last // the lookup's end: nothing waited since
	d.tr.openAt = start
	body, err := h.store.OpenBody(ctx, g.segID, a.want)
	timedOut := !timer.Stop()
	d.open = d.tick().Sub(start)
	if err != nil || !body.Tier().Hit() && !body.Tier().Followed() { // a store call: not a hit or a follower
		h.metrics.storeOp(opOpen, d.open)
	}
	if err != nil {
		switch {
		case errors.Is(err, store.ErrNotFound):
			d.refuse(w, errNotFound, "segment not found")
		case timedOut:
			h.storeFault(w, r, d, "open", context.DeadlineExceeded)
		default:
			h.storeFault(w, r, d, "open", err)
		}
		return
	}
	defer body.Close()
	// A SQLite stream holds a chunk buffer per reader: capped, and cut
	// when its client stalls (streamcap.go).
	sqliteStream := h.Store != nil && h.Store.Backend == backendSQLite && body.Streamed()
	if sqliteStream {
		if !h.sqliteStreams.acquire(d.ctx, h.slotWait) {
			h.overloaded(w, d)
			return
		}
		d.tick() // the wait for a slot ends
		defer h.sqliteStreams.release()
	}
	coding, size := body.Coding(), body.Size()
	a.setBytesHeaders(w.Header(), g, coding, size, d)
	kind := kindOfTier(body.Tier())
	h.markCache(w, d, kind)
	w.WriteHeader(a.status)
	var stall time.Duration
	var hard time.Time
	if sqliteStream {
		stall, hard = streamStallTimeout, serverWriteDeadline(r, start)
	}
	n, err := sendBody(w, body, stall, hard) // body.go
	h.metrics.via(d.delivery).bytes(n)
	h.metrics.cacheBytes(kind, n)
	h.metrics.codedBytes(coding, n)
	if err != nil {
		// The status line is gone, so the client must not see a clean
		// (short) end: abort the response. net/http closes the
		// connection (HTTP/1) or resets the stream (HTTP/2, HTTP/3)
		// without logging; Caddy does not recover the panic. The
		// deferred finish still records the decision.
		h.warnCorrupt(g.segID.String(), err)
		if c := h.logger.Check(zapcore.DebugLevel, "segment body interrupted"); c != nil {
			c.Write(zap.String("segment_id", g.segID.String()), zap.String("coding", coding.String()), zap.Error(err))
		}
		panic(http.ErrAbortHandler)
	}
}

// markCache records how a granted answer was made, just before its
// status line is written: {http.syncular.cache}, the Cache-Status header
// when cache_status is on, and the time to the first byte. That time ends
// at the request's last clock reading (d.last), the end of its last store
// step: what ran since (planning the answer, its headers) waits on
// nothing.
func (h *Handler) markCache(w http.ResponseWriter, d *decision, k cacheKind) {
	d.cache = k
	d.ph.publish(phCache, cacheNames[k])
	if st := h.obs.status; st != nil {
		w.Header()["Cache-Status"] = []string{st[k]}
	}
	d.tr.statusAt = d.last // tracing.go
	h.metrics.firstByte(k, d.last.Sub(d.start))
}

// kindOfTier maps the store tier that answered an Open to a cache kind.
func kindOfTier(t store.Tier) cacheKind {
	switch {
	case t.Hit() && t.Disk():
		return cacheDisk
	case t.Hit():
		return cacheMemory
	case t.Fill():
		return cacheFill
	case t.Followed():
		return cacheFollower
	}
	return cacheStream
}

// warnCorrupt logs, as a store fault, a body that failed because its
// bytes do not match their id (the response is then aborted; the store's
// bodies map every tier's mismatch to ErrCorruptSegment). The error names
// the segment id only: no partition, no token.
func (h *Handler) warnCorrupt(segID string, err error) {
	if errors.Is(err, store.ErrCorruptSegment) {
		h.logger.Warn("segment bytes from the store do not match their id; response aborted",
			zap.String("segment_id", segID), zap.Error(err))
	}
}

// compressing reports whether this handler may send a coded answer.
func (h *Handler) compressing() bool { return len(h.codings) > 0 }

// presignURL is the redirect URL for g: the CDN's signed URL when a cdn
// is configured, else the presigned URL, straight from the presigner's
// cache when it is there (no timer, no I/O), else signed under
// store_timeout.
func (h *Handler) presignURL(parent context.Context, g grant) (string, time.Time, error) {
	notAfter := time.UnixMilli(g.untilMs)
	if h.cdn != nil { // a CDN's signed URL: no I/O, no timer
		return h.cdn.URL(g.segID, g.now, notAfter)
	}
	if u, exp, ok := h.presigner.CachedURL(g.segID, g.now, notAfter); ok {
		return u, exp, nil
	}
	ctx, cancel := h.storeContext(parent)
	defer cancel()
	return h.presigner.URL(ctx, g.segID, g.now, notAfter)
}

// streamsLegacy reports whether a redirect handler answers rec with the
// bytes instead of a redirect: its S3 object carries an older writer's
// x-amz-meta-syncular-record header (whichever record the store used), and
// S3 returns user metadata on a presigned GET, so the client would receive
// the partition id, which must never reach a client. Streaming sends only
// the edge's own headers. legacy_headers redirect turns this off.
func (h *Handler) streamsLegacy(rec *store.Record) bool {
	return h.streamLegacy && rec.LegacyHeader
}
