package sqlite_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// busyFreeWriter opens the file as the reference sync server does: one
// connection, no busy timeout, so a commit beside a reader's lock fails
// at once with "database is locked".
func busyFreeWriter(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS ticks (n INTEGER)"); err != nil {
		t.Fatal(err)
	}
	return db
}

// commit runs one small write transaction; its error, if any.
func commit(db *sql.DB) error {
	_, err := db.Exec("INSERT INTO ticks (n) VALUES (1)")
	return err
}

// A fill (disk tier: CopyBlob; memory tier: FillInto) holds no read
// lock while it hands bytes to its writer: a writer without a busy
// handler commits between every write. The old fill (one read transaction
// across the copy) failed every such commit with "database is locked".
func TestSQLiteFillHoldsNoLockAcrossWrites(t *testing.T) {
	big := storetest.Bytes(5<<20, 11)
	for _, mode := range []string{"delete", "wal"} {
		t.Run(mode, func(t *testing.T) {
			w, s, ids, seen := storetest.JournalStore(t, mode, big)
			if want := map[string]string{"delete": "delete", "wal": sqlite.JournalWAL}[mode]; s.JournalMode() != want ||
				len(seen) != 1 || seen[0] != want {
				t.Fatalf("journal mode %q (told %v), want %q once", s.JournalMode(), seen, want)
			}
			db := busyFreeWriter(t, w.Path())
			commits, failed := 0, 0
			h := sha256.New()
			n, err := s.CopyBlob(context.Background(), idOf(ids[0]), writerFunc(func(p []byte) (int, error) {
				h.Write(p)
				commits++
				if err := commit(db); err != nil {
					if !strings.Contains(err.Error(), "locked") {
						t.Errorf("commit: %v", err)
					}
					failed++
				}
				return len(p), nil
			}))
			if err != nil || n != int64(len(big)) || !bytes.Equal(h.Sum(nil), sha256Of(big)) {
				t.Fatalf("CopyBlob: n %d err %v, or bytes differ", n, err)
			}
			if failed != 0 || commits == 0 {
				t.Fatalf("%d of %d commits during the copy failed, want 0", failed, commits)
			}
			buf := make([]byte, len(big))
			if err := s.FillInto(context.Background(), idOf(ids[0]), buf); err != nil || !bytes.Equal(buf, big) {
				t.Fatalf("FillInto: %v", err)
			}
			st := s.LockFreeStats()
			if mode == "delete" && (st.Reads != 2 || st.Torn != 0) {
				t.Fatalf("rollback file: %+v, want both fills lock-free", st)
			}
			if mode == "wal" && st.Reads != 0 {
				t.Fatalf("WAL file: %+v, want no lock-free read", st)
			}
		})
	}
}

func sha256Of(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// A lock-free read whose rows change under it (the segment deleted, its
// pages reused by another segment, the segment written again) never
// hands over a complete wrong body: it ends in a transient fault, not a
// corruption verdict, and the next fill reads the bytes right.
func TestSQLiteLockFreeTornReadIsTransient(t *testing.T) {
	a, b := storetest.Bytes(3<<20, 21), storetest.Bytes(3<<20, 22)
	w, s, ids, _ := storetest.JournalStore(t, "delete", a)
	var got int64
	changed := false
	n, err := s.CopyBlob(context.Background(), idOf(ids[0]), writerFunc(func(p []byte) (int, error) {
		got += int64(len(p))
		if !changed {
			changed = true
			if err := w.DeleteSegment(ids[0]); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Put(seed.SegmentInput{Bytes: b, Publication: storetest.Pub()}); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Put(seed.SegmentInput{Bytes: a, Publication: storetest.Pub()}); err != nil {
				t.Fatal(err)
			}
		}
		return len(p), nil
	}))
	if err == nil {
		// The pages were not reused after all: then the bytes must be right.
		t.Logf("the copy verified (%d bytes): pages not reused", n)
	} else if errors.Is(err, store.ErrCorruptSegment) || n >= int64(len(a)) {
		t.Fatalf("torn read: n %d err %v, want a transient fault before the last byte", n, err)
	}
	if st := s.LockFreeStats(); err != nil && st.Torn != 1 {
		t.Fatalf("stats %+v, want one torn read", st)
	}
	buf := make([]byte, len(a))
	if err := s.FillInto(context.Background(), idOf(ids[0]), buf); err != nil || !bytes.Equal(buf, a) {
		t.Fatalf("refill: %v", err)
	}
}

// Bytes that do not hash to their id are refused as corrupt, after a
// locked re-read agreed, and never delivered whole.
func TestSQLiteLockFreeCorruptBlob(t *testing.T) {
	good := storetest.Bytes(2<<20, 31)
	w, s, ids, _ := storetest.JournalStore(t, "delete", good)
	if err := w.Exec(`UPDATE sync_segments SET bytes = ?1 WHERE segment_id = ?2`, storetest.Bytes(2<<20, 32), ids[0]); err != nil {
		t.Fatal(err)
	}
	var got int64
	n, err := s.CopyBlob(context.Background(), idOf(ids[0]), writerFunc(func(p []byte) (int, error) {
		got += int64(len(p))
		return len(p), nil
	}))
	if !errors.Is(err, store.ErrCorruptSegment) || n >= int64(len(good)) || got != n {
		t.Fatalf("n %d (got %d) err %v, want ErrCorruptSegment before the last byte", n, got, err)
	}
}

// CopyBlob and FillInto verify the bytes they copy in every journal mode
// and on every path (the lock-free read; the locked read, which a blob of
// one chunk falls back to when the lock-free read does not verify; a WAL
// file's one-transaction copy), so that a fill hashes its bytes once:
// here, never in the tier that called them.
func TestSQLiteCopyBlobVerifies(t *testing.T) {
	for _, tc := range []struct {
		mode string
		size int
	}{{"wal", 64 << 10}, {"wal", 3 << 20}, {"delete", 64 << 10}, {"delete", 3 << 20}} {
		t.Run(tc.mode+"/"+strconv.Itoa(tc.size), func(t *testing.T) {
			good := storetest.Bytes(tc.size, 41)
			w, s, ids, _ := storetest.JournalStore(t, tc.mode, good, storetest.Bytes(tc.size, 42))
			ctx := context.Background()
			var buf bytes.Buffer
			if n, err := s.CopyBlob(ctx, idOf(ids[1]), &buf); err != nil || n != int64(tc.size) || !bytes.Equal(buf.Bytes(), storetest.Bytes(tc.size, 42)) {
				t.Fatalf("a sound blob: n %d err %v", n, err)
			}
			if err := w.Exec(`UPDATE sync_segments SET bytes = ?1 WHERE segment_id = ?2`, storetest.Bytes(tc.size, 43), ids[0]); err != nil {
				t.Fatal(err)
			}
			if _, err := s.CopyBlob(ctx, idOf(ids[0]), io.Discard); !errors.Is(err, store.ErrCorruptSegment) {
				t.Fatalf("CopyBlob of a blob that does not hash to its id: %v, want ErrCorruptSegment", err)
			}
			if err := s.FillInto(ctx, idOf(ids[0]), make([]byte, tc.size)); !errors.Is(err, store.ErrCorruptSegment) {
				t.Fatalf("FillInto of a blob that does not hash to its id: %v, want ErrCorruptSegment", err)
			}
		})
	}
}
