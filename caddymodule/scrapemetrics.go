package caddymodule

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// scrapeCollector is the one collector of the series read at scrape
// time, summed over every live segment cache and disk tier (one process
// may run several handlers, each with its own cache; a tier shared by
// several handlers is counted once): the caches' counters, the disk
// tiers' counters, the fills in flight and the requests following them,
// the segment bytes each cache read from its store and its store read
// gate, by backend. A cache joins at Provision and leaves at Cleanup, so
// a reload restarts the sums: Prometheus treats that as a counter reset.
type scrapeCollector struct {
	// The segment caches.
	hits, misses, passThrough, bytes, records *prometheus.Desc
	evictions, coalesced, variants            *prometheus.Desc
	breakerOpen, breakerTrips, fastFailures   *prometheus.Desc
	corruptBackoffs                           *prometheus.Desc

	// The disk tiers.
	diskBytes, diskFiles, diskReserved        *prometheus.Desc
	diskHits, diskFills, diskFollowers        *prometheus.Desc
	diskFillErrors, diskEvictions             *prometheus.Desc
	diskDiscarded, diskBypasses, diskHandoffs *prometheus.Desc
	diskUsable, diskMax                       *prometheus.Desc

	// The flows: fills in flight and their followers, store egress, and
	// the store read gate (store_concurrency): slots in use, reads
	// waiting, reads refused.
	fills, followers, readBytes         *prometheus.Desc
	gateInUse, gateWaiting, gateRefused *prometheus.Desc

	// A SQLite store's reads of a rollback-journal file: with a lock or
	// without.
	sqliteRecordReads, sqliteFillReads *prometheus.Desc

	// An S3 store's faults, by class.
	s3Errors *prometheus.Desc

	caches refSet[*store.Cached, string] // the value: the store's backend
	disks  refSet[*store.DiskTier, struct{}]
}

