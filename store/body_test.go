package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncular/caddy-syncular/compress"
)

// A Body says what it holds: bytes in memory (one Write for the
// writer), a range of a complete file, or a stream verified so that bytes
// not matching their id end in ErrCorruptSegment before their last byte.
// Every kind reads the same bytes.
func TestBodyKinds(t *testing.T) {
	ctx := context.Background()
	data := seg(10<<10, 7)
	c, id := cachedWith(t, DefaultCacheOptions(), data)
	b, err := c.OpenBody(ctx, idOf(id), Want{N: int64(len(data)), Size: int64(len(data))})
	if err != nil {
		t.Fatal(err)
	}
	if b.Kind() != BodyMemory || !bytes.Equal(b.Bytes(), data) || b.Size() != int64(len(data)) {
		t.Fatalf("memory body: kind %d, %d bytes, size %d", b.Kind(), len(b.Bytes()), b.Size())
	}
	if b.Tier() != TierMemory || b.Coding() != compress.Identity || b.Streamed() {
		t.Fatalf("memory body: tier %d coding %v streamed %v", b.Tier(), b.Coding(), b.Streamed())
	}
	if got, err := io.ReadAll(b); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("memory body read: %d bytes, %v", len(got), err)
	}
	b.Close()

	// A range of a complete file: the file, where the range starts, its
	// length; read, the range's bytes.
	path := filepath.Join(t.TempDir(), "seg")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fb := &Body{kind: BodyFile, size: 1000, file: f, off: 100, tier: TierDisk}
	if gf, off := fb.File(); gf != f || off != 100 || fb.Kind() != BodyFile {
		t.Fatalf("file body: %p at %d, want %p at 100", gf, off, f)
	}
	if got, err := io.ReadAll(fb); err != nil || !bytes.Equal(got, data[100:1100]) {
		t.Fatalf("file body read: %d bytes, %v", len(got), err)
	}

	// Streamed without the cache: verified, the last byte held back.
	inner := newCountingStore()
	bad := bytes.Clone(data)
	bad[len(bad)-1] ^= 1
	badID := inner.add(bad, segID(data))
	sbody, err := NewCached(inner, CacheOptions{}).OpenBody(ctx, idOf(badID), Want{N: int64(len(bad)), Size: int64(len(bad))})
	if err != nil {
		t.Fatal(err)
	}
	defer sbody.Close()
	var out bytes.Buffer
	n, err := io.Copy(&out, sbody)
	if !errors.Is(err, ErrCorruptSegment) || n >= int64(len(bad)) || !sbody.Streamed() || sbody.Kind() != BodyStream {
		t.Fatalf("corrupt stream: %d of %d bytes, %v", n, len(bad), err)
	}
}
