package caddymodule

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// TestServeExpiryBoundary: through ServeHTTP, a publication is served
// while expiresAtMs > now, to the millisecond: at expiresAtMs − 1 ms it is
// granted, at expiresAtMs and + 1 ms it is sync.segment_expired, alone
// and next to live publications the token does not match. Next to a
// live publication it does match, the grant moves to that one.
func TestServeExpiryBoundary(t *testing.T) {
	exp := testNow.Add(90 * time.Second)
	later := exp.Add(time.Hour)
	fs := newFakeStore()
	alone := fs.add([]byte("alone"), pub("p1", digestA, exp))
	otherPartition := fs.add([]byte("other partition"), pub("p1", digestA, exp), pub("p2", digestA, later))
	otherDigest := fs.add([]byte("other digest"), pub("p1", digestA, exp), pub("p1", digestB, later))
	matching := fs.add([]byte("matching"), pub("p1", digestA, exp), pub("p1", digestA, exp.Add(time.Millisecond)))

	for _, c := range []struct {
		name   string
		seg    string
		offset time.Duration // now − expiresAtMs
		status int
	}{
		{"alone -1ms", alone, -time.Millisecond, 200},
		{"alone at expiry", alone, 0, 404},
		{"alone +1ms", alone, time.Millisecond, 404},
		{"next to another partition -1ms", otherPartition, -time.Millisecond, 200},
		{"next to another partition at expiry", otherPartition, 0, 404},
		{"next to another partition +1ms", otherPartition, time.Millisecond, 404},
		{"next to another digest -1ms", otherDigest, -time.Millisecond, 200},
		{"next to another digest at expiry", otherDigest, 0, 404},
		{"next to another digest +1ms", otherDigest, time.Millisecond, 404},
		{"next to a matching one at expiry", matching, 0, 200},
		{"next to a matching one +1ms", matching, time.Millisecond, 404},
	} {
		t.Run(c.name, func(t *testing.T) {
			now := exp.Add(c.offset)
			h := newTestHandler(t, fs, withClock(func() time.Time { return now }))
			url := "/segments/" + c.seg + "?st=" + mintToken(c.seg, digestA, "aud:p1", later.Add(time.Hour))
			rec, _ := serve(t, h, "GET", url, nil)
			if c.status == 200 {
				if rec.Code != 200 {
					t.Fatalf("status %d at expiresAtMs%+dms: %s", rec.Code, c.offset.Milliseconds(), rec.Body.String())
				}
				// The grant ends within a second: max-age is 0.
				if cc := rec.Header().Get("Cache-Control"); !strings.Contains(cc, "max-age=0") {
					t.Errorf("Cache-Control %q: the grant outlives the publication", cc)
				}
				return
			}
			b := wantError(t, rec, 404, "sync.segment_expired")
			if b.Message != "segment expired" {
				t.Errorf("message %q", b.Message)
			}
		})
	}
}

// TestServeCheckpointSQLite: through ServeHTTP on a real SQLite store, a
// backfill checkpoint at a later schema version, written while the store
// is open, turns a granted publication into sync.segment_expired; one of
// another partition changes nothing.
func TestServeCheckpointSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segments.sqlite")
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p := pub("p1", digestA, testNow.Add(time.Hour))
	p.SchemaVersion = 4
	id, err := w.Put(seed.SegmentInput{Bytes: []byte("backfilled"), Publication: p})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := newTestHandler(t, st, nil)
	url := "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))

	for i, c := range []seed.Checkpoint{
		{}, // none yet
		{Partition: "p2", Name: "tasks-projection", SchemaVersion: 9},
		{Partition: "p1", Name: "tasks-projection", SchemaVersion: 4},
	} {
		if c.Partition != "" {
			if err := w.SetCheckpoint(c); err != nil {
				t.Fatal(err)
			}
		}
		if rec, _ := serve(t, h, "GET", url, nil); rec.Code != 200 {
			t.Fatalf("step %d: status %d: %s", i, rec.Code, rec.Body.String())
		}
	}
	if err := w.SetCheckpoint(seed.Checkpoint{Partition: "p1", Name: "tasks-projection", SchemaVersion: 5, UpdatedAtMs: testNow.UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	rec, repl := serve(t, h, "GET", url, nil)
	b := wantError(t, rec, 404, "sync.segment_expired")
	if b.Message != "segment expired: overtaken by a backfill checkpoint" {
		t.Errorf("message %q", b.Message)
	}
	if r, _ := repl.GetString("http.syncular.reason"); !strings.Contains(r, "overtaken") {
		t.Errorf("reason placeholder %q", r)
	}
	if strings.Contains(rec.Body.String(), "p1") {
		t.Errorf("body leaks the partition id: %s", rec.Body.String())
	}
}
