package store

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/disk"
)

// The states of a variant, as the disk tier names them (Ready: the body
// is the variant; Building, NotWorth, Unavailable: answer identity;
// Following: the body is a large segment's variant still being encoded
// while its segment is filled, size -1 (unknown until its end), and it
// fails, rather than end, if the variant does not verify).
const (
	variantReady       = disk.VariantReady
	variantBuilding    = disk.VariantBuilding
	variantNotWorth    = disk.VariantNotWorth
	variantUnavailable = disk.VariantUnavailable
	variantFollowing   = disk.VariantFollowing
)

// MobileRate is the client rate the wait for a build is weighed against:
// 10 Mbit/s, in bytes per second.
const MobileRate = 10e6 / 8

// WaitBound is the longest a request for a segment of size identity
// bytes waits for its variant's build: the time a mobile client
// (MobileRate) needs for a tenth of the identity bytes; 0 (no wait) under
// WaitMinSize. A kept variant is
// at most 90% of the identity size, so a request that waits this long at
// most still has its last byte no later than identity would have sent it.
// Builds at the kept levels end well within it (docs/performance.md,
// "WaitBound and the build timeout").
func WaitBound(size int64) time.Duration {
	if size < WaitMinSize {
		return 0
	}
	return time.Duration(float64(size) / 10 / MobileRate * float64(time.Second))
}

// WaitMinSize is the smallest segment a request waits for the variant
// of: below 64 KiB the bound is under 5 ms and the bytes it saves go in
// well under one mobile round trip, so identity is sent at once.
const WaitMinSize = 64 << 10

// waitVariant waits, at most until ctx ends, for a build of the coding
// variant of id from bytes held in memory that is under way, when
// the build can be expected to end before identity bytes would have
// reached a mobile client (WaitBound); it reports whether one ended
// (variant then has the answer). It does not wait for the disk tier's
// builds.
func (c *Cached) waitVariant(ctx context.Context, id segid.ID, coding compress.Coding) bool {
	if c.opts.MaxBytes <= 0 || (coding != compress.Gzip && coding != compress.Zstd) {
		return false
	}
	key := variantKey(id, coding)
	identity, ok := c.blobs.peek(id.String())
	if !ok || int64(len(identity)) < WaitMinSize || !c.vt.builds.running(key) {
		return false
	}
	bound := WaitBound
	if c.vt.waitBound != nil {
		bound = c.vt.waitBound
	}
	ctx, cancel := context.WithTimeout(ctx, bound(int64(len(identity))))
	defer cancel()
	return c.vt.builds.wait(ctx, key)
}

// VariantStats counts variant builds.
type VariantStats struct {
	// Made counts variants built, verified and kept.
	Made int64
	// Rejected counts variants that did not decode to their segment
	// (never kept, never served).
	Rejected int64
	// Incompressible counts builds that stopped because the variant would
	// not shrink the segment by 10%.
	Incompressible int64
}

// variantTier is the part of Cached that makes and keeps variants. The
// variant bytes live in the bytes cache (blobLRU) under variantKey, in
// the same budget as identity bytes, builds in progress included.
type variantTier struct {
	builds flight[struct{}]
	// notWorth remembers (segment, coding) keys whose variant is not
	// kept: incompressible, or rejected by Verify.
	mu       sync.Mutex
	notWorth *simplelru.LRU[string, struct{}]

	made, rejected, incompressible atomic.Int64

	// corrupt, when set (tests only), alters an encoded variant before
	// it is verified.
	corrupt func(c compress.Coding, b []byte)
	// waitBound, when set (tests only), replaces WaitBound.
	waitBound func(size int64) time.Duration
}

// notWorthMax bounds the remembered incompressible keys when the record
// cache is off.
const notWorthMax = 10_000

func (v *variantTier) init(maxRecords int) {
	if maxRecords <= 0 {
		maxRecords = notWorthMax
	}
	v.notWorth, _ = simplelru.NewLRU[string, struct{}](maxRecords, nil) // only fails for size <= 0
}

func (v *variantTier) isNotWorth(key string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.notWorth.Get(key)
	return ok
}

func (v *variantTier) markNotWorth(key string) {
	v.mu.Lock()
	v.notWorth.Add(key, struct{}{})
	v.mu.Unlock()
}

func (v *variantTier) stats() VariantStats {
	return VariantStats{Made: v.made.Load(), Rejected: v.rejected.Load(), Incompressible: v.incompressible.Load()}
}

