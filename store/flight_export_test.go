package store

import (
	"context"
	"time"
)

// do is doJoined without the joined report.
func (g *flight[T]) do(ctx context.Context, key string, timeout time.Duration, fn func(context.Context) (T, error)) (T, error) {
	v, _, err := g.doJoined(ctx, key, timeout, fn)
	return v, err
}

// waiting returns how many callers are attached to the call for key.
func (g *flight[T]) waiting(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if fc := g.calls[key]; fc != nil {
		return fc.waiters
	}
	return 0
}
