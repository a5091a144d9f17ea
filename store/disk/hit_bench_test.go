package disk_test

import (
	"context"
	"testing"

	"github.com/syncular/caddy-syncular/store/disk"
)

// BenchmarkGetHit is the hit path of a complete file (open, the stat
// check, close), from parallel callers on one hot segment.
func BenchmarkGetHit(b *testing.B) {
	c, err := disk.New(disk.Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s := newSegment(1<<20, 99)
	h, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), bytesSource(s.b, nil))
	if err != nil {
		b.Fatal(err)
	}
	r, _ := h.Reader(context.Background(), 0, -1)
	for buf := make([]byte, 64<<10); ; {
		if _, err := r.Read(buf); err != nil {
			break
		}
	}
	h.Close()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), nil)
			if err != nil || !h.Hit() {
				b.Error("not a hit", err)
				return
			}
			h.Close()
		}
	})
}
