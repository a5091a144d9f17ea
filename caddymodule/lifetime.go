package caddymodule

import (
	"sync"
	"sync/atomic"
)

// lifetime defers releasing a handler's store until the requests still
// running on it are done. On a reload Caddy starts the old servers'
// graceful shutdown and then cleans up the old config's modules without
// waiting for the shutdown to finish, so Cleanup can run while requests
// of the old config are still reading from the store. Closing it then
// would turn those in-flight downloads into 503s (or worse, if the field
// were cleared under them).
//
// The zero value is ready to use, and a nil *lifetime releases at once
// (a handler built without Provision). enter/leave cost one atomic add.
type lifetime struct {
	active atomic.Int64

	mu      sync.Mutex
	release func() // set by end; taken and run exactly once
}

// enter marks a request using the store; leave must follow.
func (l *lifetime) enter() {
	if l != nil {
		l.active.Add(1)
	}
}

// leave ends a request; the last one out after end runs the release.
func (l *lifetime) leave() {
	if l != nil && l.active.Add(-1) == 0 {
		l.tryRelease()
	}
}

// end schedules release to run once no request is active (now, if none
// is). It never blocks on requests.
func (l *lifetime) end(release func()) {
	if l == nil {
		release()
		return
	}
	l.mu.Lock()
	l.release = release
	l.mu.Unlock()
	l.tryRelease()
}

func (l *lifetime) tryRelease() {
	l.mu.Lock()
	r := l.release
	if r == nil || l.active.Load() != 0 {
		l.mu.Unlock()
		return
	}
	l.release = nil
	l.mu.Unlock()
	r()
}
