// Package caddymodule is the Caddy side of caddy-syncular: the
// http.handlers.syncular_segments handler, its Caddyfile syntax and its
// lifecycle. It is the only package of this module that imports Caddy.
package caddymodule

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler serves Syncular segment downloads on signed URLs
// (`<mount>/segments/{segmentId}?st=<token>`): it verifies the token,
// checks the publication grant against the segment store, and serves,
// streams or redirects to the bytes. Requests without a token go to the
// next handler (normally reverse_proxy to the sync server).
type Handler struct {
	// HMAC keys that verify tokens, current key first. Every key
	// verifies (rotation). A key is UTF-8 text, or raw bytes written
	// "hex:<hex>" or "base64:<base64>". Placeholders such as
	// {env.SYNCULAR_KEY} or {file./run/secrets/key} are expanded once at
	// provision time; every placeholder must resolve to a non-empty value
	// (a literal brace is written \{). A key must have at least 16 bytes
	// of key material and not be all zero bytes: generate 32 random
	// bytes, e.g. `openssl rand -hex 32`, and write them hex:<64 digits>.
	// Required.
	Keys []string `json:"keys,omitempty"`

	// How the audience of a partition is derived. Required.
	Audience *AudienceConfig `json:"audience,omitempty"`

	// Clock skew tolerated on the token's exp: a token is accepted until
	// exp + skew. Default (absent): 60s, the reference's. 0 is zero skew
	// (a token is refused the moment its exp has passed), not the
	// default.
	Skew *caddy.Duration `json:"skew,omitempty"`

	// Where segments are read. Required.
	Store *StoreConfig `json:"store,omitempty"`

	// What to do with a request that has no st parameter: "next" (hand it
	// to the next handler unchanged) or "reject" (403 sync.forbidden).
	// Default: "next".
	Untokened string `json:"untokened,omitempty"`

	// How granted bytes reach the client: "serve" (the edge writes them),
	// "redirect" (302 to a presigned S3 URL, or to a CDN's signed URL
	// with cdn) or "proxy" (the edge streams the S3 object). Default:
	// "redirect" for an s3 store, "serve" for sqlite. "redirect" and
	// "proxy" need an s3 store; "serve" with an s3 store streams like
	// "proxy".
	Delivery string `json:"delivery,omitempty"`

	// What "redirect" delivery does with a segment whose S3 bytes object
	// carries an older writer's x-amz-meta-syncular-record header, which
	// holds the partition id and which a client following the redirect
	// would receive: "stream" (answer with the bytes as "proxy" delivery
	// does, counted as delivery="stream_legacy" in
	// caddy_syncular_requests_total) or "redirect" (redirect anyway).
	// Objects without the header are redirected either way. Only valid
	// with "redirect" delivery. Default: "stream".
	LegacyHeaders string `json:"legacy_headers,omitempty"`

	// Longest life of a presigned redirect URL, whole seconds from 1s to
	// 7 days. Default (absent or 0): 60s; a URL cannot live 0 s, so 0 in
	// JSON is "unset" and the Caddyfile refuses an explicit 0. The URL
	// never outlives the token or the publication either. Only valid with
	// "redirect" delivery (refused with the others, which presign nothing).
	PresignTTL caddy.Duration `json:"presign_ttl,omitempty"`

	// Redirect to a CDN's signed URLs (CloudFront) instead of presigned
	// bucket URLs; presign_ttl bounds their life too. Only with
	// "redirect" delivery and an s3 store. Default: none.
	CDN *CDNConfig `json:"cdn,omitempty"`

	// Bound on one store operation (a lookup, or opening the bytes). A
	// store slower than this is answered 504. Default (absent or 0): 5s;
	// a store cannot answer in no time, so 0 in JSON is "unset" and the
	// Caddyfile refuses an explicit 0.
	StoreTimeout caddy.Duration `json:"store_timeout,omitempty"`

	// Most distinct store reads running at once: record lookups and the
	// fills of the memory cache and the disk tier (requests joining a
	// read under way take no slot; streams of uncached bytes are not
	// counted). Reads beyond it wait their tenant's turn (round-robin by
	// verified audience) in a list bounded by store_queue and
	// store_queue_wait, then are answered 503 edge.overloaded with a
	// Retry-After. Default (absent): 16. 0: no cap.
	StoreConcurrency *int `json:"store_concurrency,omitempty"`

	// Most store reads waiting for a slot of store_concurrency; a read
	// beyond it is answered 503 edge.overloaded at once, or pushes out
	// the newest waiting read of the tenant with the most waiting when
	// its own tenant has fewer. Default (absent): 1024. 0: none wait.
	StoreQueue *int `json:"store_queue,omitempty"`

	// Longest a store read waits for a slot before its requests are
	// answered 503 edge.overloaded; keep it below store_timeout, which
	// bounds the wait and the read together. Default (absent or 0): 2s.
	StoreQueueWait caddy.Duration `json:"store_queue_wait,omitempty"`

	// How long a record read from the store keeps deciding grants once the
	// store cannot be read (a timeout, a refused connection, an HTTP 5xx,
	// a SQLite I/O or open error; never a "not found" or a refusal). The
	// bytes then come from the memory cache and the disk tier only: a
	// segment the edge does not hold answers 503 edge.store_unavailable.
	// Publication expiresAtMs and token exp still apply to the
	// millisecond; fences (logEpoch rotations), backfill checkpoints and
	// publications added or removed are seen as of the last successful
	// read, so a revocation written during an outage takes effect on the
	// edge when the store answers again or this long after that read,
	// whichever comes first. Default: 5m. 0 turns it off.
	Grace *caddy.Duration `json:"grace,omitempty"`

	// Tokens longer than this many bytes are refused before any crypto.
	// Default (absent or 0): 4096; 0 in JSON is "unset" and the
	// Caddyfile refuses an explicit 0.
	MaxTokenLength int `json:"max_token_length,omitempty"`

	// Turns off the caddy_syncular_* Prometheus metrics of this handler.
	// Default: false (metrics on).
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Probe an s3 store at provision (bucket, credentials, permissions;
	// bounded by store_timeout) and fail the config when it does not
	// answer: `caddy validate`, start-up and a reload then refuse a config
	// whose bucket is unreachable, and a reload keeps the running config.
	// false: only log a warning, so an edge can start while the bucket
	// has a blip. Only valid with an s3 store (refused with sqlite: a
	// sqlite store is always opened and checked at provision). Default:
	// true.
	VerifyStoreOnStart *bool `json:"verify_store_on_start,omitempty"`

	// In-memory record and bytes cache in front of the store, and request
	// coalescing. Default: on, with the defaults of each of its fields.
	Cache *CacheConfig `json:"cache,omitempty"`

	// Content codings for serve and proxy answers, in preference order:
	// a request gets the first one its Accept-Encoding accepts, once the
	// segment's variant has been built in memory (docs/large-segments.md, "Compression").
	// "zstd" and "gzip"; ["off"] turns compression off. Default (absent
	// or empty): ["zstd", "gzip"].
	Compress []string `json:"compress,omitempty"`

	// Add an RFC 9211 Cache-Status header to every answer that grants
	// (200, 206, 304, 302, HEAD): "caddy-syncular; hit; detail=memory",
	// "caddy-syncular; fwd=uri-miss; stored" and so on (cachestatus.go).
	// A refusal never carries one. Default: false.
	CacheStatus bool `json:"cache_status,omitempty"`

	// The cache's name in Cache-Status, a token (RFC 8941). Only with
	// cache_status. Default: "caddy-syncular".
	CacheStatusName string `json:"cache_status_name,omitempty"`

	// Key of {http.syncular.tenant} (HMAC-SHA256 of the verified
	// audience), with the rules of keys. Default: derived from the first
	// key under a fixed label, so the tenant values change when the first
	// key does; set this to keep them across a key rotation.
	TenantKey string `json:"tenant_key,omitempty"`

	// Resolved by setDefaults (defaults.go), defaults applied: what the
	// rest of provisioning reads.
	skew         time.Duration      // Skew
	grace        time.Duration      // Grace
	verifyStore  bool               // VerifyStoreOnStart
	pathStyle    bool               // Store.S3.PathStyle
	diskDir      string             // Cache.Disk; "" when the disk tier is off
	diskMaxBytes int64              // Cache.DiskMaxBytes
	cacheOpts    store.CacheOptions // Cache, StoreTimeout, Grace, the store read gate

	verifier  *token.Verifier
	presigner *presign.S3Signer
	cdn       *presign.CloudFrontSigner // cdn.go; nil: presigned bucket URLs
	audience  token.Audience
	backend   store.Store   // the configured store (SQLite, S3), set while provisioning
	store     *store.Cached // the cache in front of backend: what requests read
	// lookupBounded: the cache bounds its own lookups (no timer needed).
	lookupBounded bool
	poolKey       string          // set when the store came from the usage pool
	diskKey       string          // the disk tier's key in diskPool ("" when off)
	disk          *store.DiskTier // the disk tier (nil when off)
	life          *lifetime       // releases the store after the last in-flight request
	logger        *zap.Logger
	now           func() time.Time
	// wallClock: now is time.Now (setDefaults), so ServeHTTP may judge
	// tokens at the reading it takes anyway; false when a test or the
	// store command injects a clock.
	wallClock bool
	// inspecting: provisioned by `caddy syncular-store inspect`, whose
	// output is its report (provisionnotes.go logs no "provisioned").
	inspecting bool
	// weakKeysOK lets tests use the protocol vectors' short keys; no
	// configuration sets it.
	weakKeysOK bool

	metrics     *handlerMetrics // nil: metrics disabled
	scraped     *store.Cached   // the store's cache, reported at scrape time
	scrapedDisk *store.DiskTier // the disk tier, reported at scrape time

	codings []compress.Coding // Compress resolved; empty: off

	// streamLegacy: redirect delivery streams objects that carry a
	// legacy record header (LegacyHeaders "stream").
	streamLegacy bool

	obs observe // cache_status and tenant_key resolved (cachestatus.go)

	// sqliteStreams caps the answers streaming from a SQLite store at
	// once, and an answer past the cap waits slotWait for a slot
	// (streamcap.go); jitter(n) is a random int in [0, n), for the
	// Retry-After of the answers refused.
	sqliteStreams streamSlots
	slotWait      time.Duration
	jitter        func(n int) int
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.syncular_segments",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults, checks the whole configuration (no I/O before
// it passes), resolves secrets, opens the store and registers the
// metrics.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.life = new(lifetime)
	if err := h.checkIgnored(); err != nil { // guardrails.go
		return err
	}
	if err := h.setDefaults(); err != nil {
		return err
	}
	if err := h.checkConfig(); err != nil {
		return err
	}
	if err := h.Store.check(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	if err := h.buildAuth(repl); err != nil {
		return err
	}
	h.warnConfig(repl) // guardrails.go
	if err := h.provisionStore(ctx, repl); err != nil {
		return err
	}
	if err := h.provisionCompress(); err != nil {
		return err
	}
	h.logProvisioned() // provisionnotes.go
	return h.provisionMetrics(ctx)
}

// Validate checks the provisioned configuration (Provision ran the same
// checks before opening anything).
func (h *Handler) Validate() error {
	return h.checkConfig()
}

// checkConfig is every check of the options that needs no I/O, run on
// the configuration with its defaults applied.
func (h *Handler) checkConfig() error {
	switch h.Untokened {
	case untokenedNext, untokenedReject:
	default:
		return fmt.Errorf("untokened must be next or reject, not %q", h.Untokened)
	}
	switch h.Delivery {
	case DeliveryServe:
	case DeliveryRedirect, DeliveryProxy:
		if h.Store == nil || h.Store.Backend != backendS3 {
			return fmt.Errorf("delivery %s needs an s3 store", h.Delivery)
		}
	default:
		return fmt.Errorf("unknown delivery %q (want serve, redirect or proxy)", h.Delivery)
	}
	if err := h.checkLegacyHeaders(); err != nil {
		return err
	}
	if err := h.checkCDN(); err != nil { // cdn.go
		return err
	}
	if h.Delivery == DeliveryRedirect {
		ttl := time.Duration(h.PresignTTL)
		if ttl < time.Second {
			return errors.New("presign_ttl must be at least 1s")
		}
		if ttl > presign.MaxTTL || ttl%time.Second != 0 {
			return errors.New("presign_ttl must be whole seconds, at most 7 days")
		}
	}
	if _, err := compressPrefs(h.Compress); err != nil {
		return err
	}
	if err := h.checkDiskDir(); err != nil { // disktier.go
		return err
	}
	return h.Cache.check()
}

// checkLegacyHeaders checks legacy_headers: stream or redirect, and only
// with redirect delivery (the other modes never redirect).
func (h *Handler) checkLegacyHeaders() error {
	switch h.LegacyHeaders {
	case "":
		return nil
	case legacyHeadersStream, legacyHeadersRedirect:
	default:
		return fmt.Errorf("legacy_headers must be stream or redirect, not %q", h.LegacyHeaders)
	}
	if h.Delivery != DeliveryRedirect {
		return fmt.Errorf("legacy_headers applies to delivery redirect only (delivery is %s)", h.Delivery)
	}
	return nil
}

// Cleanup releases the store. It runs after a failed Provision too, so
// every field may be nil.
func (h *Handler) Cleanup() error {
	h.cleanupMetrics()
	key, st, be, dkey := h.poolKey, h.store, h.backend, h.diskKey
	h.poolKey, h.diskKey = "", ""
	if key == "" && st == nil && be == nil && dkey == "" {
		return nil
	}
	// On a reload Caddy cleans up the old config while its servers are
	// still finishing requests: release the store (and keep h.store
	// set) only once the last of them is done.
	var err error
	done := make(chan struct{})
	h.life.end(func() {
		if st != nil {
			st.Stop() // its breaker's probe; the inner store may be shared
		}
		if key != "" {
			err = releaseSQLite(key)
		} else if st != nil {
			err = st.Close() // and backend, its inner store
		} else if be != nil {
			err = be.Close() // provisioning failed before the cache was built
		}
		if derr := releaseDisk(dkey); err == nil {
			err = derr
		}
		close(done)
	})
	select {
	case <-done:
		return err
	default:
		return nil // released later, by the last in-flight request
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
