package integration

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// checkpointSite serves one store twice: /fresh/ without the record
// cache (every request reads the file) and /cached/ with the default
// record_ttl of 2s.
const checkpointSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
	syncular_segments /fresh/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite STORE_PATH
		untokened reject
		cache {
			record_ttl 0
		}
	}
	syncular_segments /cached/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite STORE_PATH
		untokened reject
	}
	respond 418
}
`

// TestSQLiteBackfillCheckpoint: the sync server (internal/seed, the
// reference's WAL file) declares backfill checkpoints while the real
// binary reads the store. A checkpoint of another partition, or at the
// publication's own schema version, changes nothing; one at a later
// schema version of the publication's partition turns 200 into 404
// sync.segment_expired (protocol §4) — at once without the record
// cache, and within record_ttl (2s) behind it.
func TestSQLiteBackfillCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	body := []byte("SSG2 segment minted before the backfill checkpoint")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"u-ckpt"}})
	nowMs := time.Now().UnixMilli()
	id, err := w.Put(seed.SegmentInput{Bytes: body, Publication: store.Publication{
		Partition: "p-ckpt", LogEpoch: "e1", Table: "tasks", SchemaVersion: 3, MediaType: "rows",
		ScopeDigest: digest, RowCount: 1, CreatedAtMs: nowMs, ExpiresAtMs: nowMs + 3600_000,
	}})
	if err != nil {
		t.Fatal(err)
	}

	key := randKey(t)
	c := startCaddy(t, strings.ReplaceAll(checkpointSite, "STORE_PATH", path), "SEG_KEY="+key)
	tok := token.Sign([]byte(key), id, digest, "aud:p-ckpt", time.Now().Add(10*time.Minute).Unix())
	fresh := c.Base + "/fresh/segments/" + id + "?st=" + tok
	cached := c.Base + "/cached/segments/" + id + "?st=" + tok

	// No checkpoint table yet; then checkpoints that overtake nothing.
	steps := []seed.Checkpoint{
		{},
		{Partition: "p-other", Name: "tasks-projection", SchemaVersion: 9, UpdatedAtMs: nowMs},
		{Partition: "p-ckpt", Name: "tasks-projection", SchemaVersion: 3, UpdatedAtMs: nowMs},
	}
	for i, ck := range steps {
		if ck.Partition != "" {
			if err := w.SetCheckpoint(ck); err != nil {
				t.Fatal(err)
			}
		}
		for _, u := range []string{fresh, cached, cached} { // the second cached one is a cache hit
			if r := do(t, "GET", u, nil); r.Status != 200 || string(r.Body) != string(body) {
				t.Fatalf("step %d: status %d: %s", i, r.Status, r.Body)
			}
		}
	}

	// The partition's backfill moves to schema version 4.
	if err := w.SetCheckpoint(seed.Checkpoint{Partition: "p-ckpt", Name: "tasks-projection",
		SchemaVersion: 4, State: "backfilling", UpdatedAtMs: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	expired := func(r response) {
		t.Helper()
		checkError(t, r, 404, "sync.segment_expired")
		var e errJSON
		json.Unmarshal(r.Body, &e)
		if !strings.Contains(e.Message, "overtaken by a backfill checkpoint") || e.RecommendedAction != "retryLater" {
			t.Errorf("body %s", r.Body)
		}
		if strings.Contains(string(r.Body), "p-ckpt") {
			t.Errorf("partition id leaked: %s", r.Body)
		}
	}
	expired(do(t, "GET", fresh, nil))

	// Behind the cache a grant may stand for up to record_ttl (a refusal
	// never rests on a cached record, a grant may): poll, bounded, and
	// accept only 200 until the switch.
	var last response
	took := waitFor(8*time.Second, func() bool {
		last = do(t, "GET", cached, nil)
		if last.Status != 200 && last.Status != 404 {
			t.Fatalf("cached: status %d: %s", last.Status, last.Body)
		}
		return last.Status == 404
	})
	if took < 0 {
		t.Fatalf("cached path still granted 8s after the checkpoint (record_ttl 2s): %d", last.Status)
	}
	t.Logf("cached path refused %v after the checkpoint", took)
	expired(last)
	for _, u := range []string{fresh, cached, cached} {
		expired(do(t, "GET", u, nil))
	}

	// The checkpoint table goes (a restore without it): grants resume.
	if err := w.Exec(`DROP TABLE sync_backfill_checkpoints`); err != nil {
		t.Fatal(err)
	}
	if r := do(t, "GET", fresh, nil); r.Status != 200 {
		t.Fatalf("after the table was dropped: status %d: %s", r.Status, r.Body)
	}
	if out := c.Output(); strings.Contains(out, "panic") {
		t.Errorf("caddy output has a panic:\n%s", out)
	}
}
