// Package caddymodule is the Caddy side of caddy-syncular: the
// http.handlers.syncular_segments handler, its Caddyfile syntax and its
// lifecycle. It is the only package of this module that imports Caddy.
package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Delivery modes.
const (
	DeliveryServe    = "serve"    // the edge writes the bytes itself
	DeliveryRedirect = "redirect" // 302 to a presigned S3 URL
	DeliveryProxy    = "proxy"    // the edge streams the S3 object
)

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
	// exp + skew. Absent: 60s (the reference default). 0 is zero skew (a
	// token is refused the moment its exp has passed), not the default.
	Skew *caddy.Duration `json:"skew,omitempty"`

	// Where segments are read. Required.
	Store *StoreConfig `json:"store,omitempty"`

	// What to do with a request that has no st parameter: "next" (hand it
	// to the next handler unchanged; default) or "reject" (403
	// sync.forbidden).
	Untokened string `json:"untokened,omitempty"`

	// How granted bytes reach the client: "serve", "redirect" or
	// "proxy". Default: "redirect" for s3 stores, "serve" for sqlite.
	// "redirect" and "proxy" need an s3 store; "serve" with an s3 store
	// streams like "proxy".
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
	// 7 days. Absent or 0: 60s (a URL cannot live 0 s, so 0 in JSON is
	// "unset"; the Caddyfile refuses an explicit 0). The URL never
	// outlives the token or the publication either.
	PresignTTL caddy.Duration `json:"presign_ttl,omitempty"`

	// Bound on one store operation (a lookup, or opening the bytes).
	// Absent or 0: 5s (a store cannot answer in no time, so 0 in JSON is
	// "unset"; the Caddyfile refuses an explicit 0). A store slower than
	// this is answered 504.
	StoreTimeout caddy.Duration `json:"store_timeout,omitempty"`

	// Tokens longer than this are refused before any crypto. Absent or 0:
	// 4096 bytes (0 in JSON is "unset"; the Caddyfile refuses 0).
	MaxTokenLength int `json:"max_token_length,omitempty"`

	// Turns off the caddy_syncular_* Prometheus metrics of this handler.
	// Default: false (metrics on).
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Probe an s3 store at provision (bucket, credentials, permissions;
	// bounded by store_timeout) and fail the config when it does not
	// answer: `caddy validate`, start-up and a reload then refuse a config
	// whose bucket is unreachable, and a reload keeps the running config.
	// false: only log a warning, so an edge can start while the bucket
	// has a blip. Default: true. A sqlite store is always opened and
	// checked at provision.
	VerifyStoreOnStart *bool `json:"verify_store_on_start,omitempty"`

	// In-memory record and bytes cache in front of the store, and request
	// coalescing (see CacheConfig for every default). Default: on.
	Cache *CacheConfig `json:"cache,omitempty"`

	// Content codings for serve and proxy answers, in preference order:
	// a request gets the first one its Accept-Encoding accepts, once the
	// segment's variant has been built in memory (README "Compression").
	// "zstd" and "gzip"; ["off"] turns compression off. Default (absent
	// or empty): ["zstd", "gzip"].
	Compress []string `json:"compress,omitempty"`

	skew      time.Duration // Skew resolved (default applied)
	verifier  *presign.Verifier
	presigner *presign.S3Presigner
	audience  presign.Audience
	store     store.Store
	poolKey   string    // set when store came from the usage pool
	life      *lifetime // releases the store after the last in-flight request
	logger    *zap.Logger
	now       func() time.Time
	// weakKeysOK lets tests use the protocol vectors' short keys; no
	// configuration sets it.
	weakKeysOK bool

	metrics    *handlerMetrics // nil: metrics disabled
	statsCache cacheStatser    // the store's cache, reported in metrics

	codings  []compress.Coding  // Compress resolved; empty: off
	variants store.VariantStore // the store's variants; nil: none

	// streamLegacy: redirect delivery streams objects that carry a
	// legacy record header (LegacyHeaders "stream").
	streamLegacy bool
}