func newScrapeCollector(prefix string) *scrapeCollector {
	p := prefix + "disk_"
	return &scrapeCollector{
		hits: prometheus.NewDesc(prefix+"cache_hits_total",
			"Segment cache answers from memory, by entry (record: Lookup within the record TTL; bytes: segment bytes; grace: a record past the TTL, read within grace, while the store cannot be read; refusal: a refusal decided on a fresh read less than 1s ago, at most record_ttl, answered again without a read).", []string{"entry"}, nil),
		misses: prometheus.NewDesc(prefix+"cache_misses_total",
			"Segment cache reads that went to the store, by entry (record, bytes; concurrent misses of one segment share one read).", []string{"entry"}, nil),
		passThrough: prometheus.NewDesc(prefix+"cache_pass_through_total",
			"Segment bodies streamed from the store uncached (too large, length unknown, or no room).", nil, nil),
		bytes: prometheus.NewDesc(prefix+"cache_held_bytes",
			"Bytes the segment caches hold now (entries and fills in progress).", nil, nil),
		records: prometheus.NewDesc(prefix+"cache_held_records",
			"Records the segment caches hold now.", nil, nil),
		evictions: prometheus.NewDesc(prefix+"cache_evictions_total",
			"Entries dropped to stay within max_records (entry=record) or max_bytes (entry=bytes).", []string{"entry"}, nil),
		coalesced: prometheus.NewDesc(prefix+"cache_coalesced_waits_total",
			"Requests that waited for a store read another request had started, instead of reading themselves.", nil, nil),
		variants: prometheus.NewDesc(prefix+"variants_total",
			"Compressed variants of segments, by result: made (built, verified, kept), rejected (did not decode to the segment: never kept or served), incompressible (would not shrink the segment by 10%: served identity).", []string{"result"}, nil),
		breakerOpen: prometheus.NewDesc(prefix+"store_breaker_open",
			"Segment stores whose breaker is open now (0 or 1 per handler's store): the last calls found the store unreadable, requests stop waiting on it, and a background probe waits for it to answer.", nil, nil),
		breakerTrips: prometheus.NewDesc(prefix+"store_breaker_trips_total",
			"Times a segment store's breaker opened.", nil, nil),
		fastFailures: prometheus.NewDesc(prefix+"store_fast_failures_total",
			"Store calls answered at once, without calling the store, because its breaker was open.", nil, nil),
		corruptBackoffs: prometheus.NewDesc(prefix+"store_corrupt_backoffs_total",
			"Segment reads answered 503 without reading the store because its bytes failed verification less than a backoff ago.", nil, nil),

		diskBytes:      prometheus.NewDesc(p+"bytes", "Bytes of the complete segment files the disk tier indexes.", nil, nil),
		diskFiles:      prometheus.NewDesc(p+"files", "Complete segment files the disk tier indexes.", nil, nil),
		diskReserved:   prometheus.NewDesc(p+"reserved_bytes", "Bytes the disk tier reserves for fills in progress.", nil, nil),
		diskHits:       prometheus.NewDesc(p+"hits_total", "Segment reads served from a complete, verified file of the disk tier.", nil, nil),
		diskFills:      prometheus.NewDesc(p+"fills_total", "Segments copied from the store into the disk tier and verified (one store read each).", nil, nil),
		diskFollowers:  prometheus.NewDesc(p+"followers_total", "Segment reads that joined a disk tier fill already running instead of reading the store.", nil, nil),
		diskFillErrors: prometheus.NewDesc(p+"fill_errors_total", "Disk tier fills that failed (store error, bytes not matching the id, disk fault). After a disk fault their readers continue from the store (handoffs_total); otherwise they were aborted.", nil, nil),
		diskHandoffs:   prometheus.NewDesc(p+"handoffs_total", "Readers of a disk tier fill that failed on the disk (full, write error) that continued from the store, verified, instead of failing.", nil, nil),
		diskEvictions:  prometheus.NewDesc(p+"evictions_total", "Files removed from the disk tier to stay within disk_max_bytes.", nil, nil),
		diskDiscarded:  prometheus.NewDesc(p+"discarded_total", "Files removed from the disk tier because their size or hash was wrong, or they changed (size, inode, mtime) since they were verified.", nil, nil),
		diskBypasses: prometheus.NewDesc(p+"bypasses_total",
			"Segment reads the disk tier declined (streamed from the store instead), by reason: too_large (over disk_max_bytes), no_room (budget held by fills), unavailable (directory unusable, disk full).", []string{"reason"}, nil),
		diskUsable: prometheus.NewDesc(p+"usable",
			"Disk tiers usable now: 1 per tier whose directory was usable at its last check, 0 while one has turned itself off (directory unusable, disk full) and serves from the store until a retry finds it usable.", nil, nil),
		diskMax: prometheus.NewDesc(p+"max_bytes", "The disk tiers' budgets (disk_max_bytes), summed: disk_bytes plus disk_reserved_bytes against it is how full the tier is.", nil, nil),

		fills: prometheus.NewDesc(prefix+"fills_in_flight",
			"Store reads filling a tier now, by tier (memory: the bytes cache; disk: the disk tier).", []string{"tier"}, nil),
		followers: prometheus.NewDesc(prefix+"fill_followers",
			"Requests attached now to a fill another request started, by tier (memory: waiting for the fill; disk: reading the fill as it lands).", []string{"tier"}, nil),
		readBytes: prometheus.NewDesc(prefix+"store_read_bytes_total",
			"Segment bytes read from the store (memory and disk fills, streamed bodies; records not counted), by backend: the store's egress.", []string{"backend"}, nil),
		gateInUse: prometheus.NewDesc(prefix+"store_reads_in_use",
			"Distinct store reads (record lookups, memory and disk fills) holding a slot of store_concurrency now, by backend.", []string{"backend"}, nil),
		gateWaiting: prometheus.NewDesc(prefix+"store_reads_waiting",
			"Store reads waiting for a slot of store_concurrency now (in store_queue), by backend.", []string{"backend"}, nil),
		gateRefused: prometheus.NewDesc(prefix+"store_reads_refused_total",
			"Store reads refused for want of a slot (store_queue full, or store_queue_wait passed): their requests were answered 503 edge.overloaded, by backend.", []string{"backend"}, nil),
		sqliteRecordReads: prometheus.NewDesc(prefix+"sqlite_record_reads_total",
			"How a SQLite store in a rollback journal answered record lookups: snapshot (the file unchanged since a read: no read, no lock), lockfree (a read transaction that took no lock and was verified against the file's header, size, times, journal and writer locks), locked (a read transaction under a SHARED lock, which a writer without a busy handler can fail against).", []string{"mode"}, nil),
		sqliteFillReads: prometheus.NewDesc(prefix+"sqlite_fill_reads_total",
			"How a SQLite store in a rollback journal read segment fills: lockfree (no lock, bytes verified against the id), locked (chunked read transactions under a SHARED lock).", []string{"mode"}, nil),
		s3Errors: prometheus.NewDesc(prefix+"s3_errors_total",
			"Faults of S3 store calls, by class: 4xx, 5xx (the object store's answer; a missing key is not a fault), timeout (no answer within store_timeout), network (refused, reset, DNS, TLS). A call abandoned by its client is not counted.", []string{"class"}, nil),
	}
}

