package sqlite_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// blobStore seeds a store file of generation gen with segs and opens it
// with both readers.
func blobStore(t *testing.T, gen int, segs ...[]byte) (*seed.Writer, *sqlite.Blobs, []string) {
	t.Helper()
	w, err := seed.Create(filepath.Join(t.TempDir(), "segments.sqlite"), gen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	var ids []string
	for _, b := range segs {
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: storetest.Pub()})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	bs, err := sqlite.OpenBlobs(w.Path(), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bs.Close() })
	return w, bs, ids
}

func TestSQLiteBlobsCopyEveryGeneration(t *testing.T) {
	segs := [][]byte{storetest.Bytes(1, 1), storetest.Bytes(200_000, 2), {}, storetest.Bytes(128<<10, 3)}
	for gen := 1; gen <= 3; gen++ {
		t.Run(fmt.Sprint("gen", gen), func(t *testing.T) {
			_, bs, ids := blobStore(t, gen, segs...)
			for i, id := range ids {
				var buf bytes.Buffer
				n, err := bs.CopyBlob(context.Background(), id, &buf)
				if err != nil || n != int64(len(segs[i])) || !bytes.Equal(buf.Bytes(), segs[i]) {
					t.Fatalf("segment %d: n %d err %v equal %v", i, n, err, bytes.Equal(buf.Bytes(), segs[i]))
				}
			}
			_, err := bs.CopyBlob(context.Background(), seed.SegmentID([]byte("absent")), io.Discard)
			if !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("missing segment: %v, want ErrNotFound", err)
			}
		})
	}
}

