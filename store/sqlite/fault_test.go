package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// A partition id that must never appear in an error message.
const secretPartition = "tenant-secret-7f3a"

// seeded creates a gen-3 WAL store holding one segment of secretPartition,
// with the registry, and returns the writer, the path and the segment id.
func seeded(t *testing.T) (*seed.Writer, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sqlite")
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	id, err := w.Put(seed.SegmentInput{Bytes: []byte("secret segment bytes " + secretPartition),
		Publication: store.Publication{Partition: secretPartition, LogEpoch: "e1", Table: "t",
			ScopeDigest: strings.Repeat("a", 64), CreatedAtMs: 1, ExpiresAtMs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SetEpoch(secretPartition, "e1", 1); err != nil {
		t.Fatal(err)
	}
	return w, path, id
}

// checkFault asserts err is a fault: not nil, not ErrNotFound, and free of
// partition ids and segment bytes.
func checkFault(t *testing.T, what string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error", what)
	case errors.Is(err, store.ErrNotFound):
		t.Errorf("%s: ErrNotFound for a fault: %v", what, err)
	case strings.Contains(err.Error(), secretPartition) || strings.Contains(err.Error(), "secret segment"):
		t.Errorf("%s: the error leaks stored data: %v", what, err)
	default:
		t.Logf("%s: %v", what, err)
	}
}

func TestSQLiteOpenFails(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	garbage := make([]byte, 8192)
	for i := range garbage {
		garbage[i] = byte(i*7 + 3)
	}
	other := filepath.Join(dir, "other.sqlite")
	db, err := sql.Open("sqlite", "file:"+other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE other(a)`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	for _, tc := range []struct{ name, path, want string }{
		{"missing file", filepath.Join(dir, "nope.sqlite"), "no such file"},
		{"garbage", write("garbage.sqlite", garbage), "not a database"},
		{"empty file", write("empty.sqlite", nil), "no sync_segments table"},
		{"no sync_segments", other, "no sync_segments table"},
		{"directory", dir, "not a regular file"},
		{"empty path", "", "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sqlite.Open(tc.path, sqlite.Options{})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "nope.sqlite")); !os.IsNotExist(err) {
		t.Errorf("opening a missing file created it: %v", err)
	}
}

func TestSQLiteFaults(t *testing.T) {
	ctx := context.Background()

	t.Run("table dropped after open", func(t *testing.T) {
		w, path, id := seeded(t)
		s := storetest.OpenSQLite(t, path)
		if _, err := s.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
		if err := w.Exec(`DROP TABLE sync_segments`); err != nil {
			t.Fatal(err)
		}
		_, err := s.Lookup(ctx, idOf(id))
		checkFault(t, "Lookup", err)
		_, err = s.Lookup(ctx, idOf("sha256:0000000000000000000000000000000000000000000000000000000000000000"))
		checkFault(t, "Lookup of an unknown id", err)
		_, err = s.Open(ctx, idOf(id), 0, -1)
		checkFault(t, "Open", err)
	})

	t.Run("gen-3 tables dropped after open", func(t *testing.T) {
		// Not a fault: the shape moved back to gen 2, re-detected.
		w, path, id := seeded(t)
		s := storetest.OpenSQLite(t, path)
		if _, err := s.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
		if err := w.Exec(`DROP TABLE sync_segment_publications`); err != nil {
			t.Fatal(err)
		}
		if err := w.Exec(`DROP TABLE sync_partition_registry`); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Lookup(ctx, idOf(id))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Fenced || len(rec.Publications) != 1 {
			t.Errorf("after dropping gen-3 tables: %s", js(rec))
		}
	})

	t.Run("file deleted after open", func(t *testing.T) {
		w, path, id := seeded(t)
		s := storetest.OpenSQLite(t, path)
		if _, err := s.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
		w.Close()
		for _, suffix := range []string{"", "-wal", "-shm"} {
			os.Remove(path + suffix)
		}
		_, err := s.Lookup(ctx, idOf(id))
		checkFault(t, "Lookup", err)
		_, err = s.Open(ctx, idOf(id), 0, -1)
		checkFault(t, "Open", err)
	})

	t.Run("file replaced after open", func(t *testing.T) {
		// A restore moved another file over the path (rollback-journal
		// files: moving a file over a WAL database whose -wal is still
		// there makes SQLite replay that WAL onto it, for every client).
		path := copyVector(t, "segments-legacy.sqlite")
		s := storetest.OpenSQLite(t, path)
		const legacyID = "sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859"
		const gen3ID = "sha256:33016ca4ff1ec281affb6d0d501780886b41ce55f64eff8c213b352a67283d50"
		if _, err := s.Lookup(ctx, idOf(legacyID)); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(copyVector(t, "segments-gen3.sqlite"), path); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Lookup(ctx, idOf(legacyID)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("old file's segment after replacement: %v", err)
		}
		rec, err := s.Lookup(ctx, idOf(gen3ID))
		if err != nil || !rec.Fenced || len(rec.Publications) != 2 {
			t.Errorf("new file's segment: %s %v", js(rec), err)
		}
		if b, err := readAll(t, s, gen3ID, 0, 4); err != nil || len(b) != 4 {
			t.Errorf("Open on the new file: %x %v", b, err)
		}
	})

	t.Run("file truncated after open", func(t *testing.T) {
		path := copyVector(t, "segments-legacy.sqlite") // rollback journal
		s := storetest.OpenSQLite(t, path)
		const id = "sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859"
		if _, err := s.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		_, err := s.Lookup(ctx, idOf(id))
		checkFault(t, "Lookup", err)
		_, err = s.Open(ctx, idOf(id), 0, -1)
		checkFault(t, "Open", err)
	})

	t.Run("corrupt pages", func(t *testing.T) {
		path := copyVector(t, "segments-legacy.sqlite")
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		junk := make([]byte, 8192) // pages 2 and 3: the table and its index
		for i := range junk {
			junk[i] = 0xA5
		}
		if _, err := f.WriteAt(junk, 4096); err != nil {
			t.Fatal(err)
		}
		f.Close()
		s := storetest.OpenSQLite(t, path)
		_, err = s.Lookup(ctx, idOf("sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859"))
		checkFault(t, "Lookup", err)
		_, err = s.Lookup(ctx, idOf("sha256:0000000000000000000000000000000000000000000000000000000000000000"))
		checkFault(t, "Lookup of an unknown id", err)
	})

	t.Run("value of the wrong type", func(t *testing.T) {
		w, path, id := seeded(t)
		if err := w.Exec(`UPDATE sync_segment_publications SET schema_version = partition`); err != nil {
			t.Fatal(err)
		}
		s := storetest.OpenSQLite(t, path)
		_, err := s.Lookup(ctx, idOf(id))
		checkFault(t, "Lookup", err)
	})

	t.Run("locked beyond the busy timeout", func(t *testing.T) {
		path := copyVector(t, "segments-legacy.sqlite") // rollback journal: a writer's lock blocks readers
		s, err := sqlite.Open(path, sqlite.Options{BusyTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `BEGIN EXCLUSIVE`); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = s.Lookup(ctx, idOf("sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859"))
		checkFault(t, "Lookup", err)
		if took := time.Since(start); took < 90*time.Millisecond || took > 3*time.Second {
			t.Errorf("gave up after %v, want about the 100ms busy timeout", took)
		}
		if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Lookup(ctx, idOf("sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859")); err != nil {
			t.Errorf("after the lock is released: %v", err)
		}
	})

	t.Run("canceled context", func(t *testing.T) {
		_, path, id := seeded(t)
		s := storetest.OpenSQLite(t, path)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := s.Lookup(cctx, idOf(id))
		checkFault(t, "Lookup", err)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lookup: %v, want context.Canceled", err)
		}
		_, err = s.Open(cctx, idOf(id), 0, -1)
		checkFault(t, "Open", err)
	})

	t.Run("closed store", func(t *testing.T) {
		_, path, id := seeded(t)
		s, err := sqlite.Open(path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		_, err = s.Lookup(ctx, idOf(id))
		checkFault(t, "Lookup", err)
		_, err = s.Open(ctx, idOf(id), 0, -1)
		checkFault(t, "Open", err)
	})

	t.Run("negative offset", func(t *testing.T) {
		_, path, id := seeded(t)
		s := storetest.OpenSQLite(t, path)
		_, err := s.Open(ctx, idOf(id), -1, 1)
		checkFault(t, "Open", err)
	})
}

// TestSQLiteMediaTypeMapping: like the reference get(), any stored
// media_type other than "sqlite" reads as "rows".
func TestSQLiteMediaTypeMapping(t *testing.T) {
	w, path, id := seeded(t)
	if err := w.Exec(`UPDATE sync_segments SET media_type = 'SQLite'`); err != nil {
		t.Fatal(err)
	}
	if err := w.Exec(`UPDATE sync_segment_publications SET media_type = 'image/x-sqlite'`); err != nil {
		t.Fatal(err)
	}
	sq, err := w.Put(seed.SegmentInput{Bytes: []byte("an image"), Publication: store.Publication{
		Partition: "p", MediaType: "sqlite", ScopeDigest: strings.Repeat("b", 64)}})
	if err != nil {
		t.Fatal(err)
	}
	s := storetest.OpenSQLite(t, path)
	rec, err := s.Lookup(context.Background(), idOf(id))
	if err != nil {
		t.Fatal(err)
	}
	if rec.MediaType != store.MediaRows || rec.Publications[0].MediaType != store.MediaRows {
		t.Errorf("media types %q %q, want rows", rec.MediaType, rec.Publications[0].MediaType)
	}
	rec, err = s.Lookup(context.Background(), idOf(sq))
	if err != nil {
		t.Fatal(err)
	}
	if rec.MediaType != store.MediaSQLite || rec.Publications[0].MediaType != store.MediaSQLite {
		t.Errorf("media types %q %q, want sqlite", rec.MediaType, rec.Publications[0].MediaType)
	}
}