// addCache starts reporting s (whose store is backend); removeCache
// stops. Both count references, so one store shared by two handlers is
// reported once; addDisk and removeDisk do the same for a disk tier.
func (c *scrapeCollector) addCache(s *store.Cached, backend string) { c.caches.add(s, backend) }
func (c *scrapeCollector) removeCache(s *store.Cached)              { c.caches.remove(s) }
func (c *scrapeCollector) addDisk(d *store.DiskTier)                { c.disks.add(d, struct{}{}) }
func (c *scrapeCollector) removeDisk(d *store.DiskTier)             { c.disks.remove(d) }

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.hits, c.misses, c.passThrough, c.bytes, c.records, c.evictions, c.coalesced, c.variants,
		c.breakerOpen, c.breakerTrips, c.fastFailures, c.corruptBackoffs,
		c.diskBytes, c.diskFiles, c.diskReserved, c.diskHits, c.diskFills, c.diskFollowers,
		c.diskFillErrors, c.diskEvictions, c.diskDiscarded, c.diskBypasses, c.diskHandoffs,
		c.diskUsable, c.diskMax, c.s3Errors,
		c.fills, c.followers, c.readBytes, c.gateInUse, c.gateWaiting, c.gateRefused,
		c.sqliteRecordReads, c.sqliteFillReads,
	} {
		ch <- d
	}
}

