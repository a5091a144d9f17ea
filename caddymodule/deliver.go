package caddymodule

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
)

// Delivery modes (Handler.Delivery), and the delivery label of a request
// a redirect handler streamed because of a legacy record header.
const (
	DeliveryServe        = "serve"    // the edge writes the bytes itself
	DeliveryRedirect     = "redirect" // 302 to a presigned S3 URL
	DeliveryProxy        = "proxy"    // the edge streams the S3 object
	deliveryStreamLegacy = "stream_legacy"
)

// deliver answers a granted request according to the delivery mode.
// Success headers (ETag, Cache-Control, Content-Type...) are set only by
// the answers that succeed; a refusal on the way carries none of them.
func (h *Handler) deliver(w http.ResponseWriter, r *http.Request, g grant, d *decision) {
	d.setDelivery(h.Delivery)
	d.inFlight = h.metrics.enterDelivery() // left in finish
	if h.Delivery == DeliveryRedirect {
		if h.streamsLegacy(g.rec) {
			// Fall-back 1: the object carries a legacy record header
			// a client following the redirect would receive.
			d.legacy = true
			d.setDelivery(deliveryStreamLegacy)
			h.stream(w, r, g, d)
			return
		}
		h.redirect(w, r, g, d)
		return
	}
	// Proxy (the S3 object streams through the edge) and serve (the
	// store's bytes, SQLite or S3 streamed).
	h.stream(w, r, g, d)
}

// stream answers with the bytes: 304 when If-None-Match names what a GET
// would send now, else serve.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, g grant, d *decision) {
	if h.notModified(r, g.segID) {
		setGrantHeaders(w.Header(), g, g.maxAge())
		h.setNotModifiedHeaders(w.Header(), r, g.segID)
		d.setOutcome(outcomeNotModified)
		h.markCache(w, d, cacheRecord)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.serve(w, r, g, d)
}

// setGrantHeaders sets the headers of every successful answer: the ETag,
// and a Cache-Control that lets only the client's own cache keep the
// answer (tenant data behind a short-lived grant), for maxAge seconds.
func setGrantHeaders(hdr http.Header, g grant, maxAge int64) {
	vals := make([]string, 2)
	vals[0], vals[1] = grantHeaderText(g.segID, maxAge)
	hdr["Etag"], hdr["Cache-Control"] = vals[0:1:1], vals[1:2:2]
}

// setRedirectHeaders sets the headers of a redirect: the Location, and a
// Cache-Control that lets only the client's own cache keep the 302 while
// its URL is valid (maxAge seconds). The two values share one slice, each
// capped at its own element so an append elsewhere copies.
//
// A 302 carries no ETag: a cache revalidating a stale 302 with
// If-None-Match would, on a 304, keep its stored Location, a presigned
// URL that has expired by then. The redirect answer ignores
// If-None-Match altogether, as RFC 9110 section 13.2.1 requires of an
// answer that would not be 2xx without the precondition.
func setRedirectHeaders(hdr http.Header, maxAge int64, location string) {
	vals := make([]string, 2)
	vals[0], vals[1] = redirectCacheControl(maxAge), location
	hdr["Cache-Control"], hdr["Location"] = vals[0:1:1], vals[1:2:2]
}

// maxAgeTexts holds "private, max-age=N" for the lifetimes a presigned URL
// usually has left (presign_ttl defaults to 60 s), built once, so a
// redirect does not format one per request.
var maxAgeTexts = sync.OnceValue(func() []string {
	t := make([]string, 601)
	for i := range t {
		t[i] = "private, max-age=" + strconv.Itoa(i)
	}
	return t
})

// redirectCacheControl is the Cache-Control of a redirect whose URL has
// maxAge seconds left.
func redirectCacheControl(maxAge int64) string {
	if t := maxAgeTexts(); maxAge >= 0 && maxAge < int64(len(t)) {
		return t[maxAge]
	}
	return "private, max-age=" + strconv.FormatInt(max(maxAge, 0), 10)
}

// grantHeaderText is the ETag and the Cache-Control value of a grant,
// built as one string.
func grantHeaderText(segID string, maxAge int64) (etag, cacheControl string) {
	var b [128]byte
	buf := append(b[:0], '"')
	buf = append(buf, segID...)
	buf = append(buf, '"')
	n := len(buf)
	buf = append(buf, "private, max-age="...)
	buf = strconv.AppendInt(buf, maxAge, 10)
	s := string(buf)
	return s[:n], s[n:]
}

