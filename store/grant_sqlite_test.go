package store_test

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/store"
)

// TestSQLiteCheckpoints: backfill checkpoints are read with the record,
// in every schema generation, from a table that may appear or go while
// the store is open, and overtake the publications of their partition
// with a lower schemaVersion (protocol §4).
func TestSQLiteCheckpoints(t *testing.T) {
	ctx := context.Background()
	for _, gen := range []int{1, 2, 3} {
		t.Run("gen"+string(rune('0'+gen)), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ckpt.sqlite")
			w, err := seed.Create(path, gen)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			p1 := gpub("p1", sdA, 2, grantNow+60_000)
			id, err := w.Put(seed.SegmentInput{Bytes: []byte("checkpointed"), Publication: p1})
			if err != nil {
				t.Fatal(err)
			}
			if gen == 3 { // a second partition, at a later schema version
				if err := w.AddPublication(id, "", gpub("p2", sdA, 5, grantNow+90_000)); err != nil {
					t.Fatal(err)
				}
			}
			s := storetest.OpenSQLite(t, path)
			check := func(step string, s store.Store, want map[string]int64, p1Want, p2Want store.GrantResult) {
				t.Helper()
				rec, err := s.Lookup(ctx, idOf(id))
				if err != nil {
					t.Fatalf("%s: Lookup: %v", step, err)
				}
				if !reflect.DeepEqual(rec.Checkpoints, want) {
					t.Errorf("%s: Checkpoints = %v, want %v", step, rec.Checkpoints, want)
				}
				if got := store.Grant(rec, sdA, "aud:p1", grantAud, grantNow); got != p1Want {
					t.Errorf("%s: p1 grant %+v, want %+v", step, got, p1Want)
				}
				if gen == 3 {
					if got := store.Grant(rec, sdA, "aud:p2", grantAud, grantNow); got != p2Want {
						t.Errorf("%s: p2 grant %+v, want %+v", step, got, p2Want)
					}
				}
			}
			granted1 := store.GrantResult{Outcome: store.Granted, UntilMs: grantNow + 60_000}
			granted2 := store.GrantResult{Outcome: store.Granted, UntilMs: grantNow + 90_000}
			overtaken := store.GrantResult{Outcome: store.Expired, Reason: store.ReasonOvertaken}

			check("no table", s, nil, granted1, granted2)

			// The table appears while the store is open; a checkpoint at
			// the publication's own schema version overtakes nothing.
			if err := w.SetCheckpoint(seed.Checkpoint{Partition: "p1", Name: "a", SchemaVersion: 2}); err != nil {
				t.Fatal(err)
			}
			if err := w.SetCheckpoint(seed.Checkpoint{Partition: "p9", Name: "a", SchemaVersion: 99}); err != nil {
				t.Fatal(err)
			}
			// p9 has no publication here: not in the record.
			check("checkpoint at the same version", s, map[string]int64{"p1": 2}, granted1, granted2)

			// A later checkpoint of p1 overtakes p1's publication only.
			if err := w.SetCheckpoint(seed.Checkpoint{Partition: "p1", Name: "b", SchemaVersion: 3, State: "activated"}); err != nil {
				t.Fatal(err)
			}
			check("later checkpoint", s, map[string]int64{"p1": 3}, overtaken, granted2)
			// A store opened on a file that already has the table, and one
			// behind the record cache, read the same.
			check("fresh store", storetest.OpenSQLite(t, path), map[string]int64{"p1": 3}, overtaken, granted2)
			c := store.NewCached(storetest.OpenSQLite(t, path), store.CacheOptions{RecordTTL: time.Minute, MaxRecords: 8})
			for _, step := range []string{"cache miss", "cache hit"} {
				check(step, c, map[string]int64{"p1": 3}, overtaken, granted2)
			}
			if hits := c.Stats().RecordHits; hits != 1 {
				t.Errorf("record cache hits = %d, want 1", hits)
			}

			// The table goes: nothing is overtaken any more.
			if err := w.Exec(`DROP TABLE sync_backfill_checkpoints`); err != nil {
				t.Fatal(err)
			}
			check("table dropped", s, nil, granted1, granted2)
		})
	}
}

// TestSQLiteCheckpointFault: a checkpoint schema_version that is not a
// number is a store fault, not a silent grant.
func TestSQLiteCheckpointFault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.sqlite")
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	id, err := w.Put(seed.SegmentInput{Bytes: []byte("x"), Publication: gpub("p1", sdA, 2, grantNow+60_000)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SetCheckpoint(seed.Checkpoint{Partition: "p1", Name: "a", SchemaVersion: 3}); err != nil {
		t.Fatal(err)
	}
	if err := w.Exec(`UPDATE sync_backfill_checkpoints SET schema_version = 'three'`); err != nil {
		t.Fatal(err)
	}
	rec, err := storetest.OpenSQLite(t, path).Lookup(context.Background(), idOf(id))
	if err == nil {
		t.Fatalf("Lookup succeeded with a text schema_version: %+v", rec)
	}
}