func TestSQLiteBlobsRejectsNonStore(t *testing.T) {
	if _, err := sqlite.OpenBlobs(filepath.Join(t.TempDir(), "missing.sqlite"), sqlite.Options{}); err == nil {
		t.Fatal("a missing file opened")
	}
	w, err := seed.Create(filepath.Join(t.TempDir(), "s.sqlite"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Exec("DROP TABLE sync_segments"); err != nil {
		t.Fatal(err)
	}
	if _, err := sqlite.OpenBlobs(w.Path(), sqlite.Options{}); err == nil {
		t.Fatal("a file without sync_segments opened")
	}
}

func TestSQLiteBlobsLengthMismatchIsCorrupt(t *testing.T) {
	w, bs, ids := blobStore(t, 2, storetest.Bytes(1000, 4))
	if err := w.Exec("UPDATE sync_segments SET byte_length = 999"); err != nil {
		t.Fatal(err)
	}
	if _, err := bs.CopyBlob(context.Background(), ids[0], io.Discard); !errors.Is(err, store.ErrCorruptSegment) {
		t.Fatalf("err %v, want ErrCorruptSegment", err)
	}
}

// hashWriter hashes what it is given, calling each after every write.
type hashWriter struct {
	h    interface{ Write([]byte) (int, error) }
	n    int64
	each func(n int64)
}

func (w *hashWriter) Write(p []byte) (int, error) {
	w.h.Write(p)
	w.n += int64(len(p))
	if w.each != nil {
		w.each(w.n)
	}
	return len(p), nil
}

// A 64 MiB blob is copied with a fixed buffer: the Go heap allocated
// during the copy is a small fraction of the blob, where the whole-blob
// read of SQLite.Open allocates more than the blob.
func TestSQLiteBlobsBoundedMemory(t *testing.T) {
	const size = 64 << 20
	data := storetest.Bytes(size, 5)
	want := sha256.Sum256(data)
	w, bs, ids := blobStore(t, 3, data)
	data = nil

	measure := func(f func()) (total, peakInuse uint64) {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, after.HeapInuse
	}

	h := sha256.New()
	var n int64
	var err error
	total, inuse := measure(func() {
		n, err = bs.CopyBlob(context.Background(), ids[0], &hashWriter{h: h})
	})
	if err != nil || n != size || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("copy: n %d err %v", n, err)
	}
	t.Logf("CopyBlob of 64 MiB: TotalAlloc delta %.2f MiB, HeapInuse after %.2f MiB",
		float64(total)/(1<<20), float64(inuse)/(1<<20))
	if total >= 16<<20 {
		t.Fatalf("CopyBlob allocated %d bytes for a 64 MiB blob, want < 16 MiB", total)
	}

	// The same bytes through SQLite.Open: it streams a large blob in
	// chunks, so it stays within the same bound.
	s, err := sqlite.Open(w.Path(), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h.Reset()
	openTotal, _ := measure(func() {
		var rc io.ReadCloser
		if rc, err = s.Open(context.Background(), idOf(ids[0]), 0, -1); err == nil {
			n, err = io.Copy(&hashWriter{h: h}, rc)
			rc.Close()
		}
	})
	if err != nil || n != size || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("SQLite.Open read: n %d err %v", n, err)
	}
	t.Logf("SQLite.Open of 64 MiB: TotalAlloc delta %.2f MiB", float64(openTotal)/(1<<20))
	if openTotal >= 16<<20 {
		t.Fatalf("SQLite.Open allocated %d bytes for a 64 MiB blob, want < 16 MiB", openTotal)
	}

	// Control: the whole-blob substr read Open used to make fails the
	// bound, so the bound tests something.
	db, err := sql.Open("sqlite", sqlite.DSNForTest(w.Path(), time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	wholeTotal, _ := measure(func() {
		var b []byte
		err = db.QueryRow(`SELECT substr(CAST(bytes AS BLOB), 1, ?2) FROM sync_segments WHERE segment_id = ?1`, ids[0], size).Scan(&b)
		n = int64(len(b))
	})
	if err != nil || n != size {
		t.Fatalf("whole-blob read: n %d err %v", n, err)
	}
	if wholeTotal < 16<<20 {
		t.Fatalf("the whole-blob read allocated only %d bytes: the bound tests nothing", wholeTotal)
	}
}

// The copy is one snapshot: the writer commits (even deleting the row
// being copied) while the copy runs, and the copy still yields the
// original bytes, without holding up the writer.
func TestSQLiteBlobsCopyWhileWriterWrites(t *testing.T) {
	data := storetest.Bytes(8<<20, 6)
	want := sha256.Sum256(data)
	w, bs, ids := blobStore(t, 3, data)

	var commits atomic.Int32
	writeErr := make(chan error, 1)
	midCopy := make(chan struct{})
	var once sync.Once
	go func() {
		<-midCopy
		// Other segments land and the one being copied is deleted.
		for i := range 5 {
			if _, err := w.Put(seed.SegmentInput{Bytes: storetest.Bytes(100_000, uint64(100+i)), Publication: storetest.Pub()}); err != nil {
				writeErr <- err
				return
			}
			commits.Add(1)
		}
		writeErr <- w.DeleteSegment(ids[0])
	}()

	h := sha256.New()
	n, err := bs.CopyBlob(context.Background(), ids[0], &hashWriter{h: h, each: func(n int64) {
		if n >= 1<<20 {
			once.Do(func() {
				close(midCopy)
				// Wait for the writer: it must not be blocked by the read.
				select {
				case err := <-writeErr:
					writeErr <- err
				case <-time.After(30 * time.Second):
					t.Error("the writer did not finish while the copy held its read transaction")
				}
			})
		}
	}})
	if err != nil || n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("copy during writes: n %d err %v", n, err)
	}
	if err := <-writeErr; err != nil {
		t.Fatalf("writer: %v", err)
	}
	if commits.Load() != 5 {
		t.Fatalf("writer committed %d puts", commits.Load())
	}
	// A new copy sees the delete.
	if _, err := bs.CopyBlob(context.Background(), ids[0], io.Discard); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete: %v, want ErrNotFound", err)
	}
}

// A cancelled copy ends its transaction: the connection comes back usable.
func TestSQLiteBlobsCancelledCopyReleasesConnection(t *testing.T) {
	data := storetest.Bytes(4<<20, 7)
	w, _, ids := blobStore(t, 2, data)
	bs, err := sqlite.OpenBlobs(w.Path(), sqlite.Options{MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()

	ctx, cancel := context.WithCancel(context.Background())
	_, err = bs.CopyBlob(ctx, ids[0], &hashWriter{h: sha256.New(), each: func(n int64) {
		if n >= 1<<20 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	var buf bytes.Buffer
	n, err := bs.CopyBlob(context.Background(), ids[0], &buf)
	if err != nil || n != int64(len(data)) || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("the next copy on the one connection: n %d err %v", n, err)
	}
}

// A writer error ends the copy and is returned as is.
func TestSQLiteBlobsWriterError(t *testing.T) {
	_, bs, ids := blobStore(t, 2, storetest.Bytes(1<<20, 8))
	boom := errors.New("disk full")
	_, err := bs.CopyBlob(context.Background(), ids[0], writerFunc(func(p []byte) (int, error) { return 0, boom }))
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
