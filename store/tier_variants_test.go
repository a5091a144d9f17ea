package store

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/syncular/caddy-syncular/compress"
)

// A segment above MaxEntry gets its variants from the disk tier: built
// once from the identity file however many callers ask, read from a file
// (the sendfile shape), and counted in Stats.Variants.
func TestTierVariantsFromDisk(t *testing.T) {
	cs := newCountingStore()
	b := rowsLike(3<<20, 11)
	id := cs.add(b)
	rnd := noise(2<<20, 12)
	rid := cs.add(rnd)
	c, _ := tierCache(t, streamStore{cs}, t.TempDir())
	ctx := context.Background()
	if _, _, st := c.variant(idOf(id), compress.Gzip); st != variantUnavailable {
		t.Fatalf("before the record is known: state %d, want unavailable", st)
	}
	for _, sid := range []string{id, rid} {
		if _, err := c.Lookup(ctx, idOf(sid)); err != nil {
			t.Fatal(err)
		}
		if _, _, st := c.variant(idOf(sid), compress.Gzip); st != variantUnavailable {
			t.Fatalf("before the identity file exists: state %d, want unavailable", st)
		}
		rc, err := c.Open(ctx, idOf(sid), 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, rc, nil)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rc, _, _ := c.variant(idOf(id), compress.Zstd); rc != nil {
				rc.Close()
			}
		}()
	}
	wg.Wait()
	got, st := awaitVariant(t, c, id, compress.Zstd)
	if st != variantReady || !bytes.Equal(decode(t, compress.Zstd, got), b) {
		t.Fatalf("zstd: state %d, decodes %v", st, st == variantReady && bytes.Equal(decode(t, compress.Zstd, got), b))
	}
	rc, size, st := c.variant(idOf(id), compress.Zstd)
	if st != variantReady || size != int64(len(got)) {
		t.Fatalf("hit: state %d size %d, want ready %d", st, size, len(got))
	}
	if vb := rc; vb.Kind() != BodyFile || vb.Size() != size || vb.Tier() != TierDisk {
		t.Fatalf("a disk variant body: kind %d, tier %d, want the sendfile shape of %d bytes", vb.Kind(), vb.Tier(), size)
	}
	rc.Close()
	if _, st := awaitVariant(t, c, rid, compress.Gzip); st != variantNotWorth {
		t.Fatalf("noise: state %d, want not worth", st)
	}
	vs := c.Stats().Variants
	if vs.Made != 1 || vs.Incompressible != 1 || vs.Rejected != 0 {
		t.Fatalf("variant stats %+v, want made 1, incompressible 1", vs)
	}
}
