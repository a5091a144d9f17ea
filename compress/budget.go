package compress

import (
	"context"
	"fmt"
	"io"
	"runtime"
)

// Builds is the one budget of variant encodes from complete identity
// bytes in the process: every bytes cache and every disk tier, of every
// handler and config, takes a slot for each build and gives it back when
// the build ends, so encoding leaves CPU to the request path however many
// handlers there are. Half the CPUs, at least one.
var Builds = NewBudget(max(1, runtime.GOMAXPROCS(0)/2))

// Budget bounds work running at once. The zero value is not usable;
// NewBudget makes one.
type Budget struct {
	slots chan struct{}
}

// NewBudget is a budget of n slots (at least one).
func NewBudget(n int) *Budget { return &Budget{slots: make(chan struct{}, max(1, n))} }

// TryAcquire takes a slot without waiting; false when every slot is
// taken (a later request retries the build).
func (b *Budget) TryAcquire() bool {
	select {
	case b.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// Release gives a slot back.
func (b *Budget) Release() { <-b.slots }

// InUse is the number of slots taken now.
func (b *Budget) InUse() int { return len(b.slots) }

// ContextReader reads r until ctx ends, in reads of at most 256 KiB so
// an encode or a verification notices a timeout or a close within one
// of them: the source an encoder reads a build from.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return &ctxReader{ctx: ctx, r: r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

// ctxReadMax is the largest read a ctxReader passes on.
const ctxReadMax = 256 << 10

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, fmt.Errorf("compress: build stopped: %w", err)
	}
	if len(p) > ctxReadMax {
		p = p[:ctxReadMax]
	}
	return r.r.Read(p)
}