// AudienceConfig selects the audience rule (PROTOCOL.md §3).
type AudienceConfig struct {
	// "template" or "hmac_sha256".
	Kind string `json:"kind,omitempty"`
	// For "template": the text, "{partition}" replaced by the partition
	// id with plain string replacement (never a Caddy placeholder).
	Template string `json:"template,omitempty"`
	// For "hmac_sha256": the key (placeholders expanded at provision;
	// the same rules as keys: at least 16 bytes, not all zero).
	Key string `json:"key,omitempty"`
	// For "hmac_sha256": "hex" (default) or "base64url".
	Encoding string `json:"encoding,omitempty"`
}

// StoreConfig selects and configures the segment store.
type StoreConfig struct {
	// "sqlite" or "s3".
	Backend string `json:"backend,omitempty"`
	// For "sqlite": path of the sync server's database file. Opened
	// read-only; one handle per file is shared across config reloads.
	Path string `json:"path,omitempty"`
	// For "s3".
	S3 *S3Config `json:"s3,omitempty"`
}

// S3Config addresses an S3-compatible bucket (AWS S3, R2, MinIO...).
type S3Config struct {
	Bucket   string `json:"bucket,omitempty"`
	Region   string `json:"region,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	Prefix   string `json:"prefix,omitempty"`
	// Static credentials (placeholders expanded at provision). Omit
	// both to use the SDK's default credential chain.
	AccessKeyID     string `json:"access_key_id,omitempty"`
	SecretAccessKey string `json:"secret_access_key,omitempty"`
	SessionToken    string `json:"session_token,omitempty"`
	// Path-style addressing. Default: true (the reference layout).
	PathStyle *bool `json:"path_style,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.syncular_segments",
		New: func() caddy.Module { return new(Handler) },
	}
}

// sqlitePool shares one read-only handle per database file across config
// reloads: the new config loads it before the old one is cleaned up.
var sqlitePool = caddy.NewUsagePool()

type pooledSQLite struct{ *store.SQLite }

func (p pooledSQLite) Destruct() error { return p.SQLite.Close() }

// Provision sets defaults, resolves secrets, opens the store and
// registers the metrics.
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := h.provision(ctx); err != nil {
		return err
	}
	if err := h.provisionCache(); err != nil {
		return err
	}
	if err := h.provisionCompress(); err != nil {
		return err
	}
	return h.provisionMetrics(ctx)
}

func (h *Handler) provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.life = new(lifetime)
	repl := caddy.NewReplacer()
	if err := h.setDefaults(); err != nil {
		return err
	}
	if err := h.buildAuth(repl); err != nil {
		return err
	}
	if h.Store == nil {
		return errors.New("syncular_segments: a store is required (store sqlite <path> or store s3 {...})")
	}
	switch h.Store.Backend {
	case "sqlite":
		return h.provisionSQLite()
	case "s3":
		return h.provisionS3(ctx, repl)
	case "":
		return errors.New("syncular_segments: store backend is required (sqlite or s3)")
	default:
		return fmt.Errorf("syncular_segments: unknown store backend %q (want sqlite or s3)", h.Store.Backend)
	}
}

