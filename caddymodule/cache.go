package caddymodule

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
)

// CacheConfig bounds the edge's in-memory cache in front of the store
// (records for a short TTL, verified segment bytes in an LRU) and its
// request coalescing, which is always on: concurrent requests for one
// segment share one store read. An unset field takes its default; an
// explicit 0 turns that part off.
type CacheConfig struct {
	// Budget of the bytes cache: segment bytes held in memory, fills in
	// progress included. Least recently used segments are evicted first.
	// Default: 64 MiB (67108864). 0 turns the bytes cache off.
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
	// per request), and a refusal is decided on a fresh read: a refusal
	// decided so is remembered for 1s at most (never longer than
	// record_ttl), so a segment re-published meanwhile is granted within
	// that second. Default: 2s. 0: every request reads the record.
	RecordTTL *caddy.Duration `json:"record_ttl,omitempty"`

	// Most records kept (least recently used evicted first). The bytes
	// cache learns a segment's length from here, so 0 also turns the
	// bytes cache off. Default: 10000.
	MaxRecords *int `json:"max_records,omitempty"`

	// Directory of the disk tier: segments larger than max_entry (or
	// with no room in memory) are copied there once from the store,
	// however many clients ask at once, verified against their id while
	// written, and served from the file (sendfile). Survives restarts
	// (files are re-hashed before their first use). The directory must
	// be the tier's own: missing (it is created), empty, or marked by the
	// tier (.syncular-disk-tier); one holding other files, and system
	// directories (/, /etc, /var, /tmp, $HOME ...), fail the config. A
	// directory named here that cannot be used (not creatable, not
	// writable by the user Caddy runs as) fails the config too, naming
	// the directory and the reason, unless DiskBestEffort is set. `caddy
	// validate` runs the same checks and creates nothing. "off" disables
	// the tier. Default: <Caddy's data dir>/syncular/segments, which is
	// best effort (a warning, segments then stream from the store).
	Disk string `json:"disk,omitempty"`

	// DiskBestEffort turns an unusable disk directory into a warning: the
	// edge starts, segments stream from the store while the directory
	// cannot be used, and it is tried again every 30 s (a volume mounted
	// late). A directory that is not the tier's own still fails. Default:
	// false for a directory named in Disk (the config fails), true for
	// the default directory.
	DiskBestEffort bool `json:"disk_best_effort,omitempty"`

	// Budget of the disk tier: complete files plus fills in progress,
	// least recently used evicted first; a segment larger than it is not
	// cached. Keep it below the volume's free space. Default: 4 GiB
	// (4294967296, disk.DefaultMaxBytes). 0 disables the disk tier. A
	// non-zero budget with disk "off" is refused (it would have no
	// effect).
	DiskMaxBytes *int64 `json:"disk_max_bytes,omitempty"`
}

// check refuses negative sizes and durations.
func (c *CacheConfig) check() error {
	if c == nil {
		return nil
	}
	if (c.MaxBytes != nil && *c.MaxBytes < 0) || (c.MaxEntry != nil && *c.MaxEntry < 0) ||
		(c.RecordTTL != nil && *c.RecordTTL < 0) || (c.MaxRecords != nil && *c.MaxRecords < 0) ||
		(c.DiskMaxBytes != nil && *c.DiskMaxBytes < 0) {
		return errors.New("cache sizes, record_ttl and max_records must not be negative")
	}
	return nil
}
