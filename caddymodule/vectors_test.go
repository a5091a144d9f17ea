package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/testkit"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// vectorsDir is testkit.VectorsDir: the protocol vectors, or a failed test.
func vectorsDir(t testing.TB) string { return testkit.VectorsDir(t) }

// gen3Vectors is segments-gen3.json (testkit.Gen3).
type gen3Vectors = testkit.Gen3

func loadGen3(t testing.TB) (gen3Vectors, string) {
	t.Helper()
	dir := vectorsDir(t)
	v := testkit.LoadGen3(t)
	// The store is opened read-only in WAL-capable mode: work on a copy.
	db, err := os.ReadFile(filepath.Join(dir, "segments-gen3.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "segments-gen3.sqlite")
	if err := os.WriteFile(path, db, 0o644); err != nil {
		t.Fatal(err)
	}
	return v, path
}

// TestVectorGen3 drives every case of segments-gen3.json through the
// handler against the vector SQLite file, with the vectors' clock.
func TestVectorGen3(t *testing.T) {
	v, path := loadGen3(t)
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if v.Audience.Kind != "hmac-sha256-hex" {
		t.Fatalf("unexpected audience kind %q", v.Audience.Kind)
	}
	// The vectors' keys are shorter than provision accepts.
	h := newTestHandler(t, st, withWeakKeys(), withClock(func() time.Time { return time.UnixMilli(v.NowMs) }), func(h *Handler) {
		h.Keys = []string{v.Keys.Current, v.Keys.Previous}
		h.Audience = &AudienceConfig{Kind: "hmac_sha256", Key: v.Audience.Key}
	})
	ran := 0
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			target := c.Path
			if c.Token != nil {
				target += "?st=" + *c.Token
			}
			rec, _ := serve(t, h, "GET", target, nil)
			switch status := c.Expect.Status.(type) {
			case string:
				if status != "next-handler" {
					t.Fatalf("unknown expectation %q", status)
				}
				if rec.Code != 299 || rec.Header().Get("X-Next") != "reached" {
					t.Fatalf("did not reach the next handler: %d %s", rec.Code, rec.Body.String())
				}
			case float64:
				if status == 200 {
					seg, ok := v.Segments[c.Expect.Segment]
					if !ok {
						t.Fatalf("unknown segment %q", c.Expect.Segment)
					}
					if rec.Code != 200 {
						t.Fatalf("status %d, want 200: %s", rec.Code, rec.Body.String())
					}
					body, _ := io.ReadAll(rec.Body)
					sum := sha256.Sum256(body)
					if hex.EncodeToString(sum[:]) != seg.BytesSha256 || len(body) != seg.ByteLength {
						t.Fatalf("body is not segment %s (%d bytes)", c.Expect.Segment, len(body))
					}
					if rec.Header().Get("ETag") != `"`+seg.SegmentID+`"` {
						t.Fatalf("ETag %q", rec.Header().Get("ETag"))
					}
					return
				}
				b := wantError(t, rec, int(status), c.Expect.Code)
				for _, p := range []string{"p1", "p2", "p3-unregistered", v.Keys.Current, v.Audience.Key} {
					if strings.Contains(b.Message, p) {
						t.Fatalf("message leaks %q: %s", p, b.Message)
					}
				}
			default:
				t.Fatalf("unknown expectation %v", c.Expect.Status)
			}
		})
		ran++
	}
	t.Logf("ran %d gen3 cases", ran)
}
