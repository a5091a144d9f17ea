package disk_test

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"testing"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/disk"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// The wiring the handler will use: a SQLite store file (written the way
// the reference writes it) fills the disk tier through sqlite.Blobs, and
// concurrent readers get the bytes while the store is read once.
func TestFillFromSQLiteBlobs(t *testing.T) {
	s := newSegment(3<<20, 80)
	w, err := seed.Create(filepath.Join(t.TempDir(), "segments.sqlite"), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	id, err := w.Put(seed.SegmentInput{Bytes: s.b, Publication: store.Publication{
		Partition: "p", LogEpoch: "e", Table: "t", SchemaVersion: 1, ScopeDigest: "d",
		AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: 1, ExpiresAtMs: 1 << 50}})
	if err != nil || id != s.id {
		t.Fatalf("put: %v (id %s)", err, id)
	}
	blobs, err := sqlite.OpenBlobs(w.Path(), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer blobs.Close()

	var mu sync.Mutex
	copies := 0
	src := func(ctx context.Context, dst io.Writer) error {
		mu.Lock()
		copies++
		mu.Unlock()
		_, err := blobs.CopyBlob(ctx, s.id, dst)
		return err
	}
	c := newCache(t, disk.Options{})
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := c.Get(context.Background(), idOf(s.id), int64(len(s.b)), src)
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			r, _ := h.Reader(context.Background(), 0, -1)
			got, err := io.ReadAll(r)
			if err != nil || string(got) != string(s.b) {
				t.Errorf("read %d bytes: %v", len(got), err)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if copies != 1 {
		t.Fatalf("the store was read %d times, want 1", copies)
	}
}
