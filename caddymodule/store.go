package caddymodule

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/store"
)

// Store backends (StoreConfig.Backend).
const (
	backendSQLite = "sqlite"
	backendS3     = "s3"
)

// StoreConfig selects and configures the segment store the edge reads (it
// never writes it).
type StoreConfig struct {
	// The store: "sqlite" (the sync server's database file, on this host)
	// or "s3" (an S3-compatible bucket the sync server writes). Required.
	Backend string `json:"backend,omitempty"`

	// For "sqlite": path of the sync server's database file. It is opened
	// read-only, and one handle per file is shared across config reloads.
	// Required with "sqlite".
	Path string `json:"path,omitempty"`

	// For "s3": the bucket. Required with "s3".
	S3 *S3Config `json:"s3,omitempty"`
}

// check checks the store's configuration without opening it.
func (c *StoreConfig) check() error {
	if c == nil {
		return errors.New("a store is required (store sqlite <path> or store s3 {...})")
	}
	switch c.Backend {
	case backendSQLite:
		if c.Path == "" {
			return errors.New("store sqlite needs a database path")
		}
	case backendS3:
		if c.S3 == nil || c.S3.Bucket == "" {
			return errors.New("store s3 needs a bucket")
		}
	case "":
		return errors.New("store backend is required (sqlite or s3)")
	default:
		return fmt.Errorf("unknown store backend %q (want sqlite or s3)", c.Backend)
	}
	return nil
}

// provisionStore opens the configured store, puts the cache in front of
// it and resolves what the request path asks of it. The configuration
// has been checked (checkConfig, StoreConfig.check) before.
func (h *Handler) provisionStore(ctx caddy.Context, repl *caddy.Replacer) error {
	var err error
	switch h.Store.Backend {
	case backendSQLite:
		err = h.provisionSQLite()
	case backendS3:
		err = h.provisionS3(ctx, repl)
	}
	if err != nil {
		return err
	}
	opts := h.cacheOpts
	opts.OnBreaker = h.breakerLog()
	if opts.Disk, err = h.provisionDisk(); err != nil { // disktier.go
		return err
	}
	h.setStore(store.NewCached(h.backend, opts))
	return nil
}

// setStore makes c the handler's store and resolves, once, whether it
// bounds its lookups within store_timeout (a hit never waits, a miss
// waits on a shared read bounded by the cache's timeout), so that the
// request path needs no timer around them.
func (h *Handler) setStore(c *store.Cached) {
	h.store = c
	h.lookupBounded = c.SharedTimeout() <= time.Duration(h.StoreTimeout)
}

// breakerLog logs the transitions of the store's breaker: a warning when
// the store is found unreadable and requests stop waiting on it, and the
// recovery.
func (h *Handler) breakerLog() func(open bool, cause error) {
	logger, backend := h.logger, h.Store.Backend
	return func(open bool, cause error) {
		if open {
			logger.Warn("segment store unreadable: failing fast and probing it in the background; records read within grace keep deciding grants",
				zap.String("backend", backend), zap.Duration("grace", h.grace), zap.Error(cause))
			return
		}
		logger.Info("segment store answers again; breaker closed", zap.String("backend", backend))
	}
}
