package sqlite_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// liveModel is what the writer has committed, for the readers to check
// against. A segment is flagged deleted before the delete commits.
type liveModel struct {
	mu      sync.Mutex
	ids     []string
	bytes   map[string][]byte
	deleted map[string]bool
	// expected publications of each live segment once the writer is done
	pubs    map[string]map[string]store.Publication // explicit rows by pub key
	derived map[string]store.Publication            // the row's own fields
	scopes  map[string][]string                     // sync_segment_scopes rows
}

func (m *liveModel) pick(r *rand.Rand) (string, []byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.ids) == 0 {
		return "", nil, false
	}
	id := m.ids[r.IntN(len(m.ids))]
	return id, m.bytes[id], m.deleted[id]
}

func (m *liveModel) isDeleted(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.deleted[id]
}

// TestSQLiteConcurrentWriter runs a writer (WAL, as the sync server runs)
// that puts segments, migrates the file gen 1 → 2 → 3, adds publications,
// starts the partition registry and deletes segments, while four readers
// Lookup and Open. Every read must be self-consistent and no lock error
// may surface.
func TestSQLiteConcurrentWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "live.sqlite")
	w, err := seed.Create(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	m := &liveModel{bytes: map[string][]byte{}, deleted: map[string]bool{},
		pubs: map[string]map[string]store.Publication{}, derived: map[string]store.Publication{},
		scopes: map[string][]string{}}
	partitions := []string{"tenant-a", "tenant-b"}
	digest := func(i int) string { return fmt.Sprintf("%064x", i%5) }
	rng := rand.New(rand.NewPCG(1, 2))
	const nowMs = 1800000000000

	put := func(i int) error {
		b := make([]byte, 1+rng.IntN(6000))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		p := store.Publication{Partition: partitions[i%2], Table: "t", SchemaVersion: 1,
			MediaType: []string{"rows", "sqlite"}[i%2], ScopeDigest: digest(i), AsOfCommitSeq: int64(i),
			RowCount: int64(i), CreatedAtMs: nowMs, ExpiresAtMs: nowMs + int64(i)}
		if w.Gen() >= 2 {
			p.LogEpoch = "e1"
		}
		p.ByteLength = int64(len(b))
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: p, PubKey: "k0"})
		if err != nil {
			return err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.ids = append(m.ids, id)
		m.bytes[id] = b
		if w.Gen() == 3 {
			m.pubs[id] = map[string]store.Publication{"k0": p}
			m.scopes[id] = append(m.scopes[id], p.ScopeDigest)
		} else {
			m.derived[id] = p
		}
		return nil
	}
	for i := range 10 {
		if err := put(i); err != nil {
			t.Fatal(err)
		}
	}

	s := storetest.OpenSQLite(t, path)
	// The writer migrates at fixed points of the run (by time, so a slow
	// -race build still goes through every stage), readers read throughout.
	const runFor = 1500 * time.Millisecond
	start := time.Now()
	writerDone := make(chan error, 1)
	var registry atomic.Bool
	var reads, opens, misses atomic.Int64
	go func() {
		writerDone <- func() error {
			stage := 0
			for i := 10; i < 100000; i++ {
				elapsed := time.Since(start)
				// Past runFor the writer keeps writing until the readers
				// have done enough reads to mean something: a loaded
				// machine slows the readers, not the point of the test.
				if elapsed > runFor && stage == 3 && (reads.Load() >= 100 || elapsed > 60*time.Second) {
					break
				}
				switch {
				case stage == 0 && elapsed > runFor/5:
					if err := w.MigrateLogEpoch(); err != nil {
						return err
					}
					stage++
				case stage == 1 && elapsed > 2*runFor/5:
					if err := w.MigrateGen3(); err != nil {
						return err
					}
					stage++
				case stage == 2 && elapsed > 3*runFor/5:
					if err := w.SetEpoch("tenant-a", "e1", nowMs); err != nil {
						return err
					}
					registry.Store(true)
					stage++
				}
				if err := put(i); err != nil {
					return err
				}
				if w.Gen() == 3 && i%3 == 0 {
					// Publish an earlier segment once more, under another digest.
					m.mu.Lock()
					id := m.ids[rng.IntN(len(m.ids))]
					gone := m.deleted[id]
					n := int64(len(m.bytes[id]))
					m.mu.Unlock()
					if !gone {
						p := store.Publication{Partition: partitions[(i/3)%2], LogEpoch: "e1", Table: "t",
							SchemaVersion: 1, MediaType: "rows", ScopeDigest: digest(i + 1), AsOfCommitSeq: int64(i),
							ByteLength: n, CreatedAtMs: nowMs, ExpiresAtMs: nowMs + int64(i)}
						key := fmt.Sprintf("k%d", i)
						if err := w.AddPublication(id, key, p); err != nil {
							return err
						}
						m.mu.Lock()
						if m.pubs[id] == nil {
							m.pubs[id] = map[string]store.Publication{}
						}
						m.pubs[id][key] = p
						m.scopes[id] = append(m.scopes[id], p.ScopeDigest)
						m.mu.Unlock()
					}
				}
				if i%7 == 0 {
					m.mu.Lock()
					id := m.ids[rng.IntN(len(m.ids))]
					m.deleted[id] = true
					m.mu.Unlock()
					if err := w.DeleteSegment(id); err != nil {
						return err
					}
				}
			}
			return nil
		}()
	}()

	var (
		errMu sync.Mutex
		errs  []string
	)
	fail := func(format string, args ...any) {
		errMu.Lock()
		defer errMu.Unlock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 99))
			ctx := context.Background()
			for {
				select {
				case <-stop:
					return
				default:
				}
				id, body, _ := m.pick(rng)
				rec, err := s.Lookup(ctx, idOf(id))
				reads.Add(1)
				switch {
				case errors.Is(err, store.ErrNotFound):
					misses.Add(1)
					if !m.isDeleted(id) {
						fail("Lookup(%s): ErrNotFound for a live segment", id)
					}
					continue
				case err != nil:
					fail("Lookup: %v", err)
					continue
				}
				if rec.SegmentID != id || rec.ByteLength != int64(len(body)) || len(rec.Publications) == 0 {
					fail("Lookup(%s): inconsistent record %s", id, js(rec))
				}
				for _, p := range rec.Publications {
					if p.ByteLength != rec.ByteLength || (p.MediaType != "rows" && p.MediaType != "sqlite") ||
						(p.Partition != "tenant-a" && p.Partition != "tenant-b") || len(p.ScopeDigest) != 64 {
						fail("Lookup(%s): inconsistent publication %s", id, js(p))
					}
				}
				off, n := int64(0), int64(-1)
				if rng.IntN(3) == 0 {
					off, n = int64(rng.IntN(len(body))), int64(rng.IntN(len(body)))
				}
				got, err := readAll(t, s, id, off, n)
				opens.Add(1)
				switch {
				case errors.Is(err, store.ErrNotFound):
					if !m.isDeleted(id) {
						fail("Open(%s): ErrNotFound for a live segment", id)
					}
				case err != nil:
					fail("Open: %v", err)
				case n < 0:
					sum := sha256.Sum256(got)
					if "sha256:"+hex.EncodeToString(sum[:]) != id || int64(len(got)) != rec.ByteLength {
						fail("Open(%s): %d bytes that do not hash to the id", id, len(got))
					}
				default:
					if !bytes.Equal(got, body[off:min(off+n, int64(len(body)))]) {
						fail("Open(%s, %d, %d): wrong range", id, off, n)
					}
				}
			}
		}()
	}
	if err := <-writerDone; err != nil {
		t.Errorf("writer: %v", err)
	}
	close(stop)
	wg.Wait()
	for _, e := range errs {
		if strings.Contains(e, "locked") || strings.Contains(e, "busy") {
			t.Errorf("SQLITE_BUSY leaked: %s", e)
		} else {
			t.Error(e)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("%d segments written (gen %d at the end), %d lookups (%d of deleted ids), %d opens",
		len(m.ids), w.Gen(), reads.Load(), misses.Load(), opens.Load())
	if reads.Load() < 100 || w.Gen() != 3 || !registry.Load() {
		t.Fatalf("the run was too short to mean anything: %d reads, gen %d, registry %v", reads.Load(), w.Gen(), registry.Load())
	}

	// Afterwards, every live segment reads exactly as the model says: the
	// store followed every migration without a restart.
	for _, id := range m.ids {
		rec, err := s.Lookup(context.Background(), idOf(id))
		if m.deleted[id] {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("deleted %s: %v", id, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("final Lookup(%s): %v", id, err)
			continue
		}
		var want []store.Publication
		if len(m.pubs[id]) > 0 {
			for _, p := range m.pubs[id] {
				want = append(want, p)
			}
		} else {
			want = append(want, m.derived[id])
			for _, d := range m.scopes[id] {
				if d != m.derived[id].ScopeDigest {
					p := m.derived[id]
					p.ScopeDigest = d
					want = append(want, p)
				}
			}
		}
		key := func(p store.Publication) string { return p.Partition + p.ScopeDigest + fmt.Sprint(p.ExpiresAtMs) }
		got := append([]store.Publication(nil), rec.Publications...)
		sort.Slice(got, func(i, j int) bool { return key(got[i]) < key(got[j]) })
		sort.Slice(want, func(i, j int) bool { return key(want[i]) < key(want[j]) })
		if !reflect.DeepEqual(got, want) {
			t.Errorf("final Lookup(%s):\n got %s\nwant %s", id, js(got), js(want))
		}
		wantEpochs := map[string]string{}
		for _, p := range want {
			if p.Partition == "tenant-a" {
				wantEpochs["tenant-a"] = "e1"
			}
		}
		if !rec.Fenced || !reflect.DeepEqual(rec.Epochs, wantEpochs) {
			t.Errorf("final Lookup(%s): Fenced=%v Epochs=%v, want %v", id, rec.Fenced, rec.Epochs, wantEpochs)
		}
	}
}

// TestSQLiteReadOnly: neither the store's own handle nor its DSN can write,
// even with PRAGMA query_only switched off (mode=ro alone holds).
func TestSQLiteReadOnly(t *testing.T) {
	path := copyVector(t, "segments-legacy.sqlite")
	s := storetest.OpenSQLite(t, path)
	ctx := context.Background()
	const insert = `INSERT INTO sync_segments (segment_id, partition, log_epoch, tbl, schema_version,
 media_type, scope_digest, as_of_commit_seq, row_count, byte_length, created_at_ms, expires_at_ms, bytes)
 VALUES ('sha256:x', 'p', '', 't', 1, 'rows', 'd', 1, 1, 1, 1, 1, x'00')`

	db := sqlite.DBForTest(s)
	if _, err := db.ExecContext(ctx, insert); err == nil {
		t.Error("INSERT through the store's handle succeeded")
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE x(a)`); err == nil {
		t.Error("CREATE TABLE through the store's handle succeeded")
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, insert); err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Errorf("INSERT with query_only off: %v; want a readonly error", err)
	}
	conn.Close()

	raw, err := sql.Open("sqlite", sqlite.DSNForTest(path, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(insert); err == nil {
		t.Error("INSERT through the store's DSN succeeded")
	}
	if _, err := s.Lookup(ctx, idOf("sha256:x")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the write landed: %v", err)
	}
}

// TestSQLitePathEscaping: '?', '#', '%' and spaces in the path are part of
// the file name, not URI syntax.
func TestSQLitePathEscaping(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "we?ird #dir %41")
	if err := mkdir(dir); err != nil {
		t.Fatal(err)
	}
	path := copyFile(t, filepath.Join(vectorsDir(t), "segments-legacy.sqlite"), filepath.Join(dir, "seg%41?mode=rw#x.sqlite"))
	s := storetest.OpenSQLite(t, path)
	if _, err := s.Lookup(context.Background(), idOf("sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859")); err != nil {
		t.Fatal(err)
	}
	if _, err := sqlite.DBForTest(s).Exec(`CREATE TABLE x(a)`); err == nil {
		t.Error("a '?mode=rw' in the file name made the store writable")
	}
	// Relative paths are made absolute.
	rel, err := filepath.Rel(mustGetwd(t), path)
	if err != nil {
		t.Fatal(err)
	}
	s2 := storetest.OpenSQLite(t, rel)
	if _, err := s2.Lookup(context.Background(), idOf("sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859")); err != nil {
		t.Fatal(err)
	}
}
