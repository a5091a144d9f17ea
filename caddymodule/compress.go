package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store"
)

// Compressed delivery (docs/large-segments.md "Compression", protocol §6): serve and
// proxy answers (and a redirect handler's streamed fall-backs) send a
// zstd or gzip variant of the segment when the request's Accept-Encoding
// allows it and the variant is held (in the bytes cache, or as a file of
// the disk tier for a large segment: sent with sendfile by copyBody). A
// variant is built once per (segment, coding) in the background from
// verified identity bytes (store.Cached.Variant); until it exists, the
// request gets identity (nobody waits for a build), except for a large
// segment being filled into the disk tier: its variant is encoded as the
// fill lands and requests follow it as it grows (no Content-Length; the
// body fails, and the answer is aborted, unless it verifies).

// compressOff is the value of Compress that turns compression off.
const compressOff = "off"

// compressPrefs resolves Handler.Compress: nil or empty is the default
// order (zstd, gzip); ["off"] is none (an empty, non-nil slice). Every
// other list names codings, each once.
func compressPrefs(list []string) ([]compress.Coding, error) {
	if len(list) == 0 {
		return compress.DefaultPrefs(), nil
	}
	if len(list) == 1 && list[0] == compressOff {
		return []compress.Coding{}, nil
	}
	prefs := make([]compress.Coding, 0, len(list))
	for _, name := range list {
		c, ok := compress.ParseCoding(name)
		if !ok || c == compress.Identity || name != c.String() {
			return nil, fmt.Errorf("syncular_segments: compress: unknown coding %q (want zstd, gzip, or off alone)", name)
		}
		if slices.Contains(prefs, c) {
			return nil, fmt.Errorf("syncular_segments: compress: %s listed twice", name)
		}
		prefs = append(prefs, c)
	}
	return prefs, nil
}

// compressing reports whether this handler may send a coded answer.
func (h *Handler) compressing() bool { return len(h.codings) > 0 && h.variants != nil }

// variantChoice is what a streamed answer sends: identity (body nil) or
// a variant held now.
type variantChoice struct {
	coding compress.Coding // of the body: Identity, or the variant's
	body   io.ReadCloser   // the variant; nil for identity
	size   int64
	// wanted is the coding the request negotiated; retry is set when its
	// variant could not be built because the identity bytes were not in
	// memory yet: once identity is read, asking again starts the build.
	wanted compress.Coding
	retry  bool
	// kind, when set, is the answer's cache kind instead of the body's
	// (the request whose open started the fill the variant follows).
	kind cacheKind
}

// chooseVariant negotiates the request's Accept-Encoding against the
// configured codings and looks the variant up (starting its build in the
// background when it is missing and can be built). full is false for a
// Range request: ranges are answered from the identity bytes.
func (h *Handler) chooseVariant(r *http.Request, segID string, full bool) variantChoice {
	if !full || !h.compressing() {
		return variantChoice{}
	}
	want := compress.NegotiateValues(r.Header.Values("Accept-Encoding"), h.codings)
	if want == compress.Identity {
		return variantChoice{}
	}
	body, size, st := h.variants.Variant(segID, want)
	if st == store.VariantBuilding && h.waitBuild(r, segID, want) {
		body, size, st = h.variants.Variant(segID, want)
	}
	switch st {
	case store.VariantReady, store.VariantFollowing: // following: size -1
		return variantChoice{coding: want, body: body, size: size, wanted: want}
	case store.VariantUnavailable:
		return variantChoice{wanted: want, retry: true}
	}
	return variantChoice{wanted: want}
}

// waitBuild waits for the build of a small segment's variant under way
// when it should end before identity would have reached a mobile client
// (store.WaitBound); it reports whether the build ended. A GET only: a
// HEAD sends no body to wait for.
func (h *Handler) waitBuild(r *http.Request, segID string, c compress.Coding) bool {
	w, ok := h.variants.(store.VariantWaiter)
	return ok && r.Method == http.MethodGet && w.WaitVariant(r.Context(), segID, c)
}

