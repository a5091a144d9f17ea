package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/disk"
)

// streamStore is a countingStore whose bodies are plain streams (not the
// cache's verified memory bodies), like a real store's.
type streamStore struct{ *countingStore }

func (s streamStore) Open(ctx context.Context, pid segid.ID, off, n int64) (io.ReadCloser, error) {
	id := pid.String()
	rc, err := s.countingStore.Open(ctx, idOf(id), off, n)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(rc), nil
}

// copyStore also offers CopyBlob (as SQLite does: verified as it copies,
// blobCopier) and counts its calls.
type copyStore struct {
	streamStore
	mu     sync.Mutex
	copies int
}

func (s *copyStore) CopyBlob(ctx context.Context, pid segid.ID, w io.Writer) (int64, error) {
	id := pid.String()
	s.mu.Lock()
	s.copies++
	s.mu.Unlock()
	rc, err := s.countingStore.Open(ctx, idOf(id), 0, -1)
	if err != nil {
		return 0, err
	}
	var h segid.Hasher
	n, err := io.Copy(io.MultiWriter(w, &h), rc)
	if want, perr := segid.Parse(id); err == nil && (perr != nil || !h.Matches(want)) {
		err = fmt.Errorf("copy: %s: %w", id, ErrCorruptSegment)
	}
	return n, err
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func tierCache(t *testing.T, inner Store, dir string) (*Cached, *disk.Cache) {
	t.Helper()
	var d *disk.Cache
	if dir != "" {
		var err error
		d, err = disk.New(disk.Options{Dir: dir, MaxBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
	}
	opts := DefaultCacheOptions()
	opts.MaxBytes, opts.MaxEntry = 1<<20, 1<<20
	opts.Disk = d
	return NewCached(inner, opts), d
}

// A segment above MaxEntry is filled into the disk tier once however many
// callers ask, then every read (whole or ranged) comes from the file.
func TestTierFillsOnceAndServesFromDisk(t *testing.T) {
	for _, tc := range []struct {
		name  string
		inner func(*countingStore) (Store, func() int)
	}{
		{"open", func(cs *countingStore) (Store, func() int) {
			return streamStore{cs}, func() int { _, o := cs.counts(); return o }
		}},
		{"copyblob", func(cs *countingStore) (Store, func() int) {
			s := &copyStore{streamStore: streamStore{cs}}
			return s, func() int { s.mu.Lock(); defer s.mu.Unlock(); return s.copies }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := newCountingStore()
			b := randomBytes(3<<20, 1)
			id := cs.add(b)
			inner, reads := tc.inner(cs)
			c, d := tierCache(t, inner, t.TempDir())
			ctx := context.Background()
			if _, err := c.Lookup(ctx, idOf(id)); err != nil {
				t.Fatal(err)
			}
			gate := make(chan struct{})
			cs.setGate(gate)
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rc, err := c.Open(ctx, idOf(id), 0, -1)
					if err != nil {
						errs <- err
						return
					}
					defer rc.Close()
					got, err := io.ReadAll(rc)
					if err == nil && !bytes.Equal(got, b) {
						err = errors.New("wrong bytes")
					}
					if err != nil {
						errs <- err
					}
				}()
			}
			close(gate)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n := reads(); n != 1 {
				t.Fatalf("store read %d times for 20 callers, want 1", n)
			}
			if got := openAll(t, c, ctx, id, 1000, 5000); !bytes.Equal(got, b[1000:6000]) {
				t.Fatal("range from the disk tier: wrong bytes")
			}
			if n := reads(); n != 1 {
				t.Fatalf("store read %d times after a hit, want 1", n)
			}
			st, ds := c.Stats(), d.Stats()
			if st.DiskReads != 21 || st.PassThrough != 0 || ds.Fills != 1 || ds.Files != 1 {
				t.Fatalf("stats %+v, disk %+v", st, ds)
			}
			// A complete file keeps the sendfile shape for the handler.
			body, err := c.OpenBody(ctx, idOf(id), Want{N: int64(len(b)), Size: int64(len(b))})
			if err != nil {
				t.Fatal(err)
			}
			defer body.Close()
			if f, off := body.File(); body.Kind() != BodyFile || body.Size() != int64(len(b)) || f == nil || off != 0 || body.Tier() != TierDisk || body.Streamed() {
				t.Fatalf("disk body: kind %d, tier %d, want a complete file (the sendfile shape)", body.Kind(), body.Tier())
			}
		})
	}
}

// readToEnd reads rc until an error, returning what it read.
func readToEnd(rc io.Reader) ([]byte, error) {
	var out bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		n, err := rc.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			return out.Bytes(), err
		}
	}
}

