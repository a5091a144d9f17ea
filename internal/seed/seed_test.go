package seed_test

import (
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/testkit"
	"github.com/syncular/caddy-syncular/store"

	_ "modernc.org/sqlite"
)

// vectorsDir is testkit.VectorsDir: the protocol vectors, or a failed test.
func vectorsDir(t *testing.T) string { return testkit.VectorsDir(t) }

// copyVector copies a vector file into a fresh temp dir (the vectors dir
// is read-only) and returns its path.
func copyVector(t *testing.T, name string) string {
	t.Helper()
	src, err := os.Open(filepath.Join(vectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(t.TempDir(), name)
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, src); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func readJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// schemaSQL is name → sql of every table in sqlite_master.
func schemaSQL(t *testing.T, path string) map[string]string {
	t.Helper()
	rows, err := rawDB(t, path).Query(`SELECT name, sql FROM sqlite_master WHERE type = 'table'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, s string
		if err := rows.Scan(&n, &s); err != nil {
			t.Fatal(err)
		}
		out[n] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// dump returns every row of table (rowid first) with the driver's types,
// which follow SQLite's storage classes.
func dump(t *testing.T, path, table string) [][]any {
	t.Helper()
	rows, err := rawDB(t, path).Query(`SELECT rowid, * FROM ` + table + ` ORDER BY rowid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, vals)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestVectorDDL(t *testing.T) {
	legacy := schemaSQL(t, copyVector(t, "segments-legacy.sqlite"))
	pre := schemaSQL(t, copyVector(t, "segments-pre-logepoch.sqlite"))
	gen3 := schemaSQL(t, copyVector(t, "segments-gen3.sqlite"))
	if len(gen3) != 4 || len(legacy) != 1 || len(pre) != 1 {
		t.Fatalf("unexpected vector schemas: %d %d %d tables", len(legacy), len(pre), len(gen3))
	}
	for _, tc := range []struct {
		gen  int
		want map[string]string
	}{
		{1, pre},
		{2, legacy},
		{3, map[string]string{
			"sync_segments":             gen3["sync_segments"],
			"sync_segment_scopes":       gen3["sync_segment_scopes"],
			"sync_segment_publications": gen3["sync_segment_publications"],
		}},
	} {
		path := filepath.Join(t.TempDir(), "s.sqlite")
		w, err := seed.Create(path, tc.gen)
		if err != nil {
			t.Fatal(err)
		}
		if w.Gen() != tc.gen {
			t.Errorf("gen %d: Gen() = %d", tc.gen, w.Gen())
		}
		if got := schemaSQL(t, path); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("gen %d DDL:\n got %q\nwant %q", tc.gen, got, tc.want)
		}
		var mode string
		if err := rawDB(t, path).QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("gen %d journal_mode = %q, %v; want wal", tc.gen, mode, err)
		}
		if err := w.SetEpoch("p1", "e1", 1); err != nil {
			t.Fatal(err)
		}
		if got := schemaSQL(t, path)["sync_partition_registry"]; got != gen3["sync_partition_registry"] {
			t.Errorf("gen %d registry DDL:\n got %q\nwant %q", tc.gen, got, gen3["sync_partition_registry"])
		}
		w.Close()
	}
}

type putVector struct {
	Metadata store.Publication `json:"metadata"`
	BytesHex string            `json:"bytesHex"`
	NowMs    int64             `json:"nowMs"`
	Returned struct {
		SegmentID   string `json:"segmentId"`
		ExpiresAtMs int64  `json:"expiresAtMs"`
	} `json:"returned"`
}

// replay puts the vector's puts through seed and compares every row and
// storage class with the reference-written file.
func replay(t *testing.T, gen int, vectorDB string, puts []putVector) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "replay.sqlite")
	w, err := seed.Create(path, gen)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, p := range puts {
		b, err := hex.DecodeString(p.BytesHex)
		if err != nil {
			t.Fatal(err)
		}
		pub := p.Metadata
		pub.CreatedAtMs = p.NowMs
		pub.ExpiresAtMs = p.Returned.ExpiresAtMs
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: pub})
		if err != nil {
			t.Fatal(err)
		}
		if id != p.Returned.SegmentID || id != seed.SegmentID(b) {
			t.Errorf("put id %s, want %s", id, p.Returned.SegmentID)
		}
	}
	got, want := dump(t, path, "sync_segments"), dump(t, copyVector(t, vectorDB), "sync_segments")
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("row %d:\n got %v\nwant %v", i, got[i], want[i])
		}
	}
}

