package integration

import (
	"bytes"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/segdata"
)

// Compressed variants of large segments: a segment above
// max_entry lives in the disk tier, and so do its variants, built once in
// the background from the verified identity file, or while it is filled;
// requests get identity while neither exists.
func TestCompressedLargeDiskTier(t *testing.T) {
	var img []byte
	for n := 100_000; len(img) < 16<<20 && n <= 1_600_000; n *= 2 {
		var err error
		if img, err = segdata.SQLiteImage(t.TempDir(), n); err != nil {
			t.Fatal(err)
		}
	}
	if len(img) < 16<<20 {
		t.Fatalf("SQLite image of %d bytes, want at least 16 MiB", len(img))
	}
	t.Logf("SQLite image segment: %d bytes", len(img))
	path := filepath.Join(t.TempDir(), "sync.db")
	id := seedStore(t, path, "wal", img)[0]
	e := startLarge(t, sqlStore(path), "disk "+filepath.Join(t.TempDir(), "disk"), newKey32(t))

	get := func(t *testing.T, hdr map[string]string) response {
		t.Helper()
		r, err := rawGet("GET", e.url(id), hdr)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != 200 && r.Status != 206 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		// Only a variant followed while it is encoded has no length.
		if cl := r.Header.Get("Content-Length"); cl != strconv.Itoa(len(r.Body)) && (cl != "" || r.Header.Get("Content-Encoding") == "") {
			t.Fatalf("Content-Length %q for a %d-byte body", cl, len(r.Body))
		}
		return r
	}
	check := func(t *testing.T, r response) {
		t.Helper()
		got, err := decodeAs(r.Header.Get("Content-Encoding"), r.Body)
		if err != nil {
			t.Fatalf("decoding %q: %v", r.Header.Get("Content-Encoding"), err)
		}
		if !bytes.Equal(got, img) {
			t.Fatalf("%q body decodes to %d bytes that are not the %d-byte segment", r.Header.Get("Content-Encoding"), len(got), len(img))
		}
		if !hasVary(r.Header) {
			t.Fatalf("no Vary: Accept-Encoding (%q)", r.Header.Values("Vary"))
		}
		want := `"` + id + `"`
		if ce := r.Header.Get("Content-Encoding"); ce != "" {
			want = `"` + id + "+" + ce + `"`
			if len(r.Body) >= len(img)*9/10 {
				t.Fatalf("%s answer of %d bytes for a %d-byte segment", ce, len(r.Body), len(img))
			}
		}
		if r.Header.Get("ETag") != want {
			t.Fatalf("ETag %q, want %s", r.Header.Get("ETag"), want)
		}
	}
	await := func(t *testing.T, hdr map[string]string, coding string) {
		t.Helper()
		var last response
		if waitFor(60*time.Second, func() bool {
			last = get(t, hdr)
			check(t, last)
			return last.Header.Get("Content-Encoding") == coding
		}) < 0 {
			t.Fatalf("no %s answer within 60s (last Content-Encoding %q)", coding, last.Header.Get("Content-Encoding"))
		}
	}
	gz := map[string]string{"Accept-Encoding": "gzip"}
	browser := map[string]string{"Accept-Encoding": "gzip, deflate, br, zstd"}

	// The first answer fills the disk tier and follows the gzip variant
	// encoded as the fill lands (identity if the fill ended first).
	r := get(t, gz)
	check(t, r)
	if ce := r.Header.Get("Content-Encoding"); ce != "" && ce != "gzip" {
		t.Fatalf("first answer coded %q", ce)
	}
	await(t, gz, "gzip")
	await(t, browser, "zstd")
	for range 3 { // held now: every answer is the variant
		if r := get(t, gz); r.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("a later gzip request got %q", r.Header.Get("Content-Encoding"))
		} else {
			check(t, r)
		}
	}
	r = get(t, nil)
	check(t, r)
	if ce := r.Header.Get("Content-Encoding"); ce != "" {
		t.Fatalf("no Accept-Encoding: Content-Encoding %q", ce)
	}
	rg := map[string]string{"Accept-Encoding": "gzip, zstd", "Range": "bytes=100-1099"}
	r = get(t, rg)
	if r.Status != 206 || r.Header.Get("Content-Encoding") != "" || !bytes.Equal(r.Body, img[100:1100]) {
		t.Fatalf("Range: status %d, Content-Encoding %q, %d bytes (identity slice %v)", r.Status, r.Header.Get("Content-Encoding"), len(r.Body), bytes.Equal(r.Body, img[100:1100]))
	}
	m := scrape(t, e.c)
	if made := m[`caddy_syncular_variants_total{result="made"}`]; made != 2 {
		t.Fatalf("variants made = %v, want 2 (one gzip, one zstd build)\n%s", made, dumpSyncular(m))
	}
	if r := storeReads(m); r != 1 {
		t.Fatalf("%v store reads, want 1 (variants are built from the disk file)\n%s", r, dumpSyncular(m))
	}
}