// setDefaults fills every unset option with its documented default.
func (h *Handler) setDefaults() error {
	if h.logger == nil {
		h.logger = zap.NewNop()
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.skew = presign.DefaultSkew
	if h.Skew != nil {
		h.skew = time.Duration(*h.Skew)
	}
	if h.PresignTTL == 0 {
		h.PresignTTL = caddy.Duration(60 * time.Second)
	}
	if h.StoreTimeout == 0 {
		h.StoreTimeout = caddy.Duration(store.DefaultTimeout)
	}
	if h.MaxTokenLength == 0 {
		h.MaxTokenLength = presign.DefaultMaxTokenLen
	}
	if h.Untokened == "" {
		h.Untokened = "next"
	}
	if h.Delivery == "" {
		h.Delivery = DeliveryServe
		if h.Store != nil && h.Store.Backend == "s3" {
			h.Delivery = DeliveryRedirect
		}
	}
	if h.skew < 0 || h.PresignTTL < 0 || h.StoreTimeout < 0 || h.MaxTokenLength < 0 {
		return errors.New("syncular_segments: skew, presign_ttl, store_timeout and max_token_length must not be negative")
	}
	return nil
}

// buildAuth decodes the keys and the audience rule.
func (h *Handler) buildAuth(repl *caddy.Replacer) error {
	if len(h.Keys) == 0 {
		return errors.New("syncular_segments: at least one key is required")
	}
	keys := make([][]byte, 0, len(h.Keys))
	for i, k := range h.Keys {
		kb, err := secret(repl, k, fmt.Sprintf("key %d", i+1), h.weakKeysOK)
		if err != nil {
			return err
		}
		keys = append(keys, kb)
	}
	h.verifier = presign.NewVerifier(keys, h.skew, h.MaxTokenLength)
	aud, err := h.Audience.build(repl, h.weakKeysOK)
	if err != nil {
		return err
	}
	h.audience = aud
	return nil
}

func (h *Handler) provisionSQLite() error {
	if h.Store.Path == "" {
		return errors.New("syncular_segments: store sqlite needs a database path")
	}
	abs, err := filepath.Abs(h.Store.Path)
	if err != nil {
		return fmt.Errorf("syncular_segments: store sqlite path: %v", err)
	}
	key := "sqlite:" + abs
	val, _, err := sqlitePool.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := store.OpenSQLite(abs, store.SQLiteOptions{})
		if err != nil {
			return nil, err
		}
		return pooledSQLite{s}, nil
	})
	if err != nil {
		return fmt.Errorf("syncular_segments: opening sqlite store %s: %v", abs, err)
	}
	h.poolKey = key
	h.store = val.(pooledSQLite).SQLite
	return nil
}

// MinKeyBytes is the least key material a configured HMAC key (token or
// audience) may have.
const MinKeyBytes = 16

// secret expands global placeholders ({env.*}, {file.*}) in a configured
// secret, decodes it and refuses weak key material (unless weakOK, tests
// only). Errors name the setting, never the value.
func secret(repl *caddy.Replacer, raw, what string, weakOK bool) ([]byte, error) {
	v, err := expandSecret(repl, raw, what)
	if err != nil {
		return nil, err
	}
	if v == "" {
		return nil, fmt.Errorf("syncular_segments: %s is empty (check the placeholder or environment variable it names)", what)
	}
	b, err := presign.ParseKey(v)
	if err != nil {
		return nil, fmt.Errorf("syncular_segments: %s: %v", what, err)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("syncular_segments: %s is empty", what)
	}
	if weakOK {
		return b, nil
	}
	if err := checkKeyStrength(b); err != nil {
		return nil, fmt.Errorf("syncular_segments: %s %v", what, err)
	}
	return b, nil
}

// expandSecret replaces every placeholder of raw, and refuses one that
// does not resolve to a non-empty value: `{env.MISSING}x` would otherwise
// become the key "x". An unknown placeholder is not named (it may be part
// of a literal secret).
func expandSecret(repl *caddy.Replacer, raw, what string) (string, error) {
	var bad error
	v, err := repl.ReplaceFunc(raw, func(name string, val any) (any, error) {
		if caddy.ToString(val) != "" {
			return val, nil
		}
		switch {
		case strings.HasPrefix(name, "env."):
			bad = fmt.Errorf("syncular_segments: %s: environment variable %s is unset or empty", what, strings.TrimPrefix(name, "env."))
		case strings.HasPrefix(name, "file."):
			bad = fmt.Errorf("syncular_segments: %s: file %s is missing, unreadable or empty", what, strings.TrimPrefix(name, "file."))
		default:
			bad = fmt.Errorf("syncular_segments: %s has a placeholder that is not known at provision (only {env.*} and {file.*} are expanded; write a literal brace as \\{)", what)
		}
		return nil, bad
	})
	if bad != nil {
		return "", bad
	}
	if err != nil {
		return "", fmt.Errorf("syncular_segments: %s: malformed placeholder", what)
	}
	return v, nil
}

