package caddymodule

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/store"
)

// The disk tier: segments too large for the memory cache are
// filled once into a directory, verified, and served from their files.
// One disk.Cache per directory and budget is shared across config reloads
// (diskPool), so a reload keeps the index and the fills in progress.

// DiskOff in cache.disk turns the disk tier off.
const DiskOff = "off"

// checkDiskDir refuses a disk directory that is a system directory (the
// root, /etc, /var, /tmp, $HOME, Caddy's own data and config directories
// ...): the tier removes files in its directory, so it must be one of its
// own. Whether an existing directory is the tier's (empty, marked, or
// holding only its files) is checked when it is opened (disk.New).
func (h *Handler) checkDiskDir() error {
	dir := h.diskDir
	if dir == "" {
		return nil
	}
	if store.DiskSystemDir(dir, caddy.AppDataDir(), caddy.AppConfigDir()) {
		return fmt.Errorf("cache disk %q is a system directory; the disk tier removes files in its directory, so give it one of its own (e.g. %s)",
			dir, defaultDiskDir())
	}
	return nil
}

// diskPool shares a disk.Cache per (directory, budget) across reloads.
var diskPool = caddy.NewUsagePool()

// pooledDisk is a shared disk tier. Its warnings go to the logger of the
// config that provisioned it last (an older config's logger may be
// closed by a reload).
type pooledDisk struct {
	*store.DiskTier
	logger *atomic.Pointer[zap.Logger]
}

func (p pooledDisk) Destruct() error { return p.DiskTier.Close() }

// provisionDisk returns the disk tier for h's cache config (nil when it
// is off). A directory that is not the tier's (not empty, no marker) fails
// the config, and so does one that cannot be used (not creatable, not
// writable) unless the tier is best effort (diskBestEffort); a best-effort
// tier warns and bypasses itself at request time. While Caddy only
// validates, the directory is checked and not opened, so validating
// creates nothing on disk.
func (h *Handler) provisionDisk() (*store.DiskTier, error) {
	dir := h.diskDir
	if dir == "" {
		return nil, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("cache disk %q: %w", dir, err)
	}
	if err := store.CheckDiskDir(abs); err != nil {
		if errors.Is(err, store.ErrDiskForeignDir) {
			return nil, fmt.Errorf("cache disk %s: %w", abs, err)
		}
		if !h.diskBestEffort() {
			return nil, fmt.Errorf("cache disk %s: %w; %s", abs, err, diskFix)
		}
		h.logger.Warn("disk tier directory unusable; serving large segments from the store until it is (disk_best_effort)",
			zap.String("dir", abs), zap.Error(err))
	}
	if validatingOnly() {
		return nil, nil
	}
	maxBytes := h.diskMaxBytes
	key := "disk:" + strconv.FormatInt(maxBytes, 10) + ":" + abs
	val, _, err := diskPool.LoadOrNew(key, func() (caddy.Destructor, error) {
		lp := new(atomic.Pointer[zap.Logger])
		lp.Store(h.logger)
		c, err := store.NewDiskTier(store.DiskOptions{Dir: abs, MaxBytes: maxBytes, Warn: func(msg string, err error) {
			l := lp.Load()
			if l == nil {
				return
			}
			if errors.Is(err, store.ErrStoreDown) || errors.Is(err, store.ErrOverloaded) {
				// A fill refused by the store's open breaker (its own
				// warning says it once) or by its read gate (counted
				// in store_reads_refused_total): not the disk's fault.
				l.Debug(msg, zap.String("dir", abs), zap.Error(err))
				return
			}
			l.Warn(msg, zap.String("dir", abs), zap.Error(err))
		}})
		if err != nil {
			return nil, err
		}
		return pooledDisk{DiskTier: c, logger: lp}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("cache disk %s: %w", abs, err)
	}
	p := val.(pooledDisk)
	p.logger.Store(h.logger)
	h.diskKey = key
	h.disk = p.DiskTier
	return p.DiskTier, nil
}

// diskFix is how to mend a disk directory that fails the config.
const diskFix = "create it and give it to the user Caddy runs as (the systemd unit in docs/production.md: StateDirectory), " +
	"point cache disk at a directory that user may write, set disk off, or set disk_best_effort to start without the tier"

// diskBestEffort reports whether an unusable disk directory only warns:
// disk_best_effort, or the default directory (no cache.disk).
func (h *Handler) diskBestEffort() bool {
	return h.Cache == nil || h.Cache.Disk == "" || h.Cache.DiskBestEffort
}

// releaseDisk gives back the handler's share of its disk tier.
func releaseDisk(key string) error {
	if key == "" {
		return nil
	}
	_, err := diskPool.Delete(key)
	return err
}

// Interface guards
var _ caddy.Destructor = pooledDisk{}
