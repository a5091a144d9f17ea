package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// Cached is a Store in front of another: it keeps recently read records
// for a short TTL, keeps verified segment bytes in a bounded LRU, and
// makes concurrent callers for the same segment id share one read of the
// inner store (a bootstrap storm costs one store read per segment).
//
// Misses (ErrNotFound) are not cached as records, only coalesced and
// remembered for the refusal window (at most RecordTTL, RefusalWindow) in a
// bounded memo of their own: the record cache never holds an entry for an
// id the store does not know, so requests for unknown ids cannot evict real
// entries. (The handler only looks up ids whose token verified, so a
// client without a key cannot reach Lookup.)
//
// Store faults (outage.go): a breaker stops calling a store found
// unreadable a few times in a row and probes it in the background; while
// it cannot be read, records read within Grace keep answering Lookup.
// Segments whose store bytes failed verification back off.
type Cached struct {
	inner   Store
	filler  fillerInto // inner's own whole-segment read; nil: by Open
	copier  blobCopier // inner's one-read copy for the disk tier; nil: by Open
	opts    CacheOptions
	records *recordLRU
	blobs   *blobLRU
	lookups flight[*Record]
	fills   flight[[]byte]
	vt      variantTier // content-coded variants (variants.go)
	gate    *fairGate   // bounded, fair store reads (fair.go)

	brk     breaker // outage.go
	corrupt corruptBackoffs
	misses  missMemo
	ctx     context.Context // ends with Stop: background work
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	recordHits, recordMisses atomic.Int64
	byteHits, byteMisses     atomic.Int64
	passThrough              atomic.Int64
	diskReads                atomic.Int64
	storeRead                atomic.Int64 // segment bytes read from inner (observe.go)
	graceHits, refusalHits   atomic.Int64
	groupCounters            // cache_group.go
}

// NewCached wraps inner. Options are taken as given (see
// DefaultCacheOptions); negative values count as 0.
func NewCached(inner Store, opts CacheOptions) *Cached {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.RecordTTL = max(opts.RecordTTL, 0)
	opts.MaxRecords = max(opts.MaxRecords, 0)
	opts.MaxBytes = max(opts.MaxBytes, 0)
	opts.MaxEntry = min(max(opts.MaxEntry, 0), opts.MaxBytes)
	opts.Grace = max(opts.Grace, 0)
	if opts.BreakerFailures <= 0 {
		opts.BreakerFailures = DefaultBreakerFailures
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = DefaultProbeInterval
	}
	if opts.CorruptBackoff <= 0 {
		opts.CorruptBackoff = DefaultCorruptBackoff
	}
	if opts.CorruptBackoffMax <= 0 {
		opts.CorruptBackoffMax = DefaultCorruptBackoffMax
	}
	opts.CorruptBackoffMax = max(opts.CorruptBackoffMax, opts.CorruptBackoff)
	c := &Cached{
		inner:   inner,
		opts:    opts,
		records: newRecordLRU(opts.MaxRecords),
		blobs:   newBlobLRU(opts.MaxBytes),
		gate:    newFairGate(opts.Fair),
	}
	c.filler, _ = inner.(fillerInto)
	c.copier, _ = inner.(blobCopier)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.vt.init(opts.MaxRecords)
	c.corrupt.init()
	c.misses.init()
	return c
}

// SharedTimeout is the bound on every read a Lookup or Open shares
// (CacheOptions.Timeout): a caller needs no timer of its own around them.
func (c *Cached) SharedTimeout() time.Duration { return c.opts.Timeout }

// Lookup answers from the record cache while the record is younger than
// RecordTTL; otherwise one inner Lookup is shared by every concurrent
// caller for the id. Errors are not cached; ErrNotFound from a read that
// began less than the refusal window ago is answered again without a read.
// While the store cannot be read, a record read within Grace answers.
func (c *Cached) Lookup(ctx context.Context, id segid.ID) (*Record, error) {
	rec, _, err := c.LookupFrom(ctx, id)
	return rec, err
}

// LookupFrom is Lookup, and says where the record came from (observe.go):
// RecordGrace when the store could not be read and rec is a record older
// than RecordTTL read within Grace.
func (c *Cached) LookupFrom(ctx context.Context, id segid.ID) (*Record, RecordSource, error) {
	now := c.opts.Now()
	if c.opts.RecordTTL > 0 {
		if rec, ok := c.records.get(id.String(), now.Add(-c.opts.RecordTTL)); ok {
			c.recordHits.Add(1)
			return rec, RecordMemory, nil
		}
	}
	if c.missedRecently(id, now) {
		return nil, RecordMemory, ErrNotFound
	}
	c.recordMisses.Add(1)
	rec, joined, err := c.fetchJoined(ctx, id)
	src := RecordStore
	if joined {
		src = RecordFollow
	}
	if err == nil || c.opts.Grace <= 0 || !Unreadable(err) {
		return rec, src, err
	}
	if g, ok := c.records.grace(id.String(), c.opts.Now().Add(-c.opts.Grace)); ok {
		c.graceHits.Add(1)
		return g, RecordGrace, nil
	}
	return nil, src, err
}

