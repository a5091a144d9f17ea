package caddymodule

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/store"
)

// The disk tier: segments too large for the memory cache are
// filled once into a directory, verified, and served from their files.
// One disk.Cache per directory and budget is shared across config reloads
// (diskPool), so a reload keeps the index and the fills in progress.

// DiskOff in cache.disk turns the disk tier off.
const DiskOff = "off"

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

// checkDiskDir refuses a disk directory that is a system directory (the
// root, /etc, /var, /tmp, $HOME, Caddy's own data and config directories
// ...): the tier removes files in its directory, so it must be one of its
// own. Whether an existing directory is the tier's (empty, marked, or
// holding only its files) is checked when it is opened (disk.New).
func (c *CacheConfig) checkDiskDir() error {
	dir := c.diskDir()
	if dir == "" {
		return nil
	}
	if store.DiskSystemDir(dir, caddy.AppDataDir(), caddy.AppConfigDir()) {
		return fmt.Errorf("syncular_segments: cache disk %q is a system directory; the disk tier removes files in its directory, so give it one of its own (e.g. %s)",
			dir, defaultDiskDir())
	}
	return nil
}

func (c *CacheConfig) diskMaxBytes() int64 {
	if c == nil || c.DiskMaxBytes == nil {
		return store.DefaultDiskMaxBytes
	}
	return *c.DiskMaxBytes
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
// the config; an unusable one (not creatable, read-only, full) is only a
// warning and a bypass at request time.
func (h *Handler) provisionDisk() (*store.DiskTier, error) {
	dir := h.Cache.diskDir()
	if dir == "" {
		return nil, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("syncular_segments: cache disk %q: %v", dir, err)
	}
	maxBytes := h.Cache.diskMaxBytes()
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
		return nil, fmt.Errorf("syncular_segments: cache disk %s: %v", abs, err)
	}
	p := val.(pooledDisk)
	p.logger.Store(h.logger)
	h.diskKey = key
	h.disk = p.DiskTier
	return p.DiskTier, nil
}

// releaseDisk gives back the handler's share of its disk tier.
func releaseDisk(key string) error {
	if key == "" {
		return nil
	}
	_, err := diskPool.Delete(key)
	return err
}

// parseDiskSub parses the disk tier's subdirectives of cache {}:
//
//	disk           <dir>|off  # default: <Caddy data dir>/syncular/segments; its own directory
//	disk_max_bytes <size>     # default 4GiB; 0 turns the disk tier off
func parseDiskSub(d *caddyfile.Dispenser, c *CacheConfig, sub string) error {
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	switch sub {
	case "disk":
		c.Disk = v
	case "disk_max_bytes":
		n, err := humanize.ParseBytes(v)
		if err != nil || n > 1<<50 {
			return d.Errf("cache: disk_max_bytes: bad size %q", v)
		}
		size := int64(n)
		c.DiskMaxBytes = &size
	}
	return nil
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

// diskCollector reports the counters of every live disk tier at scrape
// time (a tier shared by several handlers is counted once).
type diskCollector struct {
	disks refSet[*store.DiskTier, struct{}]

	bytes, files, reserved *prometheus.Desc
	hits, fills, followers *prometheus.Desc
	fillErrors, evictions  *prometheus.Desc
	discarded, bypasses    *prometheus.Desc
	handoffs               *prometheus.Desc
}

func newDiskCollector(prefix string) *diskCollector {
	p := prefix + "disk_"
	return &diskCollector{
		bytes:      prometheus.NewDesc(p+"bytes", "Bytes of the complete segment files the disk tier indexes.", nil, nil),
		files:      prometheus.NewDesc(p+"files", "Complete segment files the disk tier indexes.", nil, nil),
		reserved:   prometheus.NewDesc(p+"reserved_bytes", "Bytes the disk tier reserves for fills in progress.", nil, nil),
		hits:       prometheus.NewDesc(p+"hits_total", "Segment reads served from a complete, verified file of the disk tier.", nil, nil),
		fills:      prometheus.NewDesc(p+"fills_total", "Segments copied from the store into the disk tier and verified (one store read each).", nil, nil),
		followers:  prometheus.NewDesc(p+"followers_total", "Segment reads that joined a disk tier fill already running instead of reading the store.", nil, nil),
		fillErrors: prometheus.NewDesc(p+"fill_errors_total", "Disk tier fills that failed (store error, bytes not matching the id, disk fault). After a disk fault their readers continue from the store (handoffs_total); otherwise they were aborted.", nil, nil),
		handoffs:   prometheus.NewDesc(p+"handoffs_total", "Readers of a disk tier fill that failed on the disk (full, write error) that continued from the store, verified, instead of failing.", nil, nil),
		evictions:  prometheus.NewDesc(p+"evictions_total", "Files removed from the disk tier to stay within disk_max_bytes.", nil, nil),
		discarded:  prometheus.NewDesc(p+"discarded_total", "Files removed from the disk tier because their size or hash was wrong, or they changed (size, inode, mtime) since they were verified.", nil, nil),
		bypasses: prometheus.NewDesc(p+"bypasses_total",
			"Segment reads the disk tier declined (streamed from the store instead), by reason: too_large (over disk_max_bytes), no_room (budget held by fills), unavailable (directory unusable, disk full).", []string{"reason"}, nil),
	}
}

func (c *diskCollector) add(d *store.DiskTier)    { c.disks.add(d, struct{}{}) }
func (c *diskCollector) remove(d *store.DiskTier) { c.disks.remove(d) }

func (c *diskCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.files, c.reserved, c.hits, c.fills,
		c.followers, c.fillErrors, c.evictions, c.discarded, c.bypasses, c.handoffs} {
		ch <- d
	}
}

func (c *diskCollector) Collect(ch chan<- prometheus.Metric) {
	var s store.DiskStats
	c.disks.each(func(d *store.DiskTier, _ struct{}) {
		st := d.Stats()
		s.Bytes += st.Bytes
		s.Files += st.Files
		s.Reserved += st.Reserved
		s.Hits += st.Hits
		s.Fills += st.Fills
		s.Followers += st.Followers
		s.FillErrors += st.FillErrors
		s.Handoffs += st.Handoffs
		s.Evictions += st.Evictions
		s.Discarded += st.Discarded
		s.BypassTooLarge += st.BypassTooLarge
		s.BypassNoRoom += st.BypassNoRoom
		s.BypassUnavailable += st.BypassUnavailable
	})
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.bytes, s.Bytes)
	gauge(c.files, s.Files)
	gauge(c.reserved, s.Reserved)
	counter(c.hits, s.Hits)
	counter(c.fills, s.Fills)
	counter(c.followers, s.Followers)
	counter(c.fillErrors, s.FillErrors)
	counter(c.handoffs, s.Handoffs)
	counter(c.evictions, s.Evictions)
	counter(c.discarded, s.Discarded)
	counter(c.bypasses, s.BypassTooLarge, "too_large")
	counter(c.bypasses, s.BypassNoRoom, "no_room")
	counter(c.bypasses, s.BypassUnavailable, "unavailable")
}

// Interface guards
var (
	_ caddy.Destructor     = pooledDisk{}
	_ prometheus.Collector = (*diskCollector)(nil)
)
