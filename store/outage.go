package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/syncular/caddy-syncular/segid"
)

// Store faults in Cached: what it does when the backing store cannot be
// read (a breaker, a background probe, the grace period of the records it
// holds), when the bytes it returns do not verify (a backoff before they
// are read again), and how it remembers refusals for a moment so a
// repeated refused request is not one store read each.

// Defaults of the fault handling (CacheOptions).
const (
	// DefaultGrace is how long a record read from the store keeps
	// deciding grants while the store cannot be read.
	DefaultGrace = 5 * time.Minute
	// DefaultBreakerFailures is how many store calls in a row must fail
	// as unreadable (Unreadable) before the breaker opens.
	DefaultBreakerFailures = 3
	// DefaultProbeInterval is the pause between two background probes of
	// a store whose breaker is open.
	DefaultProbeInterval = time.Second
	// DefaultCorruptBackoff is how long a segment whose store bytes failed
	// verification is not read again; each later failure doubles it, up
	// to DefaultCorruptBackoffMax.
	DefaultCorruptBackoff    = 30 * time.Second
	DefaultCorruptBackoffMax = 10 * time.Minute
	// RefusalWindow is the longest a refusal decided on a fresh read is
	// remembered (never longer than RecordTTL).
	RefusalWindow = time.Second
)

const (
	// maxBackoffs and maxMisses bound the segments whose corrupt bytes
	// and whose absence from the store are remembered.
	maxBackoffs = 1024
	maxMisses   = 4096
)

// probeID is the segment id the background probe looks up: one no writer
// publishes (the SHA-256 of no content is another). Any answer, "not
// found" included, means the store can be read.
var probeID = segid.MustParseID("sha256:" + "0000000000000000000000000000000000000000000000000000000000000000")

// ErrStoreDown is the answer of Cached, without calling the backing store,
// while its breaker is open: the last calls found the store unreadable, and
// a background probe is waiting for it to answer again. Unreadable(it) is
// true; it wraps no deadline, so it is answered 503, never 504.
var ErrStoreDown = errors.New("segment store unreadable: failing fast until a background probe reaches it")

// ErrCorruptBackoff is the answer of Cached, without reading the store, for
// a segment whose store bytes failed verification less than a backoff ago.
// Errors carrying it also match ErrCorruptSegment.
var ErrCorruptBackoff = errors.New("not read again until its backoff ends")

// Unreadable reports whether err means the store could not be read at all
// now (a timeout, a refused or reset connection, an HTTP 5xx, 408 or 429, a
// SQLite I/O, open or lock error, ErrStoreDown: any error it does not
// know), as opposed to an answer: a record or bytes, ErrNotFound, a
// corrupt record or corrupt bytes, a range the object does not have
// (ErrRangeNotSatisfiable), a request the store refused (ErrRefused: any
// other 4xx, a denied or malformed request), a caller that went away
// (context.Canceled), or ErrOverloaded (the read gate refused it: the
// store was not called). It reads only the core's errors, which the
// backends wrap.
func Unreadable(err error) bool {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorruptSegment) || errors.Is(err, ErrOverloaded) ||
		errors.Is(err, ErrCorruptRecord) || errors.Is(err, ErrRangeNotSatisfiable) || errors.Is(err, ErrRefused) {
		return false
	}
	if errors.Is(err, ErrStoreDown) {
		return true
	}
	if errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return true
}

// breaker counts store calls that found the store unreadable in a row and,
// past CacheOptions.BreakerFailures, opens: calls then fail at once with
// ErrStoreDown while one background goroutine probes the store until it
// answers. The goroutine ends with the Cached (Stop).
type breaker struct {
	open  atomic.Bool
	fails atomic.Int64

	mu      sync.Mutex // transitions; probing
	probing bool

	trips atomic.Int64 // times it opened
	since atomic.Int64 // when it last opened (opts.Now, Unix ns)
	fast  atomic.Int64 // calls answered ErrStoreDown without the store
}

// guard is called before a call of the backing store: ErrStoreDown while
// the breaker is open.
func (c *Cached) guard() error {
	if c.brk.open.Load() {
		c.brk.fast.Add(1)
		return ErrStoreDown
	}
	return nil
}

