package store

import (
	"sync"
	"time"
)

// TestClock is a settable clock for CacheOptions.Now, safe for
// concurrent use.
type TestClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewTestClock is a TestClock at t.
func NewTestClock(t time.Time) *TestClock { return &TestClock{t: t} }

// Now is the clock's time.
func (c *TestClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Add moves the clock on by d.
func (c *TestClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// GroupStats counts the group reads (RecordGroupReader.LookupGroup
// calls) and the records they refreshed.
func (c *Cached) GroupStats() (reads, refreshed int64) {
	return c.groupReads.Load(), c.groupRefreshed.Load()
}