func TestVectorReplayLegacyPuts(t *testing.T) {
	var v struct {
		Puts []putVector `json:"puts"`
	}
	readJSON(t, "segments-legacy.json", &v)
	if len(v.Puts) != 8 {
		t.Fatalf("%d puts in segments-legacy.json, want 8", len(v.Puts))
	}
	replay(t, 2, "segments-legacy.sqlite", v.Puts)
}

func TestVectorReplayPreLogEpochPuts(t *testing.T) {
	var v struct {
		OldPuts []putVector `json:"oldPuts"`
	}
	readJSON(t, "segments-pre-logepoch.json", &v)
	if len(v.OldPuts) == 0 {
		t.Fatal("no oldPuts in segments-pre-logepoch.json")
	}
	replay(t, 1, "segments-pre-logepoch.sqlite", v.OldPuts)
}

func TestMigrateLogEpochAppendsLast(t *testing.T) {
	path := copyVector(t, "segments-pre-logepoch.sqlite")
	w, err := seed.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Gen() != 1 {
		t.Fatalf("Gen() = %d, want 1", w.Gen())
	}
	if err := w.MigrateLogEpoch(); err != nil {
		t.Fatal(err)
	}
	if err := w.MigrateLogEpoch(); err != nil { // idempotent
		t.Fatal(err)
	}
	var v struct {
		HeadOpen struct {
			OnDiskAfterMigration struct {
				SQLiteMaster []struct{ Name, SQL string } `json:"sqliteMaster"`
			} `json:"onDiskAfterMigration"`
		} `json:"headOpen"`
	}
	readJSON(t, "segments-pre-logepoch.json", &v)
	want := v.HeadOpen.OnDiskAfterMigration.SQLiteMaster[0].SQL
	if got := schemaSQL(t, path)["sync_segments"]; got != want {
		t.Errorf("migrated DDL:\n got %q\nwant %q", got, want)
	}
	if w.Gen() != 2 {
		t.Errorf("Gen() = %d after migration, want 2", w.Gen())
	}
	if err := w.MigrateGen3(); err != nil {
		t.Fatal(err)
	}
	if w.Gen() != 3 {
		t.Errorf("Gen() = %d after MigrateGen3, want 3", w.Gen())
	}
}

