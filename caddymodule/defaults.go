package caddymodule

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// Every default of the handler's configuration, in one place. The field
// docs and the Caddyfile syntax state the same values; setDefaults applies
// them all, before any check or I/O, and the rest of provisioning reads
// the values it resolved. The cache's defaults are the store package's
// (store.DefaultMaxBytes, store.DefaultMaxEntry, store.DefaultRecordTTL,
// store.DefaultMaxRecords), applied by CacheConfig.options. The compress
// default is the compress package's (compress.DefaultPrefs: zstd, then
// gzip), applied by compressPrefs.
const (
	defaultSkew           = token.DefaultSkew         // skew: 60s, the reference's
	defaultPresignTTL     = presign.DefaultTTL        // presign_ttl: 60s
	defaultStoreTimeout   = store.DefaultTimeout      // store_timeout
	defaultMaxTokenLength = token.DefaultMaxTokenLen  // max_token_length: 4096 bytes
	defaultUntokened      = untokenedNext             // untokened
	defaultLegacyHeaders  = legacyHeadersStream       // legacy_headers
	defaultPathStyle      = true                      // store s3 path_style
	defaultVerifyStore    = true                      // verify_store_on_start
	defaultGrace          = store.DefaultGrace        // grace: 5m
	defaultDiskMaxBytes   = store.DefaultDiskMaxBytes // cache disk_max_bytes: 4GiB
	defaultCacheStatus    = DefaultCacheStatusName    // cache_status_name

	defaultStoreConcurrency = store.DefaultStoreSlots     // store_concurrency: 16
	defaultStoreQueue       = store.DefaultStoreQueue     // store_queue: 1024
	defaultStoreQueueWait   = store.DefaultStoreQueueWait // store_queue_wait: 2s
)

// Values of Handler.Untokened.
const (
	untokenedNext   = "next"
	untokenedReject = "reject"
)

// Values of Handler.LegacyHeaders.
const (
	legacyHeadersStream   = "stream"
	legacyHeadersRedirect = "redirect"
)

// defaultDelivery is the delivery of a handler that names none: the edge
// serves a SQLite store's bytes itself and redirects to an S3 store.
func defaultDelivery(backend string) string {
	if backend == backendS3 {
		return DeliveryRedirect
	}
	return DeliveryServe
}

// fairOptions is the store read gate of store_concurrency, store_queue
// and store_queue_wait (setDefaults filled StoreQueueWait).
func (h *Handler) fairOptions() store.FairOptions {
	o := store.FairOptions{Slots: defaultStoreConcurrency, QueueMax: defaultStoreQueue, QueueWait: time.Duration(h.StoreQueueWait)}
	if h.StoreConcurrency != nil {
		o.Slots = *h.StoreConcurrency
	}
	if h.StoreQueue != nil {
		o.QueueMax = *h.StoreQueue
	}
	// store_concurrency is a ceiling: the reads admitted at once follow
	// the store's latency (store/adaptive.go).
	o.Adaptive = true
	return o
}

// options returns the store options for c (nil: all defaults, which are
// store.DefaultCacheOptions).
func (c *CacheConfig) options(timeout time.Duration, now func() time.Time) store.CacheOptions {
	o := store.DefaultCacheOptions()
	o.Timeout = timeout
	o.Now = now
	if c == nil {
		return o
	}
	if c.MaxBytes != nil {
		o.MaxBytes = *c.MaxBytes
	}
	if c.MaxEntry != nil {
		o.MaxEntry = *c.MaxEntry
	}
	if c.RecordTTL != nil {
		o.RecordTTL = time.Duration(*c.RecordTTL)
	}
	if c.MaxRecords != nil {
		o.MaxRecords = *c.MaxRecords
	}
	return o
}

// defaultDiskDir is the disk tier's directory when cache.disk is unset:
// <Caddy's data dir>/syncular/segments.
func defaultDiskDir() string {
	return filepath.Join(caddy.AppDataDir(), "syncular", "segments")
}

