package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// gatedStore is a fakeStore whose Open waits for a gate, and which
// refuses every call once closed (as the SQLite store does).
type gatedStore struct {
	*fakeStore
	gate    chan struct{}
	opened  chan struct{}
	closed  atomic.Bool
	closeAt atomic.Int64
}

var errClosed = errors.New("store is closed")

func (g *gatedStore) Lookup(ctx context.Context, pid segid.ID) (*store.Record, error) {
	id := pid.String()
	if g.closed.Load() {
		return nil, errClosed
	}
	return g.fakeStore.Lookup(ctx, idOf(id))
}

func (g *gatedStore) Open(ctx context.Context, pid segid.ID, off, n int64) (io.ReadCloser, error) {
	id := pid.String()
	select {
	case g.opened <- struct{}{}:
	default:
	}
	<-g.gate
	if g.closed.Load() {
		return nil, errClosed
	}
	return g.fakeStore.Open(ctx, idOf(id), off, n)
}

func (g *gatedStore) Close() error {
	g.closed.Store(true)
	g.closeAt.Store(time.Now().UnixNano())
	return nil
}

// TestCleanupWaitsForInflight: on a reload Caddy cleans up the old config
// while its requests are still running; the store must stay open until
// the last of them is done, and Cleanup must not block on them.
func TestCleanupWaitsForInflight(t *testing.T) {
	fs := newFakeStore()
	body := []byte("bytes still being served when the config goes away")
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	gs := &gatedStore{fakeStore: fs, gate: make(chan struct{}), opened: make(chan struct{}, 1)}
	h := newTestHandler(t, gs, nil)
	url := "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))

	done := make(chan []byte)
	go func() {
		rec, _ := serve(t, h, "GET", url, nil)
		if rec.Code != 200 {
			t.Errorf("in-flight request answered %d: %s", rec.Code, rec.Body.String())
		}
		done <- rec.Body.Bytes()
	}()
	<-gs.opened
	start := time.Now()
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second { // blocking would last until the gate opens
		t.Errorf("Cleanup blocked %s on an in-flight request", d)
	}
	if gs.closed.Load() {
		t.Fatal("store closed under an in-flight request")
	}
	released := time.Now().UnixNano()
	close(gs.gate)
	if got := <-done; !bytes.Equal(got, body) {
		t.Fatalf("in-flight request got %q", got)
	}
	if !gs.closed.Load() || gs.closeAt.Load() < released {
		t.Fatal("store not closed after the last request left")
	}
	if err := h.Cleanup(); err != nil { // a second Cleanup is harmless
		t.Fatal(err)
	}

	// Nothing in flight: released at once.
	gs2 := &gatedStore{fakeStore: fs, gate: make(chan struct{}), opened: make(chan struct{}, 1)}
	h2 := newTestHandler(t, gs2, nil)
	if err := h2.Cleanup(); err != nil || !gs2.closed.Load() {
		t.Fatalf("idle Cleanup: err %v, closed %v", err, gs2.closed.Load())
	}
}

// TestCleanupUnderLoad runs Cleanup while many requests are in flight
// (meant for -race): every request that started before Cleanup succeeds,
// the store closes exactly once, after the last one.
func TestCleanupUnderLoad(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	gs := &gatedStore{fakeStore: fs, gate: make(chan struct{}), opened: make(chan struct{}, 1)}
	close(gs.gate)
	h := newTestHandler(t, gs, nil)
	url := "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))
	var wg sync.WaitGroup
	var bad atomic.Int64
	start := make(chan struct{})
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := 0; j < 50; j++ {
				h.life.enter() // a request that entered before Cleanup...
				rec, _ := serve(t, h, "GET", url, nil)
				h.life.leave()
				if rec.Code != 200 {
					bad.Add(1)
				}
				if gs.closed.Load() {
					return
				}
			}
		}()
	}
	close(start)
	time.Sleep(5 * time.Millisecond)
	h.life.enter() // ...and one held across Cleanup
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if gs.closed.Load() {
		t.Fatal("closed while a request was held")
	}
	h.life.leave()
	wg.Wait()
	if !gs.closed.Load() {
		t.Fatal("never closed")
	}
	t.Logf("%d requests answered other than 200 (only possible after the release)", bad.Load())
}
