package store

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store/disk"
)

// rowsLike is n bytes of JSON-ish rows: compressible like a real segment
// but not trivially (random ids and numbers).
func rowsLike(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, `{"id":"%016x","user":%d,"title":"task %d","done":%t}`+"\n", r.Uint64(), r.IntN(500), i, r.IntN(2) == 0)
	}
	return b.Bytes()[:n]
}

func noise(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func decode(t *testing.T, c compress.Coding, b []byte) []byte {
	t.Helper()
	var r io.Reader
	switch c {
	case compress.Gzip:
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case compress.Zstd:
		zr, err := zstd.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	default:
		t.Fatalf("decode %v", c)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("decode %v: %v", c, err)
	}
	return out
}

// cachedWith returns a cache holding data's identity bytes (looked up and
// filled), and its id.
func cachedWith(t *testing.T, opts CacheOptions, data []byte) (*Cached, string) {
	t.Helper()
	inner := newCountingStore()
	id := inner.add(data)
	c := NewCached(inner, opts)
	ctx := context.Background()
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatal(err)
	}
	openAll(t, c, ctx, id, 0, -1)
	return c, id
}

// awaitVariant calls Variant until it is no longer building, and returns
// the last answer.
func awaitVariant(t *testing.T, c *Cached, id string, coding compress.Coding) ([]byte, disk.VariantState) {
	t.Helper()
	var got []byte
	var st disk.VariantState
	waitFor(t, "variant "+coding.String(), func() bool {
		var rc io.ReadCloser
		rc, _, st = c.variant(idOf(id), coding)
		if st == variantReady {
			got = readAll(t, rc, nil)
		}
		return st != variantBuilding
	})
	return got, st
}

func TestVariantBuiltOnceUnderConcurrency(t *testing.T) {
	data := rowsLike(256<<10, 1)
	for _, coding := range []compress.Coding{compress.Gzip, compress.Zstd} {
		t.Run(coding.String(), func(t *testing.T) {
			c, id := cachedWith(t, DefaultCacheOptions(), data)
			var wg sync.WaitGroup
			results := make([][]byte, 100)
			for i := range results {
				wg.Go(func() {
					for range 5_000 {
						rc, n, st := c.variant(idOf(id), coding)
						if st == variantReady {
							b, err := io.ReadAll(rc)
							if err != nil || int64(len(b)) != n {
								t.Errorf("read %d of %d bytes: %v", len(b), n, err)
							}
							results[i] = b
							return
						}
						// Unavailable: every build slot of the process is
						// busy (other tests' builds); a later call retries.
						if st != variantBuilding && st != variantUnavailable {
							t.Errorf("state %d, want building, unavailable or ready", st)
							return
						}
						time.Sleep(time.Millisecond)
					}
				})
			}
			wg.Wait()
			for i, b := range results {
				if b == nil {
					t.Fatalf("caller %d never got the variant", i)
				}
				if !bytes.Equal(decode(t, coding, b), data) {
					t.Fatalf("caller %d: variant does not decode to the segment", i)
				}
			}
			st := c.Stats().Variants
			if st.Made != 1 || st.Rejected != 0 || st.Incompressible != 0 {
				t.Fatalf("stats %+v, want exactly one variant made", st)
			}
			if !compress.Worthwhile(int64(len(data)), int64(len(results[0]))) {
				t.Fatalf("kept a %d-byte variant of %d bytes", len(results[0]), len(data))
			}
			// Identity is still the identity bytes under the bare id.
			if got := openAll(t, c, context.Background(), id, 0, -1); !bytes.Equal(got, data) {
				t.Fatal("identity bytes changed")
			}
			// Budget: identity + the variant.
			if used, want := c.Stats().Bytes, int64(len(data)+len(results[0])); used != want {
				t.Fatalf("cache holds %d bytes, want %d (identity + variant)", used, want)
			}
		})
	}
}