// Revalidate returns a record of id at least as new as a read
// started now, when rec (from Lookup) may have come from the cache. Call it
// before refusing a request on rec: the cache may then let a store change
// through late only in the permissive direction (a deleted or shortened
// grant seen for up to RecordTTL), never refuse on a stale record (a
// re-published or extended segment is seen at once). Refusals cost a
// store read each (coalesced), unless the caller skips Revalidate for a
// refusal RefusedRecently remembers. ok is false when rec is already fresh
// (nothing was read) or the read failed (err).
func (c *Cached) Revalidate(ctx context.Context, id segid.ID, rec *Record) (fresh *Record, ok bool, err error) {
	if !c.records.stale(id.String(), rec) {
		return nil, false, nil
	}
	fresh, err = c.fetch(ctx, id)
	if err != nil {
		return nil, false, err
	}
	return fresh, true, nil
}

// fetch reads the record from the inner store, one read shared by every
// concurrent caller for the id, and caches it.
func (c *Cached) fetch(ctx context.Context, id segid.ID) (*Record, error) {
	rec, _, err := c.fetchJoined(ctx, id)
	return rec, err
}

// fetchJoined is fetch, and reports whether the read was another caller's.
func (c *Cached) fetchJoined(ctx context.Context, id segid.ID) (*Record, bool, error) {
	if err := c.guard(); err != nil {
		return nil, false, err
	}
	return c.lookups.doJoined(ctx, id.String(), c.opts.Timeout, func(sctx context.Context) (*Record, error) {
		if err := c.guard(); err != nil {
			return nil, err
		}
		release, err := c.gate.acquire(sctx)
		if err != nil {
			return nil, err
		}
		defer release()
		start := c.opts.Now()
		rec, err := c.lookupInner(sctx, id, start) // cache_group.go
		c.feedBreaker(err)
		switch {
		case err == nil && rec != nil:
			c.records.put(id.String(), rec, start)
			c.forgetMiss(id)
		case errors.Is(err, ErrNotFound):
			c.rememberMiss(id, start)
		}
		return rec, err
	})
}

// errNoRoom: a fill would push the bytes cache over its budget.
var errNoRoom = errors.New("store: cache: no room")

