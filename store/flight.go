package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// flight makes concurrent calls for one key share a single execution
// (singleflight). The execution runs on its own goroutine under a context
// detached from every caller's cancellation and bounded by a timeout; a
// caller whose context ends stops waiting, the others keep waiting.
//
// Ours, not golang.org/x/sync/singleflight: a DoChan version needs this
// same mutex and per-key map (to count joins and callers), a Forget and a
// recover of its own (DoChan re-panics on a new goroutine, ending the
// process), and allocated more per shared call for no speed
// (docs/performance.md, "flight, not x/sync/singleflight").
type flight[T any] struct {
	mu     sync.Mutex
	calls  map[string]*flightCall[T]
	joined atomic.Int64 // callers that found a call under way
	// inFlight counts executions running now; joinedNow counts callers
	// that joined one and have not returned yet (gauges, read at scrape
	// time).
	inFlight, joinedNow atomic.Int64
}

// flightCall is one execution and the result its callers share.
type flightCall[T any] struct {
	done    chan struct{}
	val     T
	err     error
	waiters int // callers attached (read by tests: flight_export_test.go)
}

// doJoined returns fn's result for key, running fn only when no call for
// key is under way; ctx ends only this caller's wait. joined reports
// whether this caller joined a call another caller had started (rather
// than starting it).
func (g *flight[T]) doJoined(ctx context.Context, key string, timeout time.Duration, fn func(context.Context) (T, error)) (val T, joined bool, err error) {
	g.mu.Lock()
	if g.calls == nil {
		g.calls = map[string]*flightCall[T]{}
	}
	fc, ok := g.calls[key]
	if !ok {
		fc = &flightCall[T]{done: make(chan struct{})}
		g.calls[key] = fc
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		g.inFlight.Add(1)
		go g.run(sctx, cancel, key, fc, fn)
	} else {
		g.joined.Add(1)
		g.joinedNow.Add(1)
		defer g.joinedNow.Add(-1)
	}
	fc.waiters++
	g.mu.Unlock()
	select {
	case <-fc.done:
		return fc.val, ok, fc.err
	case <-ctx.Done():
		var zero T
		return zero, ok, fmt.Errorf("store: cache: %w", ctx.Err())
	}
}

// run executes fn for key and hands its result (or its panic, as an error)
// to every caller attached.
func (g *flight[T]) run(ctx context.Context, cancel context.CancelFunc, key string, fc *flightCall[T], fn func(context.Context) (T, error)) {
	defer cancel()
	defer g.inFlight.Add(-1)
	defer func() {
		if p := recover(); p != nil {
			fc.err = fmt.Errorf("store: cache: panic in shared store call: %v", p)
		}
		g.mu.Lock()
		delete(g.calls, key)
		g.mu.Unlock()
		close(fc.done)
	}()
	fc.val, fc.err = fn(ctx)
}

// start runs fn for key in the background unless a call for key is under
// way, and returns without waiting; started is false when one was (or
// spawn refused). fn runs under parent (its end stops it) on the
// goroutine spawn starts, so that the owner can stop and wait for it.
func (g *flight[T]) start(parent context.Context, spawn func(func()) bool, key string, timeout time.Duration, fn func(context.Context) (T, error)) (started bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.calls == nil {
		g.calls = map[string]*flightCall[T]{}
	}
	if _, ok := g.calls[key]; ok {
		g.joined.Add(1)
		return false
	}
	fc := &flightCall[T]{done: make(chan struct{})}
	sctx, cancel := context.WithTimeout(parent, timeout)
	g.calls[key] = fc
	g.inFlight.Add(1)
	if !spawn(func() { g.run(sctx, cancel, key, fc, fn) }) {
		cancel()
		g.inFlight.Add(-1)
		delete(g.calls, key)
		return false // the owner is closed
	}
	return true
}

// running reports whether a call for key is under way.
func (g *flight[T]) running(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[key] != nil
}

// wait waits until the call for key under way ends, or ctx ends; it
// reports whether a call was under way and ended.
func (g *flight[T]) wait(ctx context.Context, key string) bool {
	g.mu.Lock()
	fc := g.calls[key]
	g.mu.Unlock()
	if fc == nil {
		return false
	}
	select {
	case <-fc.done:
		return true
	case <-ctx.Done():
		return false
	}
}
