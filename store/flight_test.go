package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFlightPanicIsAnError(t *testing.T) {
	var g flight[int]
	_, err := g.do(context.Background(), "k", time.Second, func(context.Context) (int, error) { panic("boom") })
	if err == nil || !strings.Contains(err.Error(), "panic") {
		t.Fatalf("err = %v, want the panic as an error", err)
	}
	// The key is free again: the next call runs.
	if v, err := g.do(context.Background(), "k", time.Second, func(context.Context) (int, error) { return 7, nil }); v != 7 || err != nil {
		t.Fatalf("after a panic: %d, %v", v, err)
	}
}

func TestFlightTimeoutAndDetach(t *testing.T) {
	var g flight[int]
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the caller is gone before the call starts
	got := make(chan error, 1)
	_, err := g.do(ctx, "k", 20*time.Millisecond, func(sctx context.Context) (int, error) {
		<-sctx.Done() // ends by the timeout, not by the caller
		got <- sctx.Err()
		return 0, sctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("caller err = %v, want its own cancellation", err)
	}
	select {
	case e := <-got:
		if !errors.Is(e, context.DeadlineExceeded) {
			t.Fatalf("shared call ended with %v, want its timeout", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("shared call never ended")
	}
}
