package store

import (
	"time"

	"github.com/syncular/caddy-syncular/store/disk"
)

// Default cache settings (see CacheOptions).
const (
	DefaultRecordTTL  = 2 * time.Second
	DefaultMaxRecords = 10_000
	DefaultMaxBytes   = 64 << 20 // 64 MiB
	DefaultMaxEntry   = 8 << 20  // 8 MiB
)

// CacheOptions bounds a Cached store. The zero value caches nothing (it
// only coalesces concurrent calls); DefaultCacheOptions is the documented
// default.
type CacheOptions struct {
	// RecordTTL is how long a record read by Lookup is answered from
	// memory. It is the staleness the cache allows: a record deleted from
	// the store, a publication row removed, or a partition's logEpoch
	// rotated in the registry is still seen for at most RecordTTL after
	// the read that fetched it began. Publication expiry (expiresAtMs) is
	// not affected: the grant is evaluated per request with the request's
	// clock against the cached record. A caller about to refuse on a
	// record calls Revalidate, so the delay errs on the granting side,
	// except that a refusal decided on a fresh read is remembered for
	// min(RefusalWindow, RecordTTL) (RefusedRecently): a re-published
	// segment is then refused for at most that long. 0: every Lookup
	// reads the store (concurrent ones still share one read).
	RecordTTL time.Duration
	// MaxRecords bounds the record cache (least recently used evicted
	// first). The entries also tell Open a segment's length, which the
	// bytes cache needs; 0 turns both off.
	MaxRecords int
	// MaxBytes is the budget of the bytes cache: segment bytes held in
	// memory, including fills in progress. Least recently used segments
	// are evicted first. 0 disables the bytes cache.
	MaxBytes int64
	// MaxEntry is the largest segment kept in the bytes cache; larger
	// ones stream from the store uncached on every request. Capped at
	// MaxBytes.
	MaxEntry int64
	// Timeout bounds one shared store call (a Lookup, or reading a
	// segment's bytes into the cache). A shared call runs detached from
	// the caller that started it, so a client that disconnects does not
	// fail the others waiting on the same read. 0: DefaultTimeout.
	Timeout time.Duration
	// Now is the clock for record ages. nil: time.Now.
	Now func() time.Time
	// Disk is the disk tier for segments the bytes cache does not hold
	// (larger than MaxEntry, or no room): filled once, verified, served
	// from its file (tier.go). nil: such segments stream from the store.
	// The caller owns it (it may be shared by several Cached).
	Disk *disk.Cache

	// Grace is how long a record read from the store keeps answering
	// Lookup once the store cannot be read (Unreadable: a timeout, a
	// refused connection, a 5xx, a SQLite I/O or open error; never
	// ErrNotFound or an answer). Grants decided on it still apply
	// publication and token expiry to the millisecond; what it freezes
	// is the rest of the record (fences, checkpoints, publications added
	// or removed) as of its read. Bytes then come from the memory and disk
	// tiers only. 0: off (a fault is the caller's answer).
	Grace time.Duration
	// BreakerFailures is how many calls of the store in a row must find
	// it unreadable before the breaker opens: calls then fail at once
	// with ErrStoreDown, instead of each waiting up to Timeout, while one
	// background probe (every ProbeInterval) waits for the store to
	// answer. 0: DefaultBreakerFailures.
	BreakerFailures int
	// ProbeInterval is the pause between probes. 0: DefaultProbeInterval.
	ProbeInterval time.Duration
	// OnBreaker, when set, is told when the breaker opens (open true, with
	// the error of the call that opened it) and when it closes again.
	OnBreaker func(open bool, cause error)
	// CorruptBackoff is how long a segment whose store bytes failed
	// verification is answered ErrCorruptBackoff without reading them
	// again; it doubles with each later failure, up to CorruptBackoffMax,
	// and a read that verifies clears it. 0: DefaultCorruptBackoff and
	// DefaultCorruptBackoffMax.
	CorruptBackoff, CorruptBackoffMax time.Duration

	// Fair bounds the distinct store reads running at once (record
	// lookups, bytes cache and disk tier fills; callers joining one take
	// no slot), the reads waiting for a slot and their wait, and admits
	// waiting reads round-robin across tenants (fair.go). The zero value
	// sets no bound; DefaultCacheOptions sets DefaultFairOptions.
	Fair FairOptions
}

// DefaultCacheOptions returns the defaults: records 2s (10,000 entries),
// bytes 64 MiB, segments up to 8 MiB cached, shared calls bounded by 5s,
// records kept deciding grants for 5m of a store outage, at most 16 store
// reads at once with 1,024 waiting up to 2s each.
func DefaultCacheOptions() CacheOptions {
	return CacheOptions{
		RecordTTL:  DefaultRecordTTL,
		MaxRecords: DefaultMaxRecords,
		MaxBytes:   DefaultMaxBytes,
		MaxEntry:   DefaultMaxEntry,
		Timeout:    DefaultTimeout,
		Grace:      DefaultGrace,
		Fair:       DefaultFairOptions(),
	}
}
