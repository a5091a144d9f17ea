package sqlite_test

import (
	"context"
	"errors"
	"testing"

	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// TestSQLiteDescribeVectors reads the layout and counts of each vector
// store generation (the counts are the files' own, checked once with the
// sqlite3 shell).
func TestSQLiteDescribeVectors(t *testing.T) {
	cases := []struct {
		file                    string
		gen                     int
		logEpoch, pubs, reg     bool
		segments, pubRows, reg2 int64
	}{
		{"segments-gen3.sqlite", 3, true, true, true, 9, 10, 2},
		{"segments-legacy.sqlite", 2, true, false, false, 7, -1, -1},
		{"segments-pre-logepoch.sqlite", 1, false, false, false, 2, -1, -1},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			st, err := sqlite.Open(copyVector(t, c.file), sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			d, err := st.Describe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if d.Generation != c.gen || d.LogEpoch != c.logEpoch || d.PublicationsTable != c.pubs || d.ScopesTable != c.pubs ||
				d.Registry != c.reg || d.Checkpoints {
				t.Errorf("layout = %+v", d)
			}
			if d.Segments != c.segments || d.Publications != c.pubRows || d.RegistryPartitions != c.reg2 || d.CheckpointRows != -1 {
				t.Errorf("counts = %d segments, %d publications, %d registry rows, %d checkpoint rows; want %d, %d, %d, -1",
					d.Segments, d.Publications, d.RegistryPartitions, d.CheckpointRows, c.segments, c.pubRows, c.reg2)
			}
			if d.JournalMode != "delete" || d.SchemaVersion <= 0 {
				t.Errorf("journal mode %q, schema_version %d", d.JournalMode, d.SchemaVersion)
			}
			// Describe leaves the store usable (its own connection).
			if _, err := st.Lookup(context.Background(), idOf("sha256:"+zeros64)); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Lookup after Describe = %v", err)
			}
		})
	}
}

const zeros64 = "0000000000000000000000000000000000000000000000000000000000000000"
