package store

import (
	"context"
	"io"
	"sync/atomic"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/disk"
)

// What a storm looks like from the store's side: which tier answered an
// Open (Body.Tier), how many fills run and how many callers wait on them,
// and how many segment bytes were read from the inner store (the bucket's
// egress), all read at scrape time.

// Tier says which tier answered an Open.
type Tier uint8

const (
	// TierStore: the bytes streamed from the inner store and were not
	// kept (too large for memory with no disk tier, no room, or a
	// length not known yet).
	TierStore Tier = iota
	// TierMemory: a segment held in the bytes cache.
	TierMemory
	// TierMemoryFill: this caller's Open started the read that filled
	// the bytes cache.
	TierMemoryFill
	// TierMemoryFollow: this caller waited on a bytes cache fill another
	// caller had started.
	TierMemoryFollow
	// TierDisk: a complete, verified file of the disk tier.
	TierDisk
	// TierDiskFill: this caller's Open started the disk tier's fill.
	TierDiskFill
	// TierDiskFollow: this caller read a disk tier fill another caller
	// had started.
	TierDiskFollow
)

// Hit reports a tier that answered without reading the store.
func (t Tier) Hit() bool { return t == TierMemory || t == TierDisk }

// Fill reports a tier whose Open started the store read that fills it.
func (t Tier) Fill() bool { return t == TierMemoryFill || t == TierDiskFill }

// Followed reports a tier whose Open joined a fill already running.
func (t Tier) Followed() bool { return t == TierMemoryFollow || t == TierDiskFollow }

// Disk reports the disk tier's answers (hit, fill, follow).
func (t Tier) Disk() bool { return t >= TierDisk }

// RecordSource says where a Lookup's record came from.
type RecordSource uint8

const (
	// RecordStore: this caller's read of the inner store.
	RecordStore RecordSource = iota
	// RecordMemory: the record cache, within its TTL.
	RecordMemory
	// RecordFollow: a read of the inner store another caller had started.
	RecordFollow
	// RecordGrace: the record cache, past its TTL but within Grace,
	// because the inner store could not be read (outage.go).
	RecordGrace
)

// diskTier is the tier of a handle the disk tier returned.
func diskTier(h *disk.Handle) Tier {
	switch {
	case h.Hit():
		return TierDisk
	case h.Followed():
		return TierDiskFollow
	}
	return TierDiskFill
}

// FlowStats is what is in progress now, and the store bytes read so far.
type FlowStats struct {
	// StoreReadBytes counts segment bytes read from the inner store:
	// bytes cache fills, disk tier fills and streamed bodies (records
	// are not counted). A fill that a client abandoned still counts the
	// bytes it read.
	StoreReadBytes int64
	// MemoryFills is the bytes cache fills running now; MemoryWaiting
	// the callers waiting on one they did not start.
	MemoryFills, MemoryWaiting int64
	// Gate is the store read gate's slots in use, reads waiting and
	// reads refused ErrOverloaded (fair.go).
	Gate FairStats
	// Backend is the inner store's own figures when it is a Reporter
	// (a SQLite store's read paths, an S3 store's faults), else nil.
	Backend any
}

// Reporter is a backing store that counts how it answered. Flow passes
// its figures on as they are, without knowing their type: whoever chose
// the backend reads them.
type Reporter interface {
	// Report returns the store's figures now.
	Report() any
}

// Flow returns the in-progress gauges and the store bytes counter. The
// disk tier, which several Cached may share, reports its own
// (disk.Stats.FillsInFlight and Following).
func (c *Cached) Flow() FlowStats {
	f := FlowStats{
		StoreReadBytes: c.storeRead.Load(),
		MemoryFills:    c.fills.inFlight.Load(),
		MemoryWaiting:  c.fills.joinedNow.Load(),
		Gate:           c.gate.stats(),
	}
	if r, ok := c.inner.(Reporter); ok {
		f.Backend = r.Report()
	}
	return f
}

// openInner streams a body from the inner store, counting its bytes,
// behind the breaker (outage.go).
func (c *Cached) openInner(ctx context.Context, id segid.ID, off, n int64) (io.ReadCloser, Tier, error) {
	if err := c.guard(); err != nil {
		return nil, TierStore, err
	}
	rc, err := c.inner.Open(ctx, id, off, n)
	c.feedBreaker(err)
	if err != nil {
		return nil, TierStore, err
	}
	return &countingBody{rc: rc, n: &c.storeRead}, TierStore, nil
}

// countingBody counts the bytes read through it.
type countingBody struct {
	rc io.ReadCloser
	n  *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	k, err := b.rc.Read(p)
	if k > 0 {
		b.n.Add(int64(k))
	}
	return k, err
}

func (b *countingBody) Close() error { return b.rc.Close() }

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	k, err := w.w.Write(p)
	if k > 0 {
		w.n.Add(int64(k))
	}
	return k, err
}

// Interface guards
var (
	_ io.ReadCloser = (*countingBody)(nil)
	_ io.Writer     = (*countingWriter)(nil)
)
