package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/syncular/caddy-syncular/segid"
)

// smallTmpfs mounts a tmpfs of size (mount's size= syntax) on a new
// directory for the test and unmounts it at its end. It needs root (and
// CAP_SYS_ADMIN): otherwise the test is skipped, saying why.
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full filesystem needs a tmpfs mounted by the test, which needs root: skipped (the disk package's tests inject ENOSPC instead)")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0750"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s (%v): no CAP_SYS_ADMIN here; skipped", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	return dir
}

// chunkStore streams its segment in small reads and holds the first
// stream after its first chunk until release closes, so that callers can
// join the fill before it meets the full disk.
type chunkStore struct {
	*countingStore
	release chan struct{}
	once    sync.Once
}

func (s *chunkStore) Open(ctx context.Context, pid segid.ID, off, n int64) (io.ReadCloser, error) {
	id := pid.String()
	rc, err := s.countingStore.Open(ctx, idOf(id), off, n)
	if err != nil {
		return nil, err
	}
	var hold chan struct{}
	s.once.Do(func() { hold = s.release })
	return &chunkReader{rc: rc, hold: hold}, nil
}

type chunkReader struct {
	rc   io.ReadCloser
	hold chan struct{}
	n    int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.n > 0 && r.hold != nil {
		<-r.hold
		r.hold = nil
	}
	if len(p) > 64<<10 {
		p = p[:64<<10]
	}
	m, err := r.rc.Read(p)
	r.n += m
	return m, err
}

func (r *chunkReader) Close() error { return r.rc.Close() }

// A fill that meets a really full filesystem (a 1 MiB tmpfs, a 3 MiB
// segment) hands every reader that followed it over to the store: all
// get the whole segment, verified, and a clean end.
func TestTierFullDiskHandsReadersToStore(t *testing.T) {
	dir := smallTmpfs(t, "1m")
	cs := newCountingStore()
	b := randomBytes(3<<20, 5)
	id := cs.add(b)
	inner := &chunkStore{countingStore: cs, release: make(chan struct{})}
	c, d := tierCache(t, inner, dir)
	ctx := context.Background()
	if _, err := c.Lookup(ctx, idOf(id)); err != nil {
		t.Fatal(err)
	}
	const readers = 12
	var bodies []io.ReadCloser
	for range readers { // each Open returns once the fill's first byte is on disk
		rc, err := c.Open(ctx, idOf(id), 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, rc)
	}
	close(inner.release)
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for _, rc := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ds := d.Stats()
	if ds.FillErrors != 1 || ds.Handoffs != readers || ds.Files != 0 {
		t.Fatalf("disk %+v", ds)
	}
	// The directory is bypassed meanwhile: the next read streams.
	if got := openAll(t, c, ctx, id, 0, -1); !bytes.Equal(got, b) {
		t.Fatal("after the full disk: wrong bytes")
	}
	if st := c.Stats(); st.PassThrough != 1 {
		t.Fatalf("stats %+v", st)
	}
}