// serve writes the segment's bytes (whole, or one Range) from the store.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, g grant, d *decision) {
	size := g.rec.ByteLength
	br, rr := byteRange{off: 0, n: size}, rangeNone
	if rh := r.Header.Get("Range"); rh != "" {
		if ir := r.Header.Get("If-Range"); ir == "" || ir == g.etag() {
			br, rr = parseRange(rh, size)
			if rr == rangeNone {
				br = byteRange{off: 0, n: size}
			}
		}
	}
	if rr == rangeUnsatisfiable {
		w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
		d.refuse(w, errRange, "range not satisfiable")
		return
	}
	status := http.StatusOK
	if rr == rangePartial {
		status = http.StatusPartialContent
	}
	// A variant held now is sent instead of the identity bytes.
	v := h.chooseVariant(r, g.segID, r.Header.Get("Range") == "")
	defer v.close()
	if v.body != nil {
		h.serveVariant(w, r, g, d, v)
		return
	}
	if r.Method == http.MethodHead {
		writeBytesHeaders(w, g, br, rr, d)
		h.setVariantHeaders(w.Header(), g.segID, v)
		h.markCache(w, d, cacheRecord)
		w.WriteHeader(status)
		return
	}

	// Bound the time to open the bytes, not the time to stream them.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	timer := time.AfterFunc(time.Duration(h.StoreTimeout), cancel)
	start := time.Now()
	d.tr.openAt = start
	body, kind, err := h.openTier(ctx, g.segID, br.off, br.n) // cachestatus.go
	timedOut := !timer.Stop()
	d.open = time.Since(start)
	h.metrics.storeOp(opOpen, d.open)
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
	if br.off == 0 && br.n == size {
		body = store.VerifyWhole(body, g.segID, size) // ends in an error, not EOF, on a mismatch
	}
	defer body.Close()
	// The open started a large segment's fill: its variant is encoded
	// as the fill lands, and this answer follows it too.
	if vv := h.buildAfterRead(r, g.segID, v); vv.body != nil {
		defer vv.close()
		vv.kind = kind
		h.serveVariant(w, r, g, d, vv)
		return
	}
	// A SQLite stream holds a chunk buffer per reader: capped, and cut
	// when its client stalls (streamcap.go).
	sqliteStream := h.Store != nil && h.Store.Backend == backendSQLite && storeStreamed(body)
	if sqliteStream {
		if !h.sqliteStreams.acquire(r.Context(), h.slotWait) {
			h.overloaded(w, d)
			return
		}
		defer h.sqliteStreams.release()
	}
	writeBytesHeaders(w, g, br, rr, d)
	h.setVariantHeaders(w.Header(), g.segID, v)
	h.markCache(w, d, kind)
	w.WriteHeader(status)
	var n int64
	if sqliteStream {
		// Connection deadlines are wall-clock times: time.Now, not the
		// handler's injected clock.
		n, err = copyStalling(w, body, br.n, streamStallTimeout, serverWriteDeadline(r, start), time.Now)
	} else {
		n, err = copyBody(w, body, br.n)
	}
	h.metrics.via(d.legacy).bytes(n)
	h.metrics.cacheBytes(kind, n)
	h.metrics.codedBytes(compress.Identity, n)
	if err != nil {
		// The status line is gone, so the client must not see a clean
		// (short) end: abort the response. net/http closes the
		// connection (HTTP/1) or resets the stream (HTTP/2, HTTP/3)
		// without logging; Caddy does not recover the panic. The
		// deferred finish still records the decision.
		h.warnCorrupt(g.segID, err) // disktier.go
		if c := h.logger.Check(zapcore.DebugLevel, "segment body interrupted"); c != nil {
			c.Write(zap.String("segment_id", g.segID), zap.Error(err))
		}
		panic(http.ErrAbortHandler)
	}
}

// writeBytesHeaders sets the headers of a 200/206 answer and records the
// grant.
func writeBytesHeaders(w http.ResponseWriter, g grant, br byteRange, rr rangeResult, d *decision) {
	hdr := w.Header()
	setGrantHeaders(hdr, g, g.maxAge())
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Accept-Ranges", "bytes")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Length", strconv.FormatInt(br.n, 10))
	if rr == rangePartial {
		hdr.Set("Content-Range", br.contentRange(g.rec.ByteLength))
	}
	d.setOutcome(outcomeGranted)
}

// redirect answers 302 with a presigned GET of the segment's object that
// expires strictly before the grant ends. In the grant's last second or
// two no such URL can still be valid now (SigV4 counts whole seconds):
// the grant is live, so the edge streams the bytes itself, as in proxy
// delivery, rather than hand out a URL that outlives the grant.
func (h *Handler) redirect(w http.ResponseWriter, r *http.Request, g grant, d *decision) {
	start := time.Now()
	d.tr.presignAt = start // tracing.go
	u, expires, err := h.presignURL(r.Context(), g)
	d.presign = time.Since(start)
	h.metrics.storeOp(opPresign, d.presign)
	if errors.Is(err, presign.ErrGrantTooShort) || errors.Is(err, presign.ErrGrantEnded) {
		// Fall-back 2: the grant is too short for any URL.
		d.setDelivery(DeliveryProxy)
		h.stream(w, r, g, d)
		return
	}
	if err != nil {
		h.storeFault(w, r, d, "presign", err)
		return
	}
	life := int64(expires.Sub(g.now) / time.Second)
	if life < 0 {
		life = 0
	}
	setRedirectHeaders(w.Header(), life, u)
	d.setOutcome(outcomeGranted)
	h.markCache(w, d, cacheRedirect)
	w.WriteHeader(http.StatusFound)
}

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

// copyBody writes n bytes of body to w. A body held in memory (a bytes
// cache hit) goes out in one Write: no copy buffer is allocated and the
// connection gets one large write instead of 32 KiB chunks. A complete
// file of the disk tier goes to io.Copy in the shape that reaches
// sendfile(2) through the response writers between the handler and the
// connection (sendfile.go).
func copyBody(w io.Writer, body io.Reader, n int64) (int64, error) {
	if m, ok := body.(interface{ Bytes() []byte }); ok {
		if b := m.Bytes(); int64(len(b)) == n {
			k, err := w.Write(b)
			return int64(k), err
		}
	}
	if src := sendfileSource(w, body, n); src != nil {
		k, err := io.Copy(w, src) // not CopyN: its LimitedReader would hide the file
		if err == nil && k != n {
			err = io.ErrUnexpectedEOF
		}
		return k, err
	}
	return io.CopyN(w, body, n)
}