func TestVariantIncompressibleRemembered(t *testing.T) {
	c, id := cachedWith(t, DefaultCacheOptions(), noise(64<<10, 3))
	if _, st := awaitVariant(t, c, id, compress.Gzip); st != variantNotWorth {
		t.Fatalf("state %d, want variantNotWorth", st)
	}
	for range 5 {
		if _, _, st := c.variant(idOf(id), compress.Gzip); st != variantNotWorth {
			t.Fatalf("state %d on a repeat, want variantNotWorth", st)
		}
	}
	st := c.Stats().Variants
	if st.Incompressible != 1 || st.Made != 0 {
		t.Fatalf("stats %+v, want one incompressible build and none made", st)
	}
	if used := c.Stats().Bytes; used != 64<<10 {
		t.Fatalf("cache holds %d bytes after a discarded build, want the identity's %d", used, 64<<10)
	}
}

func TestVariantCorruptNeverKept(t *testing.T) {
	for _, coding := range []compress.Coding{compress.Gzip, compress.Zstd} {
		t.Run(coding.String(), func(t *testing.T) {
			data := rowsLike(128<<10, 4)
			inner := newCountingStore()
			id := inner.add(data)
			c := NewCached(inner, DefaultCacheOptions())
			faults := 0
			SetVariantFaultForTest(c, func(got compress.Coding, b []byte) {
				if got != coding {
					t.Errorf("fault hook saw %v", got)
				}
				faults++
				b[len(b)/2] ^= 0x40 // a flipped bit in the middle
			})
			ctx := context.Background()
			if _, err := c.Lookup(ctx, idOf(id)); err != nil {
				t.Fatal(err)
			}
			openAll(t, c, ctx, id, 0, -1)
			if _, st := awaitVariant(t, c, id, coding); st != variantNotWorth {
				t.Fatalf("state %d, want variantNotWorth (rejected)", st)
			}
			for range 5 {
				if rc, _, st := c.variant(idOf(id), coding); st == variantReady || rc != nil {
					t.Fatal("a corrupted variant was served")
				}
			}
			st := c.Stats().Variants
			if st.Rejected != 1 || st.Made != 0 || faults != 1 {
				t.Fatalf("stats %+v, faults %d: want one rejected build", st, faults)
			}
			if _, ok := c.blobs.peek(variantKey(idOf(id), coding)); ok {
				t.Fatal("the corrupted variant is in the bytes cache")
			}
		})
	}
}

func TestVariantNeedsIdentityInMemory(t *testing.T) {
	data := rowsLike(64<<10, 5)
	inner := newCountingStore()
	id := inner.add(data)
	opts := DefaultCacheOptions()
	opts.MaxEntry = 32 << 10 // the segment is too large for memory
	c := NewCached(inner, opts)
	ctx := context.Background()
	if _, _, st := c.variant(idOf(id), compress.Gzip); st != variantUnavailable {
		t.Fatalf("before any read: state %d, want unavailable", st)
	}
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatal(err)
	}
	openAll(t, c, ctx, id, 0, -1) // streamed, not cached
	if _, _, st := c.variant(idOf(id), compress.Gzip); st != variantUnavailable {
		t.Fatalf("larger than max_entry: state %d, want unavailable", st)
	}
	if _, _, st := c.variant(idOf(id), compress.Identity); st != variantUnavailable {
		t.Fatalf("identity: state %d, want unavailable", st)
	}
	if got := c.Stats().Variants; got != (VariantStats{}) {
		t.Fatalf("stats %+v, want no builds", got)
	}

	off := NewCached(inner, CacheOptions{})
	if _, _, st := off.variant(idOf(id), compress.Zstd); st != variantUnavailable {
		t.Fatalf("cache off: state %d, want unavailable", st)
	}
}

