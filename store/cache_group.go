package store

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// Group refreshes. Each cached record expires on its own, RecordTTL
// after its read, so a working set of N records costs its store N reads
// per TTL, and in a SQLite rollback journal each read is a SHARED lock
// that may fail a commit of a writer without a busy handler. When the
// inner store is a RecordGroupReader, a miss reads with its record up to
// groupMax others that a cache hit served since their read and that
// expire within the next RecordTTL/groupAhead (or expired less than a
// RecordTTL ago): one read refreshes the working set, and after the
// first such read the set expires together.
//
// A group record is put as read when the miss's read began (before the
// store's read of it), and only over an entry read earlier: it is never
// answered longer than RecordTTL after a read that saw it, and a newer
// read is never replaced by an older one. Records of the group that the
// store did not return (not found, undecodable, not reached) are left as
// they are and expire as usual; a group read never remembers a miss.
const (
	// groupMax is one SQLite read transaction's worth of records
	// (maxGroupRead); a deployment's working set (the segments clients
	// are bootstrapping now) is usually smaller.
	groupMax = 64
	// groupAhead: records within RecordTTL/groupAhead of expiring are
	// refreshed early. Half: a record's life is cut by at most half (at
	// most twice the reads it would have had, all in locks taken anyway),
	// and a working set read at times spread over up to half a TTL joins
	// one group.
	groupAhead = 2
)

type groupCounters struct {
	groupReads, groupRefreshed atomic.Int64
}

// lookupInner is the inner store's Lookup of id for a read that
// began at start, refreshing the cached records about to expire in the
// same read when the store can (see above).
func (c *Cached) lookupInner(ctx context.Context, id segid.ID, start time.Time) (*Record, error) {
	gr, ok := c.inner.(RecordGroupReader)
	if !ok || c.opts.RecordTTL <= 0 {
		return c.inner.Lookup(ctx, id)
	}
	k := min(gr.GroupSize(), groupMax)
	if k <= 0 {
		return c.inner.Lookup(ctx, id)
	}
	ttl := c.opts.RecordTTL
	also := c.records.expiring(id.String(), start.Add(-2*ttl), start.Add(-ttl+ttl/groupAhead), k)
	if len(also) == 0 {
		return c.inner.Lookup(ctx, id)
	}
	c.groupReads.Add(1)
	rec, group, err := gr.LookupGroup(ctx, id, also)
	for gid, g := range group {
		if gid != id.String() && g != nil && c.records.refresh(gid, g, start) {
			c.groupRefreshed.Add(1)
		}
	}
	return rec, err
}