// feedBreaker records the outcome of a call of the backing store for the
// breaker.
func (c *Cached) feedBreaker(err error) {
	b := &c.brk
	if !Unreadable(err) {
		if b.fails.Load() == 0 && !b.open.Load() {
			return
		}
		b.mu.Lock()
		b.fails.Store(0)
		wasOpen := b.open.Swap(false)
		b.mu.Unlock()
		if wasOpen {
			c.notifyBreaker(false, nil)
		}
		return
	}
	if errors.Is(err, ErrStoreDown) {
		return
	}
	b.mu.Lock()
	n := b.fails.Add(1)
	opened := false
	if !b.open.Load() && n >= int64(c.opts.BreakerFailures) && c.ctx.Err() == nil {
		b.since.Store(c.opts.Now().UnixNano())
		b.open.Store(true)
		b.trips.Add(1)
		opened = true
		if !b.probing {
			b.probing = true
			c.wg.Add(1)
			go c.probe()
		}
	}
	b.mu.Unlock()
	if opened {
		c.notifyBreaker(true, err)
	}
}

// BreakerOpenSince reports whether the breaker is open now and, if so,
// since when (the clock of CacheOptions.Now).
func (c *Cached) BreakerOpenSince() (time.Time, bool) {
	if !c.brk.open.Load() {
		return time.Time{}, false
	}
	return time.Unix(0, c.brk.since.Load()), true
}

func (c *Cached) notifyBreaker(open bool, cause error) {
	if f := c.opts.OnBreaker; f != nil {
		f(open, cause)
	}
}

// probe looks up probeID every ProbeInterval, each call bounded by
// Timeout, until the store answers (the breaker then closes), the breaker
// is closed by a call that got an answer, or the Cached is stopped.
func (c *Cached) probe() {
	defer c.wg.Done()
	b := &c.brk
	t := time.NewTimer(c.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
			return
		case <-t.C:
		}
		b.mu.Lock()
		if !b.open.Load() {
			b.probing = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(c.ctx, c.opts.Timeout)
		_, err := c.inner.Lookup(ctx, probeID)
		cancel()
		if c.ctx.Err() == nil && !Unreadable(err) {
			b.mu.Lock()
			b.probing = false
			b.fails.Store(0)
			wasOpen := b.open.Swap(false)
			b.mu.Unlock()
			if wasOpen {
				c.notifyBreaker(false, nil)
			}
			return
		}
		t.Reset(c.opts.ProbeInterval)
	}
}

// Stop ends the Cached's background work (the probe of an open breaker,
// the variant builds) and waits for it, without closing the inner store (which its owner may
// share). Calls after Stop still work; the breaker then no longer opens.
func (c *Cached) Stop() {
	c.brk.mu.Lock()
	c.cancel()
	c.brk.mu.Unlock()
	c.wg.Wait()
}

// BreakerOpen reports whether the breaker is open now.
func (c *Cached) BreakerOpen() bool { return c.brk.open.Load() }

// corruptBackoffs remembers segments whose store bytes failed
// verification: until when they are not read again, and the backoff to
// apply after the next failure.
type corruptBackoffs struct {
	mu      sync.Mutex
	m       *simplelru.LRU[string, *backoffEntry]
	n       atomic.Int64 // entries held (a lock-free "none" check)
	answers atomic.Int64 // Opens answered ErrCorruptBackoff
}

type backoffEntry struct {
	until time.Time
	delay time.Duration
}

func (b *corruptBackoffs) init() {
	b.m, _ = simplelru.NewLRU[string, *backoffEntry](maxBackoffs, func(string, *backoffEntry) { b.n.Add(-1) })
}

// backingOff returns an error matching ErrCorruptSegment and
// ErrCorruptBackoff while id's backoff runs.
func (c *Cached) backingOff(id segid.ID) error {
	b := &c.corrupt
	if b.n.Load() == 0 {
		return nil
	}
	now := c.opts.Now()
	b.mu.Lock()
	e, ok := b.m.Peek(id.String())
	var left time.Duration
	if ok {
		left = e.until.Sub(now)
	}
	b.mu.Unlock()
	if !ok || left <= 0 {
		return nil
	}
	b.answers.Add(1)
	return fmt.Errorf("store: %s: %w: %w (%v left)", id, ErrCorruptSegment, ErrCorruptBackoff, left.Round(time.Second))
}