// checkKeyStrength refuses key material an attacker could guess: under
// MinKeyBytes bytes, or all zero bytes (hex:00 is the empty HMAC key in
// disguise: HMAC pads keys with zeros). The error never shows the key.
func checkKeyStrength(b []byte) error {
	const how = "use 32 random bytes, e.g. `openssl rand -hex 32`, written hex:<64 hex digits>"
	if len(b) < MinKeyBytes {
		return fmt.Errorf("is too short: at least %d bytes of key material are required (%s)", MinKeyBytes, how)
	}
	zero := true
	for _, c := range b {
		if c != 0 {
			zero = false
			break
		}
	}
	if zero {
		return fmt.Errorf("is all zero bytes (%s)", how)
	}
	return nil
}

func (a *AudienceConfig) build(repl *caddy.Replacer, weakOK bool) (presign.Audience, error) {
	if a == nil {
		return nil, errors.New("syncular_segments: an audience rule is required (audience template <text> or audience hmac_sha256 <key>)")
	}
	switch a.Kind {
	case "template":
		if a.Template == "" {
			return nil, errors.New("syncular_segments: audience template is empty")
		}
		if !strings.Contains(a.Template, "{partition}") {
			return nil, errors.New("syncular_segments: audience template must contain {partition}")
		}
		return presign.TemplateAudience(a.Template), nil
	case "hmac_sha256":
		key, err := secret(repl, a.Key, "audience hmac_sha256 key", weakOK)
		if err != nil {
			return nil, err
		}
		aud, err := presign.HMACAudience(key, a.Encoding)
		if err != nil {
			return nil, fmt.Errorf("syncular_segments: audience hmac_sha256: %v", err)
		}
		return aud, nil
	default:
		return nil, fmt.Errorf("syncular_segments: unknown audience kind %q (want template or hmac_sha256)", a.Kind)
	}
}

// Validate checks the provisioned configuration.
func (h *Handler) Validate() error {
	switch h.Untokened {
	case "next", "reject":
	default:
		return fmt.Errorf("syncular_segments: untokened must be next or reject, not %q", h.Untokened)
	}
	switch h.Delivery {
	case DeliveryServe:
	case DeliveryRedirect, DeliveryProxy:
		if h.Store == nil || h.Store.Backend != "s3" {
			return fmt.Errorf("syncular_segments: delivery %s needs an s3 store", h.Delivery)
		}
	default:
		return fmt.Errorf("syncular_segments: unknown delivery %q (want serve, redirect or proxy)", h.Delivery)
	}
	if err := h.validateLegacyHeaders(); err != nil {
		return err
	}
	if h.Delivery == DeliveryRedirect && time.Duration(h.PresignTTL) < time.Second {
		return errors.New("syncular_segments: presign_ttl must be at least 1s")
	}
	return nil
}

// Cleanup releases the store. It runs after a failed Provision too, so
// every field may be nil.
func (h *Handler) Cleanup() error {
	h.cleanupMetrics()
	key, st := h.poolKey, h.store
	h.poolKey = ""
	if key == "" && st == nil {
		return nil
	}
	// On a reload Caddy cleans up the old config while its servers are
	// still finishing requests: release the store (and keep h.store
	// set) only once the last of them is done.
	var err error
	done := make(chan struct{})
	h.life.end(func() {
		if key != "" {
			_, err = sqlitePool.Delete(key)
		} else {
			err = st.Close()
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

// storeContext bounds one store operation.
func (h *Handler) storeContext(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, time.Duration(h.StoreTimeout))
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
