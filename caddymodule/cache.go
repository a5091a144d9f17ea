package caddymodule

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/syncular/caddy-syncular/store"
)

// CacheConfig bounds the edge's in-memory cache in front of the store
// (records for a short TTL, verified segment bytes in an LRU) and its
// request coalescing, which is always on: concurrent requests for one
// segment share one store read. Unset fields take the defaults below; an
// explicit 0 disables that part.
type CacheConfig struct {
	// Budget of the bytes cache: segment bytes held in memory, fills in
	// progress included. Least recently used segments are evicted first.
	// Default: 64 MiB (67108864). 0 disables the bytes cache.
	MaxBytes *int64 `json:"max_bytes,omitempty"`

	// Largest segment kept in the bytes cache; larger ones stream from
	// the store on every request. Default: 8 MiB (8388608); capped at
	// max_bytes.
	MaxEntry *int64 `json:"max_entry,omitempty"`

	// How long a segment's record (its publications and, for SQLite, the
	// partitions' current epochs) is reused without reading the store.
	// This is the staleness allowed: a record deleted from the store, a
	// publication removed or a logEpoch rotated can still be granted for
	// up to record_ttl. Publication and token expiry stay exact (checked
	// per request), and a refusal is always decided on a fresh read.
	// Default: 2s. 0: every request reads the record.
	RecordTTL *caddy.Duration `json:"record_ttl,omitempty"`

	// Most records kept (least recently used evicted first). The bytes
	// cache learns a segment's length from here, so 0 also turns the
	// bytes cache off. Default: 10000.
	MaxRecords *int `json:"max_records,omitempty"`
}

// options returns the store options for c (nil: all defaults).
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

func (c *CacheConfig) validate() error {
	if c == nil {
		return nil
	}
	if (c.MaxBytes != nil && *c.MaxBytes < 0) || (c.MaxEntry != nil && *c.MaxEntry < 0) ||
		(c.RecordTTL != nil && *c.RecordTTL < 0) || (c.MaxRecords != nil && *c.MaxRecords < 0) {
		return errors.New("syncular_segments: cache sizes, record_ttl and max_records must not be negative")
	}
	return nil
}

// provisionCache puts the cache in front of the provisioned store. A
// shared SQLite handle gets one cache per handler instance.
func (h *Handler) provisionCache() error {
	if err := h.Cache.validate(); err != nil {
		return err
	}
	if h.store != nil {
		h.store = store.NewCached(h.store, h.Cache.options(time.Duration(h.StoreTimeout), h.now))
	}
	return nil
}

// unmarshalCache parses
//
//	cache {
//	    max_bytes   <size>      # default 64MiB; 0 disables the bytes cache
//	    max_entry   <size>      # default 8MiB
//	    record_ttl  <duration>  # default 2s; 0 disables the record cache
//	    max_records <n>         # default 10000
//	}
//
// Sizes are bytes or humanized ("64MiB", "512KiB"; "MB" means 10^6).
func (h *Handler) unmarshalCache(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	c := &CacheConfig{}
	h.Cache = c
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if seen[sub] {
			return d.Errf("cache: %s specified more than once", sub)
		}
		seen[sub] = true
		switch sub {
		case "max_bytes", "max_entry":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := humanize.ParseBytes(d.Val())
			if err != nil || n > 1<<50 {
				return d.Errf("cache: %s: bad size %q", sub, d.Val())
			}
			v := int64(n)
			if sub == "max_bytes" {
				c.MaxBytes = &v
			} else {
				c.MaxEntry = &v
			}
		case "record_ttl":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur < 0 {
				return d.Errf("cache: record_ttl: bad duration %q", d.Val())
			}
			v := caddy.Duration(dur)
			c.RecordTTL = &v
		case "max_records":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 0 {
				return d.Errf("cache: max_records must be a number >= 0, not %q", d.Val())
			}
			c.MaxRecords = &n
		default:
			return d.Errf("cache: unknown subdirective %q", sub)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

// copyBody writes n bytes of body to w. A body held in memory (a bytes
// cache hit) goes out in one Write: no copy buffer is allocated and the
// connection gets one large write instead of 32 KiB chunks.
func copyBody(w io.Writer, body io.Reader, n int64) (int64, error) {
	if m, ok := body.(interface{ Bytes() []byte }); ok {
		if b := m.Bytes(); int64(len(b)) == n {
			k, err := w.Write(b)
			return int64(k), err
		}
	}
	return io.CopyN(w, body, n)
}

// lookupContext bounds a record lookup by store_timeout. A store that
// bounds its own reads (the cache: a hit never waits, a miss waits on a
// shared read bounded by the same timeout, 504 when it runs out) needs no
// timer.
func (h *Handler) lookupContext(parent context.Context) (context.Context, context.CancelFunc) {
	if b, ok := h.store.(store.Bounded); ok && b.SharedTimeout() <= time.Duration(h.StoreTimeout) {
		return parent, func() {}
	}
	return h.storeContext(parent)
}

// presignURL is the presigned URL for g: straight from the presigner's
// cache when it is there (no timer, no I/O), else signed under
// store_timeout.
func (h *Handler) presignURL(parent context.Context, g grant) (string, time.Time, error) {
	notAfter := time.UnixMilli(g.untilMs)
	if u, exp, ok := h.presigner.CachedURL(g.segID, g.now, notAfter); ok {
		return u, exp, nil
	}
	ctx, cancel := h.storeContext(parent)
	defer cancel()
	return h.presigner.URL(ctx, g.segID, g.now, notAfter)
}

// revalidate returns a fresh record of segID when rec may have come from
// the record cache, so that a refusal is never decided on a stale record
// (a segment re-published with a later expiry, or a new publication, is
// granted at once). ok is false when rec is already fresh, or when the
// store cannot be read now (the decision then stands on rec).
func (h *Handler) revalidate(ctx context.Context, segID string, rec *store.Record) (*store.Record, bool) {
	rv, ok := h.store.(store.Revalidator)
	if !ok {
		return rec, false
	}
	fresh, ok, err := rv.Revalidate(ctx, segID, rec)
	if err != nil || !ok || fresh == nil {
		return rec, false
	}
	return fresh, true
}