// markCorrupt starts (or doubles) id's backoff.
func (c *Cached) markCorrupt(id segid.ID) {
	b := &c.corrupt
	now := c.opts.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.m.Get(id.String()); ok {
		e.delay = min(e.delay*2, c.opts.CorruptBackoffMax)
		e.until = now.Add(e.delay)
		return
	}
	d := c.opts.CorruptBackoff
	b.m.Add(id.String(), &backoffEntry{until: now.Add(d), delay: d})
	b.n.Add(1)
}

// clearCorrupt forgets id's backoff: its bytes verified.
func (c *Cached) clearCorrupt(id segid.ID) {
	b := &c.corrupt
	if b.n.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.m.Remove(id.String())
	b.mu.Unlock()
}

// verified is the end of a verified read of id's store bytes: nil
// when they verified, else the error that ended it.
func (c *Cached) verified(id segid.ID, err error) {
	switch {
	case err == nil:
		c.clearCorrupt(id)
	case errors.Is(err, ErrCorruptSegment) && !errors.Is(err, ErrCorruptBackoff):
		c.markCorrupt(id)
	}
}

// missMemo remembers, for at most the refusal window, the segment ids a
// fresh read found absent from the store (ErrNotFound), apart from the
// record cache so that they evict no record.
type missMemo struct {
	mu   sync.Mutex
	m    *simplelru.LRU[string, time.Time] // id -> when the read began
	hits atomic.Int64
}

func (m *missMemo) init() {
	m.m, _ = simplelru.NewLRU[string, time.Time](maxMisses, nil)
}

// refusalWindow is how long a refusal decided on a fresh read is
// remembered: RefusalWindow, never longer than RecordTTL.
func (c *Cached) refusalWindow() time.Duration {
	return min(RefusalWindow, c.opts.RecordTTL)
}

func (c *Cached) rememberMiss(id segid.ID, read time.Time) {
	if c.refusalWindow() <= 0 {
		return
	}
	c.misses.mu.Lock()
	c.misses.m.Add(id.String(), read)
	c.misses.mu.Unlock()
}

func (c *Cached) forgetMiss(id segid.ID) {
	if c.refusalWindow() <= 0 {
		return
	}
	c.misses.mu.Lock()
	c.misses.m.Remove(id.String())
	c.misses.mu.Unlock()
}

// missedRecently reports whether a read that began less than the refusal
// window before now found id absent.
func (c *Cached) missedRecently(id segid.ID, now time.Time) bool {
	w := c.refusalWindow()
	if w <= 0 {
		return false
	}
	c.misses.mu.Lock()
	at, ok := c.misses.m.Peek(id.String())
	c.misses.mu.Unlock()
	if ok && now.Sub(at) < w {
		c.misses.hits.Add(1)
		return true
	}
	return false
}

// RefusedRecently reports whether a refusal for reason was decided on rec,
// id's record as read from the store (not from the cache), by a read
// that began less than the refusal window ago (RefusalWindow, at most
// RecordTTL). A caller about to refuse on rec for that reason may then
// skip Revalidate: a repeated refused request costs no store read. A
// grant is never remembered this way.
func (c *Cached) RefusedRecently(id segid.ID, rec *Record, reason Reason) bool {
	w := c.refusalWindow()
	if w <= 0 || reason == ReasonNone {
		return false
	}
	if c.records.refused(id.String(), rec, reason, c.opts.Now().Add(-w)) {
		c.refusalHits.Add(1)
		return true
	}
	return false
}

// RememberRefusal records that a refusal for reason was decided on rec, a
// record of id read from the store for this request (a Lookup miss,
// or Revalidate). It is forgotten when the record is read again or the
// refusal window has passed since the read began.
func (c *Cached) RememberRefusal(id segid.ID, rec *Record, reason Reason) {
	if c.refusalWindow() <= 0 || reason == ReasonNone {
		return
	}
	c.records.refuse(id.String(), rec, reason)
}