// diskDir is the directory of the disk tier, "" when it is off.
func (c *CacheConfig) diskDir() string {
	if c == nil {
		return defaultDiskDir()
	}
	if c.Disk == DiskOff || (c.DiskMaxBytes != nil && *c.DiskMaxBytes == 0) {
		return ""
	}
	if c.Disk == "" {
		return defaultDiskDir()
	}
	return c.Disk
}

// diskMaxBytes is the disk tier's budget: disk_max_bytes or its default.
func (c *CacheConfig) diskMaxBytes() int64 {
	if c == nil || c.DiskMaxBytes == nil {
		return defaultDiskMaxBytes
	}
	return *c.DiskMaxBytes
}

// setDefaults fills every unset option with its default. It does no I/O.
func (h *Handler) setDefaults() error {
	if h.logger == nil {
		h.logger = zap.NewNop()
	}
	if h.now == nil {
		h.now = time.Now
		h.wallClock = true // ServeHTTP judges tokens at its start reading
	}
	if h.jitter == nil {
		h.jitter = rand.IntN
	}
	if h.sqliteStreams == nil {
		h.sqliteStreams = newStreamSlots(maxSQLiteStreams, maxSQLiteWaiters) // streamcap.go
		h.slotWait = streamSlotWait
	}
	h.skew = defaultSkew
	if h.Skew != nil {
		h.skew = time.Duration(*h.Skew)
	}
	h.grace = defaultGrace
	if h.Grace != nil {
		h.grace = time.Duration(*h.Grace)
	}
	if h.PresignTTL == 0 {
		h.PresignTTL = caddy.Duration(defaultPresignTTL)
	}
	if h.StoreTimeout == 0 {
		h.StoreTimeout = caddy.Duration(defaultStoreTimeout)
	}
	if h.StoreQueueWait == 0 {
		h.StoreQueueWait = caddy.Duration(defaultStoreQueueWait)
	}
	if (h.StoreConcurrency != nil && *h.StoreConcurrency < 0) || (h.StoreQueue != nil && *h.StoreQueue < 0) || h.StoreQueueWait < 0 {
		return errors.New("store_concurrency, store_queue and store_queue_wait must not be negative")
	}
	if h.MaxTokenLength == 0 {
		h.MaxTokenLength = defaultMaxTokenLength
	}
	if h.Untokened == "" {
		h.Untokened = defaultUntokened
	}
	if h.Delivery == "" {
		backend := ""
		if h.Store != nil {
			backend = h.Store.Backend
		}
		h.Delivery = defaultDelivery(backend)
	}
	if h.Delivery == DeliveryRedirect && h.LegacyHeaders == "" {
		h.LegacyHeaders = defaultLegacyHeaders // the other deliveries refuse it
	}
	if h.CacheStatus && h.CacheStatusName == "" {
		h.CacheStatusName = defaultCacheStatus // without cache_status it is refused
	}
	h.verifyStore = defaultVerifyStore
	if h.VerifyStoreOnStart != nil {
		h.verifyStore = *h.VerifyStoreOnStart
	}
	h.pathStyle = defaultPathStyle
	if h.Store != nil && h.Store.S3 != nil && h.Store.S3.PathStyle != nil {
		h.pathStyle = *h.Store.S3.PathStyle
	}
	h.diskDir, h.diskMaxBytes = h.Cache.diskDir(), h.Cache.diskMaxBytes()
	if h.skew < 0 || h.grace < 0 || h.PresignTTL < 0 || h.StoreTimeout < 0 || h.MaxTokenLength < 0 {
		return errors.New("skew, grace, presign_ttl, store_timeout and max_token_length must not be negative")
	}
	h.cacheOpts = h.Cache.options(time.Duration(h.StoreTimeout), h.now)
	h.cacheOpts.Grace = h.grace
	h.cacheOpts.Fair = h.fairOptions() // fair.go of the store package
	return nil
}