// Collect reports the caches' series, and only the series that can
// occur in this process: the store families by the backends in use, the
// SQLite reads with a SQLite store, the S3 faults with an S3 store, the
// disk tier's series with a disk tier.
func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	var sum store.CacheStats
	var ds store.DiskStats
	open := 0
	var memFills, memWaiting int64
	read := map[string]int64{}
	inUse := map[string]int64{}
	waiting := map[string]int64{}
	refused := map[string]int64{}
	var sq sqlite.Stats
	var s3e s3.ErrorStats
	c.caches.each(func(s *store.Cached, backend string) {
		st := s.Stats()
		sum.RecordHits += st.RecordHits
		sum.RecordMisses += st.RecordMisses
		sum.ByteHits += st.ByteHits
		sum.ByteMisses += st.ByteMisses
		sum.PassThrough += st.PassThrough
		sum.Bytes += st.Bytes
		sum.Records += st.Records
		sum.RecordEvictions += st.RecordEvictions
		sum.ByteEvictions += st.ByteEvictions
		sum.Coalesced += st.Coalesced
		sum.Variants.Made += st.Variants.Made
		sum.Variants.Rejected += st.Variants.Rejected
		sum.Variants.Incompressible += st.Variants.Incompressible
		sum.GraceHits += st.GraceHits
		sum.RefusalHits += st.RefusalHits
		if st.BreakerOpen {
			open++
		}
		sum.BreakerTrips += st.BreakerTrips
		sum.FastFailures += st.FastFailures
		sum.CorruptBackoffs += st.CorruptBackoffs

		f := s.Flow()
		memFills += f.MemoryFills
		memWaiting += f.MemoryWaiting
		read[backend] += f.StoreReadBytes
		inUse[backend] += f.Gate.InUse
		waiting[backend] += f.Gate.Waiting
		refused[backend] += f.Gate.Refused
		switch b := f.Backend.(type) {
		case sqlite.Stats:
			sq.Records.SnapshotHits += b.Records.SnapshotHits
			sq.Records.LockFree += b.Records.LockFree
			sq.Records.Batches += b.Records.Batches
			sq.Fills.Reads += b.Fills.Reads
			sq.Fills.Fallbacks += b.Fills.Fallbacks
		case s3.ErrorStats:
			s3e.Status4xx += b.Status4xx
			s3e.Status5xx += b.Status5xx
			s3e.Timeout += b.Timeout
			s3e.Network += b.Network
		}
	})
	disks, usable := 0, 0
	c.disks.each(func(d *store.DiskTier, _ struct{}) {
		st := d.Stats()
		disks++
		if st.Usable {
			usable++
		}
		ds.MaxBytes += st.MaxBytes
		ds.Bytes += st.Bytes
		ds.Files += st.Files
		ds.Reserved += st.Reserved
		ds.Hits += st.Hits
		ds.Fills += st.Fills
		ds.Followers += st.Followers
		ds.FillErrors += st.FillErrors
		ds.Handoffs += st.Handoffs
		ds.Evictions += st.Evictions
		ds.Discarded += st.Discarded
		ds.BypassTooLarge += st.BypassTooLarge
		ds.BypassNoRoom += st.BypassNoRoom
		ds.BypassUnavailable += st.BypassUnavailable
		ds.FillsInFlight += st.FillsInFlight
		ds.Following += st.Following
	})
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}

	counter(c.hits, float64(sum.RecordHits), "record")
	counter(c.hits, float64(sum.ByteHits), "bytes")
	counter(c.hits, float64(sum.GraceHits), "grace")
	counter(c.hits, float64(sum.RefusalHits), "refusal")
	counter(c.misses, float64(sum.RecordMisses), "record")
	counter(c.misses, float64(sum.ByteMisses), "bytes")
	counter(c.passThrough, float64(sum.PassThrough))
	gauge(c.bytes, float64(sum.Bytes))
	gauge(c.records, float64(sum.Records))
	counter(c.evictions, float64(sum.RecordEvictions), "record")
	counter(c.evictions, float64(sum.ByteEvictions), "bytes")
	counter(c.coalesced, float64(sum.Coalesced))
	if _, ok := read[backendSQLite]; ok {
		counter(c.sqliteRecordReads, float64(sq.Records.SnapshotHits), "snapshot")
		counter(c.sqliteRecordReads, float64(sq.Records.LockFree), "lockfree")
		counter(c.sqliteRecordReads, float64(sq.Records.Batches), "locked")
		counter(c.sqliteFillReads, float64(sq.Fills.Reads), "lockfree")
		counter(c.sqliteFillReads, float64(sq.Fills.Fallbacks), "locked")
	}
	if _, ok := read[backendS3]; ok {
		counter(c.s3Errors, float64(s3e.Status4xx), "4xx")
		counter(c.s3Errors, float64(s3e.Status5xx), "5xx")
		counter(c.s3Errors, float64(s3e.Timeout), "timeout")
		counter(c.s3Errors, float64(s3e.Network), "network")
	}
	counter(c.variants, float64(sum.Variants.Made), "made")
	counter(c.variants, float64(sum.Variants.Rejected), "rejected")
	counter(c.variants, float64(sum.Variants.Incompressible), "incompressible")
	gauge(c.breakerOpen, float64(open))
	counter(c.breakerTrips, float64(sum.BreakerTrips))
	counter(c.fastFailures, float64(sum.FastFailures))
	counter(c.corruptBackoffs, float64(sum.CorruptBackoffs))

	gauge(c.fills, float64(memFills), "memory")
	gauge(c.followers, float64(memWaiting), "memory")
	for b, v := range read {
		counter(c.readBytes, float64(v), b)
		gauge(c.gateInUse, float64(inUse[b]), b)
		gauge(c.gateWaiting, float64(waiting[b]), b)
		counter(c.gateRefused, float64(refused[b]), b)
	}

	if disks == 0 {
		return
	}
	gauge(c.diskUsable, float64(usable))
	gauge(c.diskMax, float64(ds.MaxBytes))
	gauge(c.diskBytes, float64(ds.Bytes))
	gauge(c.diskFiles, float64(ds.Files))
	gauge(c.diskReserved, float64(ds.Reserved))
	counter(c.diskHits, float64(ds.Hits))
	counter(c.diskFills, float64(ds.Fills))
	counter(c.diskFollowers, float64(ds.Followers))
	counter(c.diskFillErrors, float64(ds.FillErrors))
	counter(c.diskHandoffs, float64(ds.Handoffs))
	counter(c.diskEvictions, float64(ds.Evictions))
	counter(c.diskDiscarded, float64(ds.Discarded))
	counter(c.diskBypasses, float64(ds.BypassTooLarge), "too_large")
	counter(c.diskBypasses, float64(ds.BypassNoRoom), "no_room")
	counter(c.diskBypasses, float64(ds.BypassUnavailable), "unavailable")
	gauge(c.fills, float64(ds.FillsInFlight), "disk")
	gauge(c.followers, float64(ds.Following), "disk")
}

// Interface guards
var (
	_ prometheus.Collector = (*scrapeCollector)(nil)
)