// buildAfterRead asks again for a variant that was unavailable before the
// identity bytes were opened: the open put them in memory, or started the
// disk tier's fill, so the build can start now rather than on the next
// request. A variant that can be sent now (a large segment's, encoded as
// its fill lands, or a small segment's whose build ended within
// waitBuild's wait) is returned: the caller sends it instead of identity.
func (h *Handler) buildAfterRead(r *http.Request, segID string, v variantChoice) variantChoice {
	if !v.retry {
		return variantChoice{}
	}
	body, size, st := h.variants.Variant(segID, v.wanted)
	if st == store.VariantBuilding && h.waitBuild(r, segID, v.wanted) { // the build it started
		body, size, st = h.variants.Variant(segID, v.wanted)
	}
	switch {
	case (st == store.VariantFollowing || st == store.VariantReady) && body != nil:
		return variantChoice{coding: v.wanted, body: body, size: size, wanted: v.wanted}
	case body != nil:
		body.Close()
	}
	return variantChoice{}
}

func (v variantChoice) close() {
	if v.body != nil {
		v.body.Close()
	}
}

// etag is the entity-tag of the answer: "<segmentId>" for identity,
// "<segmentId>+zstd" for a variant.
func (v variantChoice) etag(segID string) string { return compress.ETag(segID, v.coding) }

// setVariantHeaders sets what a coded or codable answer adds to the
// grant headers: Vary (on every answer of a compressing handler, identity
// included, so a shared cache keys on Accept-Encoding), and for a variant
// its ETag and Content-Encoding.
func (h *Handler) setVariantHeaders(hdr http.Header, segID string, v variantChoice) {
	if h.compressing() {
		hdr.Add("Vary", "Accept-Encoding")
	}
	if v.coding != compress.Identity {
		hdr.Set("ETag", v.etag(segID))
		hdr.Set("Content-Encoding", v.coding.String())
	}
}

// notModified reports whether If-None-Match lets a streaming answer be a
// 304: any variant's ETag matches when compressing (every variant decodes
// to the same bytes), only the identity one otherwise.
func (h *Handler) notModified(r *http.Request, segID string) bool {
	inm := r.Header.Values("If-None-Match")
	if len(inm) == 0 {
		return false
	}
	if h.compressing() {
		return compress.MatchIfNoneMatch(segID, inm...)
	}
	return etagMatches(inm[0], compress.ETag(segID, compress.Identity))
}

// serveVariant writes a held variant: 200 with Content-Encoding, the
// variant's length and ETag (HEAD: the same headers, no body). A variant
// still being encoded (size -1) has no Content-Length (HTTP/1.1 sends it
// chunked); its body ends only after it verified, and fails otherwise,
// which aborts the answer like any interrupted body.
func (h *Handler) serveVariant(w http.ResponseWriter, r *http.Request, g grant, d *decision, v variantChoice) {
	writeBytesHeaders(w, g, byteRange{off: 0, n: v.size}, rangeNone, d)
	if v.size < 0 {
		w.Header().Del("Content-Length")
	}
	h.setVariantHeaders(w.Header(), g.segID, v)
	kind := variantKind(v.body) // cachestatus.go
	if v.kind != cacheNone {
		kind = v.kind
	}
	d.tr.coding = v.coding.String()
	if r.Method == http.MethodHead {
		kind = cacheRecord
	}
	h.markCache(w, d, kind)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	var n int64
	var err error
	if v.size < 0 {
		store.BindContext(r.Context(), v.body) // stop waiting when the client goes
		n, err = io.Copy(w, v.body)
	} else {
		n, err = copyBody(w, v.body, v.size)
	}
	h.metrics.via(d.legacy).bytes(n)
	h.metrics.cacheBytes(kind, n)
	h.metrics.codedBytes(v.coding, n)
	if err != nil {
		// As for identity bytes: the status line is gone, abort.
		if c := h.logger.Check(zapcore.DebugLevel, "segment body interrupted"); c != nil {
			c.Write(zap.String("segment_id", g.segID), zap.String("coding", v.coding.String()), zap.Error(err))
		}
		panic(http.ErrAbortHandler)
	}
}

// provisionCompress resolves Compress (checkConfig checked it) and finds
// the store's variants (the bytes cache).
func (h *Handler) provisionCompress() error {
	prefs, err := compressPrefs(h.Compress)
	if err != nil {
		return err
	}
	h.codings = prefs
	if vs, ok := h.store.(store.VariantStore); ok && len(prefs) > 0 {
		h.variants = vs
	}
	return nil
}

// setNotModifiedHeaders sets the ETag of what a GET would send now, and
// Vary, on a 304 of a streaming answer.
func (h *Handler) setNotModifiedHeaders(hdr http.Header, r *http.Request, segID string) {
	v := h.chooseVariant(r, segID, r.Header.Get("Range") == "")
	v.close()
	hdr.Set("ETag", v.etag(segID))
	if h.compressing() {
		hdr.Add("Vary", "Accept-Encoding")
	}
}
