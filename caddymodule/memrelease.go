package caddymodule

import (
	"runtime/debug"
	"sync"
	"time"
)

// Returning a crowd's memory. A crowd of SQLite streams past the cap
// (streamcap.go) leaves behind garbage: its connections, their
// goroutines and requests, the chunks its streams read. When the crowd
// leaves at once (its clients close without reading), nothing allocates
// afterwards, so the Go runtime runs no collection until its periodic one
// (every 2 minutes) and the process keeps the crowd's RSS all that time
// (docs/performance.md, "Returning a crowd's memory").
//
// So when the SQLite streams of a handler go idle (no stream, no waiter)
// after an overload (an answer refused 503 edge.overloaded for lack of a
// slot), the process returns its free memory to the operating system
// once (debug.FreeOSMemory: a collection, then every free page handed
// back), memReleaseDelay later and at most once every memReleaseGap for
// the whole process. It runs on a timer's goroutine, never in a request:
// its cost, one collection, is a few milliseconds of one core for an
// edge's heap (the bytes cache's blobs hold no pointers to mark), at most
// once per memReleaseGap, and only after an overload. Requests that never
// meet the cap (every hit, every stream below it) do not touch it.
const (
	// memReleaseDelay: how long after the streams go idle the memory is
	// returned; a second crowd arriving within it is released with the
	// first.
	memReleaseDelay = time.Second
	// memReleaseGap: the least time between two releases, so an edge
	// overloaded over and over collects at most this often on its own
	// (plus the runtime's collections). With memReleaseDelay, the memory
	// is back at most this long after a crowd leaves.
	memReleaseGap = 5 * time.Second
)

// memReleaser schedules debug.FreeOSMemory, rate-limited. A nil
// *memReleaser does nothing.
type memReleaser struct {
	free       func()
	after      func(time.Duration, func()) // time.AfterFunc, injectable
	now        func() time.Time
	delay, gap time.Duration

	mu      sync.Mutex
	pending bool
	last    time.Time // the last release; zero: none yet
	count   int       // releases done
}

// processMemRelease is the process's releaser: FreeOSMemory acts on the
// whole process, so its rate limit is shared by every handler.
var processMemRelease = &memReleaser{
	free:  debug.FreeOSMemory,
	after: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
	now:   time.Now,
	delay: memReleaseDelay,
	gap:   memReleaseGap,
}

// schedule arranges one release: delay from now, or gap after the last
// one if that is later; a release already pending covers this one too.
func (m *memReleaser) schedule() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending {
		return
	}
	m.pending = true
	wait := m.delay
	if !m.last.IsZero() {
		wait = max(wait, m.last.Add(m.gap).Sub(m.now()))
	}
	m.after(wait, m.fire)
}

func (m *memReleaser) fire() {
	m.mu.Lock()
	m.pending = false
	m.last = m.now()
	m.count++
	m.mu.Unlock()
	m.free()
}

// releases is the number of releases done.
func (m *memReleaser) releases() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.count
}
