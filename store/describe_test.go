package store_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncular/caddy-syncular/internal/testkit"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// TestPublicationStatesVectors: the state of each publication of the gen-3
// vector at its nowMs, as the vector's cases say the edge answers them.
func TestPublicationStatesVectors(t *testing.T) {
	const now = int64(1800000000000)
	st, err := sqlite.Open(copyVector(t, "segments-gen3.sqlite"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	type want struct{ partition, state string }
	cases := []struct {
		name, id string
		want     []want
	}{
		{"twoPartitions", "sha256:56fabe73ab9525b8a22d7d1e6106405ed70561156572290422af86f657d073ef", []want{{"p1", store.StateExpired}, {"p2", store.StateLive}}},
		{"expiresSoon", "sha256:82e5709df292e929a76049b651d11c53ab4db60c3f983b988a175eece1e506d4", []want{{"p1", store.StateLive}}},
		{"expiredAtNow", "sha256:6a3f3c23ced4a4b6f7d822c7cc50f087b68b93988c2f15dba9a42e0050db57d6", []want{{"p1", store.StateExpired}}},
		{"rotated epoch", "sha256:85bbb6e22770830b7e95162539b02472c1f97c30247ca098253890489cc5d008", []want{{"p1", store.StateFenced}}},
		{"unregistered", "sha256:e509b8d0b760790b98d61ea7fd12a5899856a58c6be0f0097d36f18762e9a8f1", []want{{"p3-unregistered", store.StateFenced}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec, err := st.Lookup(context.Background(), idOf(c.id))
			if err != nil {
				t.Fatal(err)
			}
			got := store.PublicationStates(rec, now)
			if len(got) != len(c.want) {
				t.Fatalf("%d states, want %d", len(got), len(c.want))
			}
			for i, w := range c.want {
				if got[i].Partition != w.partition || got[i].State != w.state {
					t.Errorf("publication %d: %s %s, want %s %s", i, got[i].Partition, got[i].State, w.partition, w.state)
				}
				reg := w.partition != "p3-unregistered"
				if got[i].Registered != reg || (reg && got[i].CurrentEpoch != "e1") {
					t.Errorf("publication %d: registered %v epoch %q", i, got[i].Registered, got[i].CurrentEpoch)
				}
			}
		})
	}
}

// TestPublicationStatesOvertaken: a live publication below its
// partition's checkpoint is overtaken; the checkpoint is reported.
func TestPublicationStatesOvertaken(t *testing.T) {
	rec := &store.Record{
		Publications: []store.Publication{
			{Partition: "a", ScopeDigest: "d", SchemaVersion: 1, ExpiresAtMs: 2000},
			{Partition: "a", ScopeDigest: "d", SchemaVersion: 2, ExpiresAtMs: 2000},
			{Partition: "b", ScopeDigest: "d", SchemaVersion: 1, ExpiresAtMs: 500},
		},
		Checkpoints: map[string]int64{"a": 2, "b": 9},
	}
	got := store.PublicationStates(rec, 1000)
	want := []string{store.StateOvertaken, store.StateLive, store.StateExpired}
	for i, w := range want {
		if got[i].State != w {
			t.Errorf("publication %d: %s, want %s", i, got[i].State, w)
		}
		if !got[i].HasCheckpoint || got[i].Checkpoint != rec.Checkpoints[got[i].Partition] {
			t.Errorf("publication %d: checkpoint %v %d", i, got[i].HasCheckpoint, got[i].Checkpoint)
		}
	}
	if store.PublicationStates(nil, 0) != nil {
		t.Error("states of no record")
	}
}

// copyVector copies a vector database into a fresh temp dir (the vectors
// dir is read-only, and WAL needs a writable one) and returns its path.
func copyVector(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testkit.VectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
