package store

// CacheStats counts cache answers since the store was built.
type CacheStats struct {
	// RecordHits and RecordMisses count Lookups answered from memory and
	// from the store.
	RecordHits, RecordMisses int64
	// ByteHits and ByteMisses count Opens answered from the bytes cache
	// and Opens that filled it (or tried to).
	ByteHits, ByteMisses int64
	// PassThrough counts Opens streamed from the store uncached (too
	// large, length unknown, or no room for a fill).
	PassThrough int64
	// DiskReads counts Opens served by the disk tier (a complete file or
	// a fill in progress).
	DiskReads int64
	// Bytes is the memory the bytes cache holds now (entries and fills).
	Bytes int64
	// Records is the number of records held.
	Records int
	// RecordEvictions and ByteEvictions count entries dropped to stay
	// within MaxRecords and MaxBytes.
	RecordEvictions, ByteEvictions int64
	// Coalesced counts callers that joined a store read already under way
	// instead of starting their own (lookups and fills).
	Coalesced int64
	// Variants counts content-coded variants built (variants.go).
	Variants VariantStats

	// GraceHits counts Lookups answered, while the store could not be
	// read, with a record older than RecordTTL but within Grace.
	GraceHits int64
	// RefusalHits counts refusals answered from the refusal memo without
	// a store read (RefusedRecently, and ids a fresh read found absent).
	RefusalHits int64
	// BreakerOpen is whether the breaker is open now; BreakerTrips counts
	// the times it opened, FastFailures the store calls it answered
	// ErrStoreDown without calling the store.
	BreakerOpen                bool
	BreakerTrips, FastFailures int64
	// CorruptBackoffs counts Opens answered ErrCorruptBackoff.
	CorruptBackoffs int64
}

// Stats returns the counters.
func (c *Cached) Stats() CacheStats {
	return CacheStats{
		RecordHits:   c.recordHits.Load(),
		RecordMisses: c.recordMisses.Load(),
		ByteHits:     c.byteHits.Load(),
		ByteMisses:   c.byteMisses.Load(),
		PassThrough:  c.passThrough.Load(),
		DiskReads:    c.diskReads.Load(),
		Bytes:        c.blobs.usage(),
		Records:      c.records.len(),

		RecordEvictions: c.records.evicted.Load(),
		ByteEvictions:   c.blobs.evicted.Load(),
		Coalesced:       c.lookups.joined.Load() + c.fills.joined.Load(),
		Variants:        c.variantStats(), // tier_variants.go

		GraceHits:       c.graceHits.Load(),
		RefusalHits:     c.refusalHits.Load() + c.misses.hits.Load(),
		BreakerOpen:     c.brk.open.Load(),
		BreakerTrips:    c.brk.trips.Load(),
		FastFailures:    c.brk.fast.Load(),
		CorruptBackoffs: c.corrupt.answers.Load(),
	}
}
