package sqlite_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// A blob larger than one chunk streams through SQLite.Open, whole and by
// any range (chunk boundaries included), in every schema generation.
func TestSQLiteOpenStreamsLargeBlob(t *testing.T) {
	data := storetest.Bytes(3<<20+12345, 9)
	for gen := 1; gen <= 3; gen++ {
		w, _, ids := blobStore(t, gen, data)
		s, err := sqlite.Open(w.Path(), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for _, r := range []struct{ off, n int64 }{
			{0, -1}, {0, int64(len(data))}, {1 << 20, -1}, {1<<20 - 10, 20}, {(1 << 20) - 1, 2<<20 + 7},
			{int64(len(data)) - 1, -1}, {int64(len(data)), -1}, {int64(len(data)) + 5, 10}, {17, 1 << 20},
		} {
			rc, err := s.Open(context.Background(), idOf(ids[0]), r.off, r.n)
			if err != nil {
				t.Fatalf("gen %d open %+v: %v", gen, r, err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			off := min(r.off, int64(len(data)))
			end := int64(len(data))
			if r.n >= 0 && off+r.n < end {
				end = off + r.n
			}
			if err != nil || !bytes.Equal(got, data[off:end]) {
				t.Fatalf("gen %d range %+v: %d bytes (want %d), %v", gen, r, len(got), end-off, err)
			}
		}
		if _, err := s.Open(context.Background(), idOf("sha256:"+string(bytes.Repeat([]byte("0"), 64))), 0, -1); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("gen %d unknown id: %v", gen, err)
		}
	}
}

// A row deleted or rewritten between two chunks ends the stream with an
// error, never with a clean end or other bytes.
func TestSQLiteOpenStreamRowChanges(t *testing.T) {
	data := storetest.Bytes(3<<20, 10)
	for _, tc := range []struct {
		name, sql string
		corrupt   bool
	}{
		{"deleted", "DELETE FROM sync_segments", false},
		{"shortened", "UPDATE sync_segments SET bytes = zeroblob(1000)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _, ids := blobStore(t, 3, data)
			s, err := sqlite.Open(w.Path(), sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rc, err := s.Open(context.Background(), idOf(ids[0]), 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			first := make([]byte, 1<<20)
			if _, err := io.ReadFull(rc, first); err != nil || !bytes.Equal(first, data[:1<<20]) {
				t.Fatalf("first chunk: %v", err)
			}
			if tc.sql == "DELETE FROM sync_segments" {
				// gen 3 keeps publications in their own table
				_ = w.Exec("DELETE FROM sync_segment_publications")
			}
			if err := w.Exec(tc.sql); err != nil {
				t.Fatal(err)
			}
			rest, err := io.ReadAll(rc)
			if err == nil {
				t.Fatalf("stream ended cleanly after the row changed (%d more bytes)", len(rest))
			}
			if tc.corrupt && !errors.Is(err, store.ErrCorruptSegment) {
				t.Fatalf("err %v, want ErrCorruptSegment", err)
			}
		})
	}
}