// variantKey is the bytes-cache key of the c variant of id:
// "<segmentId>+gzip". Identity keeps the bare id (protocol §6: never
// cache compressed bytes under the segment id); a segment id never holds
// a '+', so the keys cannot collide.
func variantKey(id segid.ID, c compress.Coding) string {
	return id.String() + "+" + c.String()
}

// variant returns the coding variant of id when it is held now
// (variantReady) or being encoded from a fill in progress
// (variantFollowing, size -1), and otherwise starts building it in the
// background when it can: it never waits for a build. In the memory tier
// a variant is built only from verified identity bytes held in the bytes
// cache, once per (segment, coding) (concurrent callers share one build),
// verified to decode to the segment, and kept in the bytes cache; a
// large segment's is the disk tier's (tier_variants.go). Identity and
// invalid codings are variantUnavailable.
func (c *Cached) variant(id segid.ID, coding compress.Coding) (*Body, int64, disk.VariantState) {
	if coding != compress.Gzip && coding != compress.Zstd {
		return nil, 0, variantUnavailable
	}
	if c.opts.MaxBytes <= 0 {
		return c.diskVariant(id, coding) // tier_variants.go
	}
	key := variantKey(id, coding)
	if b, ok := c.blobs.get(key); ok {
		c.byteHits.Add(1)
		return memoryBody(b, TierMemory), int64(len(b)), variantReady
	}
	if c.vt.isNotWorth(key) {
		return nil, 0, variantNotWorth
	}
	if c.vt.builds.running(key) {
		return nil, 0, variantBuilding
	}
	identity, ok := c.blobs.peek(id.String())
	if !ok {
		return c.diskVariant(id, coding) // a large segment: tier_variants.go
	}
	if !compress.Builds.TryAcquire() {
		return nil, 0, variantUnavailable // every build slot busy: a later request retries
	}
	// A build is CPU-bound: allow it the shared-call timeout plus a second
	// per MiB (an encoder at the kept levels on a loaded core needs well
	// under that: docs/performance.md, "WaitBound and the build timeout").
	timeout := c.opts.Timeout + time.Duration(len(identity)>>20)*time.Second
	started := c.vt.builds.start(c.ctx, c.background, key, timeout, func(ctx context.Context) (struct{}, error) {
		defer compress.Builds.Release()
		return struct{}{}, c.buildVariant(ctx, key, id, coding, identity)
	})
	if !started {
		compress.Builds.Release()
	}
	return nil, 0, variantBuilding
}

// background runs fn on a goroutine of its own unless Stop has run;
// Stop waits for it.
func (c *Cached) background(fn func()) bool {
	c.brk.mu.Lock() // Stop cancels under it: no Add after its Wait
	defer c.brk.mu.Unlock()
	if c.ctx.Err() != nil {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn()
	}()
	return true
}

// buildVariant encodes identity with coding, verifies it and keeps it
// under key; or remembers key as not worth a variant.
func (c *Cached) buildVariant(ctx context.Context, key string, id segid.ID, coding compress.Coding, identity []byte) error {
	if _, ok := c.blobs.peek(key); ok {
		return nil // built by a call that finished while this one was set up
	}
	size := int64(len(identity))
	// The encoder writes at most the identity size (EncodeBounded stops
	// at 90% of it): reserve that much, keep what is used.
	if !c.blobs.reserve(size) {
		return errNoRoom
	}
	reserved := size
	defer func() { c.blobs.release(reserved) }()
	var buf bytes.Buffer
	buf.Grow(int(size))
	src := compress.ContextReader(ctx, bytes.NewReader(identity))
	// A build that fails gives its reservation back before it is marked
	// not worth: whoever sees the mark sees the budget as it ends.
	unreserve := func() { c.blobs.release(reserved); reserved = 0 }
	if _, err := compress.EncodeBounded(coding, &buf, src, size); err != nil {
		unreserve()
		if errors.Is(err, compress.ErrIncompressible) {
			c.vt.incompressible.Add(1)
			c.vt.markNotWorth(key)
		}
		return err
	}
	if c.vt.corrupt != nil {
		c.vt.corrupt(coding, buf.Bytes())
	}
	if err := compress.Verify(coding, bytes.NewReader(buf.Bytes()), id, size); err != nil {
		unreserve()
		if errors.Is(err, compress.ErrMismatch) {
			c.vt.rejected.Add(1)
			c.vt.markNotWorth(key)
		}
		return err
	}
	v := bytes.Clone(buf.Bytes()) // exactly its length: the budget counts len
	c.blobs.release(reserved - int64(len(v)))
	reserved = 0
	c.blobs.insert(key, v)
	c.vt.made.Add(1)
	return nil
}

// Interface guards