func TestVariantWithinBudget(t *testing.T) {
	// Room for the identity and little else: the build's reservation
	// evicts, and the budget is never exceeded.
	data := rowsLike(40<<10, 6)
	opts := DefaultCacheOptions()
	opts.MaxBytes = 100 << 10
	opts.MaxEntry = 50 << 10
	c, id := cachedWith(t, opts, data)
	other := rowsLike(40<<10, 7)
	oid := c.inner.(*countingStore).add(other)
	ctx := context.Background()
	if _, err := c.Lookup(ctx, idOf(oid)); err != nil {
		t.Fatal(err)
	}
	openAll(t, c, ctx, oid, 0, -1)
	for _, k := range []struct {
		id     string
		coding compress.Coding
		data   []byte
	}{{id, compress.Gzip, data}, {oid, compress.Zstd, other}, {id, compress.Zstd, data}} {
		b, st := awaitVariant(t, c, k.id, k.coding)
		if used := c.Stats().Bytes; used > opts.MaxBytes {
			t.Fatalf("cache holds %d bytes, budget %d", used, opts.MaxBytes)
		}
		if st == variantReady && !bytes.Equal(decode(t, k.coding, b), k.data) {
			t.Fatal("variant does not decode to its segment")
		}
	}
	if ev := c.Stats().ByteEvictions; ev == 0 {
		t.Fatal("three variants and two identities fit a budget they should overflow")
	}
}

// A request may wait for a small segment's build under way, within
// WaitBound: the wait ends with the build, and Variant then has it.
// Without a build under way, or for a coding not built, it returns at
// once.
func TestWaitVariantForBuildUnderWay(t *testing.T) {
	data := rowsLike(2<<20, 31)
	c, id := cachedWith(t, DefaultCacheOptions(), data)
	ctx := context.Background()
	if c.waitVariant(ctx, idOf(id), compress.Gzip) {
		t.Fatal("waited with no build under way")
	}
	// Hold the build between encoding and verification until released.
	release := make(chan struct{})
	SetVariantFaultForTest(c, func(compress.Coding, []byte) { <-release })
	if _, _, st := c.variant(idOf(id), compress.Gzip); st != variantBuilding {
		t.Fatalf("state %d, want building", st)
	}
	// Held: the wait gives up at its bound (2 MiB: about 168 ms).
	t0 := time.Now()
	if c.waitVariant(ctx, idOf(id), compress.Gzip) {
		t.Fatal("the wait ended although the build is held")
	}
	if took := time.Since(t0); took < WaitBound(int64(len(data)))/2 {
		t.Fatalf("gave up after %v, bound %v", took, WaitBound(int64(len(data))))
	}
	// A caller's context ends its wait too.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if c.waitVariant(cctx, idOf(id), compress.Gzip) {
		t.Fatal("waited past its context")
	}
	// Released, the build ends well within a long bound (the race
	// detector slows the verification past the real one).
	c.vt.waitBound = func(int64) time.Duration { return time.Minute }
	done := make(chan bool, 1)
	go func() { done <- c.waitVariant(ctx, idOf(id), compress.Gzip) }()
	time.Sleep(10 * time.Millisecond)
	close(release)
	if !<-done {
		t.Fatal("the wait did not end with the build")
	}
	body, _, st := c.variant(idOf(id), compress.Gzip)
	if st != variantReady {
		t.Fatalf("after the wait: state %d, want ready", st)
	}
	b, _ := io.ReadAll(body)
	body.Close()
	if !bytes.Equal(decode(t, compress.Gzip, b), data) {
		t.Fatal("the variant does not decode to the segment")
	}
	if c.waitVariant(ctx, idOf(id), compress.Zstd) {
		t.Fatal("waited for a coding with no build")
	}
}

func TestWaitBound(t *testing.T) {
	// 10 Mbit/s; a tenth of the bytes.
	if got, want := WaitBound(8<<20), 671*time.Millisecond; got < want-time.Millisecond || got > want+time.Millisecond {
		t.Fatalf("WaitBound(8 MiB) = %v, want about %v", got, want)
	}
	if got := WaitBound(256 << 10); got < 20*time.Millisecond || got > 22*time.Millisecond {
		t.Fatalf("WaitBound(256 KiB) = %v, want about 21 ms", got)
	}
	if got := WaitBound(WaitMinSize - 1); got != 0 {
		t.Fatalf("WaitBound under the minimum = %v, want 0", got)
	}
}