// Bytes that do not hash to their id never end cleanly and never reach
// their full length, through the disk tier or streamed past it.
func TestTierCorruptSegmentNeverCompletes(t *testing.T) {
	good := randomBytes(3<<20, 2)
	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 1
	for _, tc := range []struct {
		name string
		data []byte
		dir  func(t *testing.T) string
	}{
		{"disk tier", bad, func(t *testing.T) string { return t.TempDir() }},
		{"no disk tier", bad, func(*testing.T) string { return "" }},
		{"unusable disk tier", bad, unusableDir},
		{"short, no disk tier", good[:len(good)-1], func(*testing.T) string { return "" }},
		{"long, unusable disk tier", append(bytes.Clone(good), 0), unusableDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := newCountingStore()
			id := segID(good)
			cs.add(tc.data, id)
			cs.recs[id].ByteLength = int64(len(good))
			c, _ := tierCache(t, streamStore{cs}, tc.dir(t))
			ctx := context.Background()
			if _, err := c.Lookup(ctx, idOf(id)); err != nil {
				t.Fatal(err)
			}
			rc, err := c.Open(ctx, idOf(id), 0, -1)
			if err != nil {
				if !errors.Is(err, ErrCorruptSegment) {
					t.Fatalf("open: %v, want ErrCorruptSegment", err)
				}
				return
			}
			defer rc.Close()
			got, err := readToEnd(rc)
			if !errors.Is(err, ErrCorruptSegment) {
				t.Fatalf("read ended with %v after %d bytes, want ErrCorruptSegment", err, len(got))
			}
			if len(got) >= len(good) {
				t.Fatalf("read %d bytes of a %d-byte body before the error", len(got), len(good))
			}
		})
	}
}

// unusableDir is a disk tier directory that cannot be created (under a
// regular file).
func unusableDir(t *testing.T) string {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(f, "segments")
}

// An unusable disk tier is bypassed: the segment streams from the store,
// whole bodies verified, and every caller is answered.
func TestTierUnusableDirectoryStreams(t *testing.T) {
	cs := newCountingStore()
	b := randomBytes(3<<20, 3)
	id := cs.add(b)
	c, d := tierCache(t, streamStore{cs}, unusableDir(t))
	ctx := context.Background()
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatal(err)
	}
	if got := openAll(t, c, ctx, id, 0, -1); !bytes.Equal(got, b) {
		t.Fatal("whole body: wrong bytes")
	}
	if got := openAll(t, c, ctx, id, 10, 100); !bytes.Equal(got, b[10:110]) {
		t.Fatal("range: wrong bytes")
	}
	st, ds := c.Stats(), d.Stats()
	if st.PassThrough != 2 || st.DiskReads != 0 || ds.BypassUnavailable != 2 {
		t.Fatalf("stats %+v, disk %+v", st, ds)
	}
}

// A whole streamed body is verified, and passes a right body through to
// a clean end.
func TestVerifyWholeRightBody(t *testing.T) {
	b := randomBytes(100_000, 4)
	want := Want{N: int64(len(b)), Size: int64(len(b))}
	body := streamBody(io.NopCloser(bytes.NewReader(b)), TierStore)
	identity(body, idOf(segID(b)), want)
	got, err := io.ReadAll(body)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read %d bytes: %v", len(got), err)
	}
	// A body already verified is not wrapped twice.
	v := newVerifyReader(io.NopCloser(bytes.NewReader(b)), idOf(segID(b)), int64(len(b)), nil)
	vb := streamBody(v, TierStore)
	vb.verified = true
	if identity(vb, idOf(segID(b)), want); vb.r != io.Reader(v) {
		t.Fatal("a verified body was wrapped again")
	}
}