// Open serves a segment through the tiers in order: memory (a cached
// segment, or one whose length is known from a recent Lookup and fits
// MaxEntry, read whole once by one shared call, checked against its id,
// cached and served to every concurrent caller), then the inner store,
// streamed uncached.
func (c *Cached) Open(ctx context.Context, id segid.ID, off, n int64) (io.ReadCloser, error) {
	b, err := c.read(ctx, id, off, n)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// openTier is Open, and says which tier answered (observe.go).
func (c *Cached) openTier(ctx context.Context, id segid.ID, off, n int64) (*Body, Tier, error) {
	b, err := c.read(ctx, id, off, n)
	if err != nil {
		return nil, TierStore, err
	}
	return b, b.tier, nil
}

// read opens [off, off+n) of id through the tiers: a Body of the
// tier that answered (Body.Tier), identity bytes.
func (c *Cached) read(ctx context.Context, id segid.ID, off, n int64) (*Body, error) {
	if off < 0 {
		return nil, fmt.Errorf("store: cache open: negative offset %d", off)
	}
	if b, t, ok, err := c.openMemory(ctx, id); ok || err != nil {
		if err != nil {
			return nil, err
		}
		return memoryBody(clamp(b, off, n), t), nil
	}
	if size, ok := c.records.size(id.String()); ok {
		return c.openLarge(ctx, id, size, off, n) // tier.go
	}
	if err := c.backingOff(id); err != nil {
		return nil, err
	}
	c.passThrough.Add(1)
	rc, t, err := c.openInner(ctx, id, off, n)
	if err != nil {
		return nil, err
	}
	return streamBody(rc, t), nil
}

// openMemory serves id from the bytes cache, filling it first when
// the segment fits. ok is false, with no error, when the segment is not
// for memory (bytes cache off, length unknown, larger than MaxEntry, or
// no room for a fill): the next tier serves it.
func (c *Cached) openMemory(ctx context.Context, id segid.ID) (b []byte, t Tier, ok bool, err error) {
	if c.opts.MaxBytes <= 0 {
		return nil, 0, false, nil
	}
	if b, ok := c.blobs.get(id.String()); ok {
		c.byteHits.Add(1)
		return b, TierMemory, true, nil
	}
	size, ok := c.records.size(id.String())
	if !ok || size > c.opts.MaxEntry {
		return nil, 0, false, nil
	}
	if err := c.backingOff(id); err != nil {
		return nil, TierStore, false, err
	}
	if err := c.guard(); err != nil {
		return nil, TierStore, false, err // no shared call to set up: the store is not read
	}
	c.byteMisses.Add(1)
	b, joined, err := c.fills.doJoined(ctx, id.String(), c.opts.Timeout, func(sctx context.Context) ([]byte, error) {
		return c.fill(sctx, id, size)
	})
	t = TierMemoryFill
	if joined {
		t = TierMemoryFollow
	}
	switch {
	case err == nil:
		return b, t, true, nil
	case errors.Is(err, errNoRoom):
		return nil, 0, false, nil
	default:
		return nil, t, false, err
	}
}

// fill reads id whole, verifies it and caches it.
func (c *Cached) fill(ctx context.Context, id segid.ID, size int64) ([]byte, error) {
	if id.IsZero() {
		return nil, ErrNotFound
	}
	if b, ok := c.blobs.get(id.String()); ok {
		return b, nil // filled while this call was being set up
	}
	release, err := c.gate.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	if !c.blobs.reserve(size) {
		return nil, errNoRoom
	}
	inserted := false
	defer func() {
		if !inserted {
			c.blobs.release(size)
		}
	}()
	b := make([]byte, size)
	if c.filler != nil {
		// The store reads it its own way (SQLite: without holding a
		// lock across the read where it can, store/sqlite/lockfree.go)
		// and verifies it in the same pass.
		err = c.fillInto(ctx, c.filler, id, b)
	} else if err = c.readWhole(ctx, id, b); err == nil {
		err = checkWhole(id, b)
	}
	c.verified(id, err)
	if err != nil {
		return nil, err
	}
	c.blobs.insert(id.String(), b)
	inserted = true
	return b, nil
}

// fillerInto is a store that reads a whole segment into a buffer of its
// record's length itself and verifies it as it reads (the SQLite store's
// FillInto): nil only when buf holds the segment's bytes, an error
// matching ErrCorruptSegment when the store's bytes are not the segment's.
// The caller does not hash them again.
type fillerInto interface {
	FillInto(ctx context.Context, id segid.ID, buf []byte) error
}

// fillInto reads id into buf through the store's FillInto, behind
// the breaker, counting the bytes read.
func (c *Cached) fillInto(ctx context.Context, fi fillerInto, id segid.ID, buf []byte) error {
	if err := c.guard(); err != nil {
		return err
	}
	err := fi.FillInto(ctx, id, buf)
	c.feedBreaker(err)
	if err == nil {
		c.storeRead.Add(int64(len(buf)))
	}
	return err
}

// readWhole reads id into buf, which is its record's length, by
// the inner store's Open (openInner: behind the breaker, counted).
func (c *Cached) readWhole(ctx context.Context, id segid.ID, buf []byte) error {
	rc, _, err := c.openInner(ctx, id, 0, -1)
	if err != nil {
		return err
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, buf); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return fmt.Errorf("store: %s: %w (shorter than its record's byteLength)", id, ErrCorruptSegment)
		}
		return err
	}
	var extra [1]byte
	if k, _ := io.ReadFull(rc, extra[:]); k > 0 {
		return fmt.Errorf("store: %s: %w (longer than its record's byteLength)", id, ErrCorruptSegment)
	}
	return nil
}

// checkWhole reports whether buf hashes to id.
func checkWhole(id segid.ID, buf []byte) error {
	if !id.Matches(buf) {
		return fmt.Errorf("store: %s: %w", id, ErrCorruptSegment)
	}
	return nil
}

// Close stops the background work (Stop) and closes the inner store.
func (c *Cached) Close() error {
	c.Stop()
	return c.inner.Close()
}

// clamp is b[off:off+n] (n < 0: to the end), clamped to b like the
// SQLite store: a range past the end is empty.
func clamp(b []byte, off, n int64) []byte {
	size := int64(len(b))
	off = min(off, size)
	end := size
	if n >= 0 && n < size-off {
		end = off + n
	}
	return b[off:end]
}

// Interface guards
var (
	_ Store = (*Cached)(nil)
)
