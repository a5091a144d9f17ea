package caddymodule

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Bounded memory per reader on the SQLite stream path. A segment that is
// neither in the bytes cache nor a file of the disk tier (the tier off,
// declining, full, or the segment above its budget) streams from the
// SQLite store, which holds one chunk buffer per reader (1 MiB: each
// chunk is its own read transaction, and incremental blob I/O walks the
// blob's overflow pages from its start on every open, so much smaller
// chunks cost far more per byte). A reader that never reads pins that
// buffer, and more than its size in RSS with Go's garbage-collection
// headroom (docs/performance.md, "Bounded SQLite streams"). So:
//
//   - at most maxSQLiteStreams such answers stream at once per handler;
//     one more waits up to streamSlotWait for a slot (fast downloads end
//     within it), at most maxSQLiteWaiters of them at once; past the wait
//     or that many waiters, it is answered 503 edge.overloaded with a Retry-After
//     of 1 to overloadRetrySpread seconds chosen at random, so the refused
//     clients do not come back together. 4 streams hold 4 MiB of chunk
//     buffers; what a crowd of stalled readers costs beyond them is
//     mostly its connections and their goroutines, which Go keeps for a
//     while after they end, and more streams held more
//     (docs/performance.md, "Bounded SQLite streams"). 4 streams already
//     keep both cores of a small edge busy (a chunked SQLite stream is
//     CPU-bound). The disk tier, on by default, serves large segments
//     from files and is not capped.
//   - a stream whose client takes no byte for streamStallTimeout is cut
//     (the connection's write deadline, renewed on every write), so stalled
//     readers give their slots back instead of holding them until the
//     server's write timeout, which Caddy does not set by default.
//
// Bodies held in memory (a bytes cache hit) or in a disk-tier file cost no
// per-reader buffer and are not counted; nor are S3 bodies, which the HTTP
// client reads in small buffers.
const (
	maxSQLiteStreams    = 4
	maxSQLiteWaiters    = 64
	overloadRetrySpread = 5 // seconds
	streamSlotWait      = 15 * time.Second
	streamStallTimeout  = 30 * time.Second
	streamCopyBuffer    = 32 << 10
)

// errOverloaded answers a request the edge has no capacity for now.
var errOverloaded = protoError{http.StatusServiceUnavailable, "edge.overloaded", "internal", true, "retryLater"}

// streamSlots counts the answers streaming from the store, and the
// answers waiting for a slot; nil: no cap.
type streamSlots = *slots

type slots struct {
	ch      chan struct{}
	waiting atomic.Int32
	maxWait int32
	// overloaded: an answer was refused for lack of a slot since the
	// streams were last idle; when they are idle again, mem returns the
	// crowd's memory (memrelease.go; nil: never).
	overloaded atomic.Bool
	mem        *memReleaser
}

func newStreamSlots(n, waiters int) streamSlots {
	return &slots{ch: make(chan struct{}, n), maxWait: int32(waiters), mem: processMemReleaser()}
}

// tryAcquire takes a slot without waiting.
func (s *slots) tryAcquire() bool {
	if s == nil {
		return true
	}
	select {
	case s.ch <- struct{}{}:
		return true
	default:
		return false
	}
}

// acquire takes a slot, waiting up to wait for one (or until ctx ends)
// unless maxWait answers wait already. A waiter holds no stream buffer:
// the store reads its first chunk only when the body is read.
func (s *slots) acquire(ctx context.Context, wait time.Duration) bool {
	if ctx.Err() != nil {
		return false // the client left while the answer was being set up
	}
	if s.tryAcquire() {
		return true
	}
	if s.waiting.Add(1) > s.maxWait {
		s.overloaded.Store(true)
		s.waiting.Add(-1)
		s.settled()
		return false
	}
	defer s.settled()
	defer s.waiting.Add(-1)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s.ch <- struct{}{}:
		// A slot and the client's leaving can be ready at once, and
		// select picks either: a client that left gets no stream (its
		// first chunk would be read only to be thrown away, and a crowd
		// of closing waiters would churn a chunk each).
		if ctx.Err() != nil {
			<-s.ch
			return false
		}
		return true
	case <-t.C:
		s.overloaded.Store(true)
		return false
	case <-ctx.Done():
		return false
	}
}

func (s *slots) release() {
	if s != nil {
		<-s.ch
		s.settled()
	}
}

// settled follows a stream's or a waiter's end: when it leaves the
// streams idle after an overload, the crowd's memory is returned
// (memrelease.go). Two loads on every other end.
func (s *slots) settled() {
	if s.overloaded.Load() && len(s.ch) == 0 && s.waiting.Load() == 0 && s.overloaded.CompareAndSwap(true, false) {
		s.mem.schedule()
	}
}

// taken is the number of slots in use.
func (s *slots) taken() int { return len(s.ch) }

// overloaded answers 503 edge.overloaded with a jittered Retry-After.
func (h *Handler) overloaded(w http.ResponseWriter, d *decision) {
	h.refuseOverloaded(w, d, "too many segment streams in progress")
}

// refuseOverloaded answers 503 edge.overloaded, for reason msg, with a
// Retry-After of 1 to overloadRetrySpread seconds chosen at random.
func (h *Handler) refuseOverloaded(w http.ResponseWriter, d *decision, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(1+h.jitter(overloadRetrySpread)))
	d.refuse(w, errOverloaded, msg)
}

// serverWriteDeadline is when the server's write timeout ends the
// response of r, started at start (zero: no write timeout).
func serverWriteDeadline(r *http.Request, start time.Time) time.Time {
	if srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok && srv.WriteTimeout > 0 {
		return start.Add(srv.WriteTimeout)
	}
	return time.Time{}
}
