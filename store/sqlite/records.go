package sqlite

import (
	"bytes"
	"context"
	"errors"
	"github.com/syncular/caddy-syncular/store"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Record reads of a rollback-journal file, with as few SHARED locks as
// possible.
//
// Every locked read is a chance for the writer's commit to fail: a
// writer without a busy handler (the reference sync server sets none)
// fails at once when it wants its EXCLUSIVE lock while the edge holds a
// SHARED one, and an edge goroutine that is descheduled while it holds
// the lock (a loaded machine) holds it for milliseconds. A batch is first
// read with no lock at all (records_lockfree.go), and trusted only
// when nothing wrote the file meanwhile; the locked read below is what
// answers when that read decides nothing. Two things cut the number of
// locks that read takes, and the number of reads:
//
//   - Batching. Lookups that arrive while a record read is queued or in
//     flight are read together, in one read transaction (one SHARED lock)
//     on one connection, instead of one lock each: a cold storm asks for
//     every segment's record at once.
//   - A snapshot. The records a batch read are kept, tagged with the
//     16 bytes at offset 24 of the database header (the file change
//     counter, the page count and the freelist fields), read while the
//     batch still held its SHARED lock. A later lookup of a kept record
//     reads those bytes with a plain pread, taking no lock; when they are
//     unchanged and no journal with a live header is beside the file, the
//     file holds the same committed data and the kept record is the
//     answer. This is the test SQLite's own pager makes before it trusts
//     its page cache across transactions. In a rollback journal every
//     commit rewrites page 1 with the counter incremented before its
//     commit point, so a committed change always shows in these bytes; a
//     transaction rolled back (spilled or not) restores the data and the
//     bytes together, and a transaction in progress has not changed the
//     committed data. A file in WAL (header bytes 18 and 19 are 2) is
//     never answered from the snapshot: its commits do not touch the
//     database file's header.
//
// A record that fails to decode is never kept (it is the read's fault,
// as before), so the snapshot holds only what a locked read decoded.
//
// Group reads (LookupGroup, for the record cache's refreshes): a lookup
// may carry other ids, read in its batch's transaction after the batch's
// own lookups, up to maxGroupRead of them per transaction. They are best
// effort: one not found or undecodable is left out, and the batch stops
// reading them when a writer's journal appears (as it yields) or a read
// fails, keeping what its own lookups read.

// snapshotMaxAge bounds how long a snapshot is trusted while its header
// bytes stay the same, so a counter that wrapped around (2^32 commits)
// cannot match an old one.
const snapshotMaxAge = time.Minute

// maxSnapshotRecords caps the snapshot; past it a new batch starts over.
const maxSnapshotRecords = 4096

// maxBatch is how many lookups one read transaction reads at most.
const maxBatch = 64

// maxGroupRead is how many group ids one read transaction reads at most,
// besides its lookups. Each record is a few B-tree descents of pages the
// batch's first read already brought into the page cache (tens of
// microseconds), so 64 add about a millisecond to a lock whose risk is
// dominated by the time its goroutine waits to run again on a loaded
// machine.
const maxGroupRead = 64

// batchGather is how long the first batch of a burst waits for the rest.
const batchGather = time.Millisecond

// maxYields is how often one run of batches gives way to a writer whose
// journal appeared (a journal left by a crashed writer stays: past this,
// reads go on and SQLite's locks decide, as a read-only reader cannot
// roll it back).
const maxYields = 16

// journalMagic opens a rollback journal's live header (a PERSIST journal
// zeroes it at commit; TRUNCATE leaves it empty; DELETE removes it).
var journalMagic = []byte{0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7}

// RecordReadStats counts how the record lookups of a rollback-journal
// file were answered since the store opened.
type RecordReadStats struct {
	SnapshotHits int64 // answered from the snapshot, no lock taken
	Batches      int64 // read transactions (one SHARED lock each, retries aside)
	Batched      int64 // records read by them
	Yields       int64 // batches cut short (or not begun) because a writer began
	Grouped      int64 // group ids read by them, besides their lookups (LookupGroup)
	LockFree     int64 // batches read on the nolock connection and verified (no lock taken)
	LockFreeMiss int64 // lock-free reads that decided nothing (read again, or with a lock)
}

// RecordReadStats returns the counters.
func (s *Store) RecordReadStats() RecordReadStats {
	return RecordReadStats{SnapshotHits: s.rrHits.Load(), Batches: s.rrBatches.Load(), Batched: s.rrBatched.Load(),
		Yields: s.rrYields.Load(), Grouped: s.rrGrouped.Load(),
		LockFree: s.rrLockFree.Load(), LockFreeMiss: s.rrLockFreeMissed.Load()}
}

type recordReadCounters struct {
	rrHits, rrBatches, rrBatched, rrYields, rrGrouped atomic.Int64
	rrLockFree, rrLockFreeMissed                      atomic.Int64
}

// recordCall is one lookup waiting for a batch.
type recordCall struct {
	id    string
	flags shapeFlags
	done  chan struct{}
	rec   *store.Record
	ver   int64
	err   error
	also  []string            // group ids to read in the same transaction
	group map[string]groupRec // what was read of them (and of others' also)
}

// groupRec is a group id's record and the schema version it was read at.
type groupRec struct {
	rec *store.Record
	ver int64
}

// recordReader is a rollback-journal handle's batcher and snapshot.
type recordReader struct {
	hdr      *os.File         // the database file, for the header pread; closed last
	journal  string           // the journal's path
	lockFree *lockFreeRecords // nil: every batch is read with a lock (records_lockfree.go)
	stats    *recordReadCounters
	wg       sync.WaitGroup // batch goroutines (sqliteHandle.retire waits)

	mu      sync.Mutex
	pending []*recordCall
	running bool

	snapMu  sync.Mutex
	vers    [16]byte // header bytes 24..39 the snapshot was read at
	taken   time.Time
	entries map[string]snapEntry // nil: no snapshot
}

type snapEntry struct {
	rec   *store.Record // nil: no sync_segments row
	ver   int64
	flags shapeFlags
}

func newRecordReader(path string, stats *recordReadCounters) *recordReader {
	r := &recordReader{journal: path + "-journal", stats: stats}
	f, err := os.Open(path)
	if err != nil {
		return r // no snapshot: every lookup is batched and locked
	}
	r.hdr, r.lockFree = f, newLockFreeRecords(path)
	return r
}

// close ends the reader after every connection on the file is closed:
// closing a descriptor drops every POSIX lock this process holds on the
// file, its SQLite connections' included.
func (r *recordReader) close() {
	if r.lockFree != nil {
		r.lockFree.close()
	}
	if r.hdr != nil {
		r.hdr.Close()
	}
}

// header reads the database header's version bytes (24..39) without a
// lock; ok is false when the file is not in a rollback journal's format
// or cannot be read.
func (r *recordReader) header() (vers [16]byte, ok bool) {
	b, ok := r.rawHeader()
	copy(vers[:], b[24:40])
	return vers, ok
}

// rawHeader reads the database header's first 44 bytes with a plain
// pread; ok is false when the file is not in a rollback journal's format
// (bytes 18 and 19 are 1; 2 is WAL) or cannot be read.
func (r *recordReader) rawHeader() (b [44]byte, ok bool) {
	if r.hdr == nil {
		return b, false
	}
	if n, err := r.hdr.ReadAt(b[:], 0); n != len(b) || err != nil {
		return b, false
	}
	return b, b[18] == 1 && b[19] == 1
}

// journalLive reports whether a journal with a live header may be beside
// the file (a writer mid-transaction, or one that crashed: a hot
// journal). Any doubt is a yes.
func (r *recordReader) journalLive() bool {
	fi, err := os.Stat(r.journal)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	if fi.Size() == 0 {
		return false
	}
	f, err := os.Open(r.journal)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	defer f.Close()
	var b [8]byte
	n, _ := f.ReadAt(b[:], 0)
	return n != len(b) || bytes.Equal(b[:], journalMagic)
}

// cached answers id from the snapshot when it is still the file's
// committed data (see the comment at the top of this file), with the
// records of also the snapshot holds (every entry is of the same data).
func (r *recordReader) cached(id string, also []string, sh *sqliteShape) (*store.Record, map[string]groupRec, bool) {
	r.snapMu.Lock()
	e, ok := r.entries[id]
	vers, taken := r.vers, r.taken
	var grp map[string]groupRec
	if ok {
		for _, a := range also {
			if g, ok := r.entries[a]; ok && g.rec != nil && g.flags == sh.flags {
				if grp == nil {
					grp = make(map[string]groupRec, len(also))
				}
				grp[a] = groupRec{rec: g.rec, ver: g.ver}
			}
		}
	}
	r.snapMu.Unlock()
	if !ok || e.flags != sh.flags || e.ver != sh.version || time.Since(taken) > snapshotMaxAge {
		return nil, nil, false
	}
	if cur, ok := r.header(); !ok || cur != vers {
		return nil, nil, false
	}
	if r.journalLive() {
		return nil, nil, false
	}
	r.stats.rrHits.Add(1)
	return e.rec, grp, true
}

// keep adds a batch's records, read at vers, to the snapshot, with its
// group records.
func (r *recordReader) keep(vers [16]byte, calls []*recordCall, f shapeFlags, grp map[string]groupRec) {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	if r.entries == nil || r.vers != vers || time.Since(r.taken) > snapshotMaxAge || len(r.entries)+len(calls) > maxSnapshotRecords {
		r.entries, r.vers, r.taken = make(map[string]snapEntry, len(calls)), vers, time.Now()
	}
	for _, c := range calls {
		if c.err == nil {
			r.entries[c.id] = snapEntry{rec: c.rec, ver: c.ver, flags: c.flags}
		}
	}
	for id, g := range grp {
		if len(r.entries) >= maxSnapshotRecords {
			break
		}
		r.entries[id] = snapEntry{rec: g.rec, ver: g.ver, flags: f}
	}
}

// lookupRecord is Lookup's read of one record, and of also's best effort
// (see the comment at the top of this file): from the snapshot, or in
// the next batch.
func (h *sqliteHandle) lookupRecord(ctx context.Context, sh *sqliteShape, id string, also []string) (*store.Record, int64, map[string]groupRec, error) {
	r := h.records
	if rec, grp, ok := r.cached(id, also, sh); ok {
		return rec, sh.version, grp, nil
	}
	c := &recordCall{id: id, flags: sh.flags, done: make(chan struct{}), also: also}
	r.mu.Lock()
	joined := false
	for _, p := range r.pending { // queued, not yet read: its answer is as fresh
		if p.id == id && p.flags == sh.flags {
			c, joined = p, true
			if len(also) > 0 { // not read yet: its group grows
				p.also = append(p.also[:len(p.also):len(p.also)], also...)
			}
			break
		}
	}
	if !joined {
		r.pending = append(r.pending, c)
	}
	if !r.running {
		r.running = true
		r.wg.Add(1) // under h.use.RLock: retire cannot be waiting yet
		go h.runBatches()
	}
	r.mu.Unlock()
	select {
	case <-c.done:
		return c.rec, c.ver, c.group, c.err
	case <-ctx.Done():
		return nil, 0, nil, ctx.Err()
	}
}