func TestWriterGen3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g3.sqlite")
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := seed.Create(path, 3); err == nil {
		t.Error("Create over an existing file succeeded")
	}
	if _, err := seed.Create(filepath.Join(t.TempDir(), "x"), 4); err == nil {
		t.Error("Create(gen 4) succeeded")
	}
	cur := "c1"
	p := store.Publication{Partition: "p1", LogEpoch: "e1", Table: "t", SchemaVersion: 2,
		ScopeDigest: strings.Repeat("a", 64), AsOfCommitSeq: 7, RowCount: 3, NextRowCursor: &cur,
		ByteLength: 999, CreatedAtMs: 10, ExpiresAtMs: 20}
	id, err := w.Put(seed.SegmentInput{Bytes: []byte("hello"), Publication: p, PubKey: "k0"})
	if err != nil {
		t.Fatal(err)
	}
	if id != seed.SegmentID([]byte("hello")) {
		t.Fatalf("id %s", id)
	}
	q := p
	q.Partition, q.ScopeDigest = "p2", strings.Repeat("b", 64)
	if err := w.AddPublication(id, "", q); err != nil {
		t.Fatal(err)
	}
	if err := w.AddScope(id, strings.Repeat("c", 64)); err != nil {
		t.Fatal(err)
	}
	rowOnly, err := w.Put(seed.SegmentInput{Bytes: []byte("old"), Publication: p, RowOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := rawDB(t, path).QueryRow(q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`SELECT count(*) FROM sync_segments WHERE segment_id = ? AND byte_length = 5 AND media_type = 'rows'`, id); n != 1 {
		t.Errorf("segment rows = %d", n)
	}
	if n := count(`SELECT count(*) FROM sync_segment_publications WHERE segment_id = ?`, id); n != 2 {
		t.Errorf("publication rows = %d, want 2", n)
	}
	if n := count(`SELECT count(*) FROM sync_segment_publications WHERE segment_id = ? AND pub_key = ?`, id, seed.PubKey(q)); n != 1 {
		t.Errorf("derived pub key row missing")
	}
	if n := count(`SELECT count(*) FROM sync_segment_scopes WHERE segment_id = ?`, id); n != 3 {
		t.Errorf("scope rows = %d, want 3", n)
	}
	if n := count(`SELECT count(*) FROM sync_segment_publications WHERE segment_id = ?`, rowOnly); n != 0 {
		t.Errorf("RowOnly wrote %d publication rows", n)
	}
	if err := w.SetEpoch("p1", "e1", 5); err != nil {
		t.Fatal(err)
	}
	if err := w.SetEpoch("p1", "e2", 6); err != nil {
		t.Fatal(err)
	}
	if n := count(`SELECT count(*) FROM sync_partition_registry WHERE partition = 'p1' AND log_epoch = 'e2' AND last_authenticated_at_ms = 6`); n != 1 {
		t.Errorf("registry not updated")
	}
	if err := w.DeleteSegment(id); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range []string{"sync_segments", "sync_segment_scopes", "sync_segment_publications"} {
		if n := count(`SELECT count(*) FROM `+tbl+` WHERE segment_id = ?`, id); n != 0 {
			t.Errorf("%s still has %d rows after delete", tbl, n)
		}
	}
}

func TestWriterGen1RejectsGen3Calls(t *testing.T) {
	w, err := seed.Create(filepath.Join(t.TempDir(), "g1.sqlite"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.AddScope("sha256:x", "d"); err == nil {
		t.Error("AddScope on gen 1 succeeded")
	}
	if err := w.AddPublication("sha256:x", "k", store.Publication{}); err == nil {
		t.Error("AddPublication on gen 1 succeeded")
	}
	if _, err := w.Put(seed.SegmentInput{Bytes: nil}); err != nil {
		t.Errorf("empty segment: %v", err)
	}
}

func TestPubKeyDeterministic(t *testing.T) {
	p := store.Publication{Partition: "p", ScopeDigest: "d"}
	first, second := seed.PubKey(p), seed.PubKey(p)
	if first != second || len(first) != 64 {
		t.Error("PubKey not a stable hex digest")
	}
	q := p
	q.ScopeDigest = "e"
	if seed.PubKey(p) == seed.PubKey(q) {
		t.Error("PubKey ignores the scope digest")
	}
}

// TestSetCheckpoint: the table has protocol §4's columns in order with
// (partition, name) as its key, in any generation, and a second write of
// the same checkpoint replaces the row.
func TestSetCheckpoint(t *testing.T) {
	for _, gen := range []int{1, 3} {
		path := filepath.Join(t.TempDir(), "c.sqlite")
		w, err := seed.Create(path, gen)
		if err != nil {
			t.Fatal(err)
		}
		c := seed.Checkpoint{Partition: "p1", Name: "tasks-projection", SchemaVersion: 2, UpdatedAtMs: 5}
		if err := w.SetCheckpoint(c); err != nil {
			t.Fatal(err)
		}
		db := rawDB(t, path)
		rows, err := db.Query(`SELECT name, pk FROM pragma_table_info('sync_backfill_checkpoints') ORDER BY cid`)
		if err != nil {
			t.Fatal(err)
		}
		var cols []string
		pk := map[string]int{}
		for rows.Next() {
			var name string
			var k int
			if err := rows.Scan(&name, &k); err != nil {
				t.Fatal(err)
			}
			cols = append(cols, name)
			if k > 0 {
				pk[name] = k
			}
		}
		rows.Close()
		want := []string{"partition", "name", "schema_version", "state", "watermark", "owner_epoch", "observed_rows", "updated_at_ms"}
		if !reflect.DeepEqual(cols, want) {
			t.Errorf("gen %d columns %q, want %q", gen, cols, want)
		}
		if !reflect.DeepEqual(pk, map[string]int{"partition": 1, "name": 2}) {
			t.Errorf("gen %d primary key %v", gen, pk)
		}
		c.SchemaVersion, c.State, c.Watermark, c.UpdatedAtMs = 3, "activated", 9, 6
		if err := w.SetCheckpoint(c); err != nil {
			t.Fatal(err)
		}
		if err := w.SetCheckpoint(seed.Checkpoint{Partition: "p1", Name: "other", SchemaVersion: 1}); err != nil {
			t.Fatal(err)
		}
		got := dump(t, path, "sync_backfill_checkpoints")
		if len(got) != 2 {
			t.Fatalf("gen %d: %d rows, want 2: %v", gen, len(got), got)
		}
		var schema int64
		var state string
		if err := db.QueryRow(`SELECT schema_version, state FROM sync_backfill_checkpoints WHERE name = 'tasks-projection'`).Scan(&schema, &state); err != nil {
			t.Fatal(err)
		}
		if schema != 3 || state != "activated" {
			t.Errorf("gen %d: upsert left schema_version %d state %q", gen, schema, state)
		}
		if err := db.QueryRow(`SELECT state FROM sync_backfill_checkpoints WHERE name = 'other'`).Scan(&state); err != nil || state != "declared" {
			t.Errorf("gen %d: default state %q, %v", gen, state, err)
		}
		w.Close()
	}
}
