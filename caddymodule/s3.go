package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
)

// Values of Handler.LegacyHeaders, and the delivery label of a request a
// redirect handler streamed because of a legacy record header.
const (
	legacyHeadersStream   = "stream"
	legacyHeadersRedirect = "redirect"
	deliveryStreamLegacy  = "stream_legacy"
)

// provisionS3 builds the S3 store (no network I/O: credentials from the
// SDK chain are fetched on first use) and, for redirect delivery, the
// presigner.
func (h *Handler) provisionS3(ctx caddy.Context, repl *caddy.Replacer) error {
	c := h.Store.S3
	if c == nil || c.Bucket == "" {
		return errors.New("syncular_segments: store s3 needs a bucket")
	}
	cfg := store.S3Config{
		Bucket:    repl.ReplaceKnown(c.Bucket, ""),
		Region:    repl.ReplaceKnown(c.Region, ""),
		Endpoint:  repl.ReplaceKnown(c.Endpoint, ""),
		Prefix:    repl.ReplaceKnown(c.Prefix, ""),
		PathStyle: c.PathStyle == nil || *c.PathStyle,
		Timeout:   time.Duration(h.StoreTimeout),
	}
	// Credentials: expanded once; errors name the setting, never the value.
	for _, f := range []struct {
		raw, what string
		dst       *string
	}{
		{c.AccessKeyID, "access_key_id", &cfg.AccessKeyID},
		{c.SecretAccessKey, "secret_access_key", &cfg.SecretAccessKey},
		{c.SessionToken, "session_token", &cfg.SessionToken},
	} {
		if f.raw == "" {
			continue
		}
		v := repl.ReplaceKnown(f.raw, "")
		if v == "" {
			return fmt.Errorf("syncular_segments: store s3 %s is empty (check the placeholder or environment variable it names)", f.what)
		}
		*f.dst = v
	}
	s, err := store.NewS3(ctx, cfg)
	if err != nil {
		return fmt.Errorf("syncular_segments: %v", err)
	}
	h.store = s
	if err := h.checkS3(ctx, s); err != nil {
		return err
	}
	if h.Delivery == DeliveryRedirect {
		p, err := presign.NewS3PresignerForStore(s, presign.S3PresignOptions{TTL: time.Duration(h.PresignTTL)})
		if err != nil {
			return fmt.Errorf("syncular_segments: presign: %v", err)
		}
		h.presigner = p
		h.streamLegacy = h.LegacyHeaders != legacyHeadersRedirect
	}
	return nil
}

// streamsLegacy reports whether a redirect handler answers rec with the
// bytes instead of a redirect: its S3 object carries an older writer's
// x-amz-meta-syncular-record header (whichever record the store used), and
// S3 returns user metadata on a presigned GET, so the client would receive
// the partition id (PROTOCOL.md §1 forbids it). Streaming sends only the
// edge's own headers. legacy_headers redirect turns this off.
func (h *Handler) streamsLegacy(rec *store.Record) bool {
	return h.streamLegacy && rec.LegacyHeader
}

// validateLegacyHeaders checks legacy_headers: stream or redirect, and
// only with redirect delivery (the other modes never redirect).
func (h *Handler) validateLegacyHeaders() error {
	switch h.LegacyHeaders {
	case "":
		return nil
	case legacyHeadersStream, legacyHeadersRedirect:
	default:
		return fmt.Errorf("syncular_segments: legacy_headers must be stream or redirect, not %q", h.LegacyHeaders)
	}
	if h.Delivery != DeliveryRedirect {
		return fmt.Errorf("syncular_segments: legacy_headers applies to delivery redirect only (delivery is %s)", h.Delivery)
	}
	return nil
}

// redirect answers 302 with a presigned GET of the segment's object that
// expires strictly before the grant ends. In the grant's last second or
// two no such URL can still be valid now (SigV4 counts whole seconds):
// the grant is live, so the edge streams the bytes itself, as in proxy
// delivery, rather than hand out a URL that outlives the grant.
func (h *Handler) redirect(w http.ResponseWriter, r *http.Request, g grant, d *decision) error {
	start := time.Now()
	u, expires, err := h.presignURL(r.Context(), g)
	d.presign = time.Since(start)
	h.metrics.storeOp(opPresign, d.presign)
	if errors.Is(err, presign.ErrS3GrantTooShort) || errors.Is(err, presign.ErrS3GrantEnded) {
		setPlaceholder(r, "delivery", DeliveryProxy)
		return h.serve(w, r, g, d)
	}
	if err != nil {
		h.storeFault(w, r, g.segID, "presign", err)
		return nil
	}
	life := int64(expires.Sub(g.now) / time.Second)
	if life < 0 {
		life = 0
	}
	hdr := w.Header()
	hdr.Set("Location", u)
	hdr.Set("Cache-Control", "private, max-age="+strconv.FormatInt(life, 10))
	setPlaceholder(r, "outcome", outcomeGranted)
	w.WriteHeader(http.StatusFound)
	return nil
}

// checkS3 probes the bucket once at provision (store.(*S3).Check: one
// ranged GET of a key that is never written, bounded by store_timeout).
// With verify_store_on_start (the default) an unreachable or misconfigured
// bucket fails the config, so `caddy validate` reports it and a reload
// never replaces a working config with a broken one; with
// verify_store_on_start false it is only a warning and the edge starts
// (requests then answer 503 until the bucket is back).
func (h *Handler) checkS3(ctx caddy.Context, s *store.S3) error {
	err := s.Check(ctx)
	if err == nil {
		return nil
	}
	where := fmt.Sprintf("bucket %q", s.Bucket())
	if h.Store.S3.Endpoint != "" {
		where += " at " + h.Store.S3.Endpoint
	}
	if h.VerifyStoreOnStart != nil && !*h.VerifyStoreOnStart {
		h.logger.Warn("s3 store unreachable at start; serving anyway (verify_store_on_start false)",
			zap.String("bucket", s.Bucket()), zap.Error(err))
		return nil
	}
	return fmt.Errorf("syncular_segments: store s3: %s unreachable at start (checked with a %v timeout; set verify_store_on_start false to start anyway): %v",
		where, time.Duration(h.StoreTimeout), err)
}
