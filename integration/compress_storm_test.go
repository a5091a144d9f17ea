package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/segdata"
	"github.com/syncular/caddy-syncular/token"
)

// A storm on a cold edge: clients accepting gzip and zstd arrive
// together for a large segment; its variants are encoded as the disk
// tier's fill lands, and the clients follow them (no Content-Length,
// chunked) instead of getting identity. One store read; every body
// decodes to bytes hashing to the id.
func TestCompressedStormFollowsGrowingVariant(t *testing.T) {
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
	path := filepath.Join(t.TempDir(), "sync.db")
	id := seedStore(t, path, "wal", img)[0]
	e := startLarge(t, sqlStore(path), "disk "+filepath.Join(t.TempDir(), "disk"), newKey32(t))
	url := e.url(id)
	want := id[len("sha256:"):]

	type answer struct {
		coding    string
		length    int64 // -1: no Content-Length
		chunked   bool
		wire      int
		sum       string
		etag, err string
	}
	const clients = 24
	headers := []string{"gzip, deflate, br, zstd", "gzip", "zstd, gzip"}
	answers := make([]answer, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &answers[i]
			req, err := http.NewRequest("GET", url, nil)
			if err != nil {
				a.err = err.Error()
				return
			}
			req.Header.Set("Accept-Encoding", headers[i%len(headers)])
			<-start
			res, err := rawClient.Do(req)
			if err != nil {
				a.err = err.Error()
				return
			}
			defer res.Body.Close()
			body, err := io.ReadAll(res.Body)
			if err != nil || res.StatusCode != 200 {
				a.err = fmt.Sprintf("status %d, read err %v", res.StatusCode, err)
				return
			}
			a.coding, a.length, a.wire = res.Header.Get("Content-Encoding"), res.ContentLength, len(body)
			a.chunked = len(res.TransferEncoding) == 1 && res.TransferEncoding[0] == "chunked"
			a.etag = res.Header.Get("ETag")
			dec, err := decodeAs(a.coding, body)
			if err != nil {
				a.err = fmt.Sprintf("decoding %q: %v", a.coding, err)
				return
			}
			s := sha256.Sum256(dec)
			a.sum = hex.EncodeToString(s[:])
		}()
	}
	close(start)
	wg.Wait()

	coded, growing, wire := 0, 0, 0
	for i, a := range answers {
		if a.err != "" {
			t.Fatalf("client %d (%q): %s", i, headers[i%len(headers)], a.err)
		}
		if a.sum != want {
			t.Fatalf("client %d: a %q body decodes to bytes hashing to %s, not the id", i, a.coding, a.sum)
		}
		wire += a.wire
		if a.coding == "" {
			t.Logf("client %d (%q): identity", i, headers[i%len(headers)])
			continue
		}
		coded++
		if a.etag != `"`+id+"+"+a.coding+`"` {
			t.Fatalf("client %d: ETag %s for a %s answer", i, a.etag, a.coding)
		}
		if a.length < 0 {
			growing++
			if !a.chunked {
				t.Fatalf("client %d: no Content-Length and not chunked", i)
			}
		} else if int(a.length) != a.wire {
			t.Fatalf("client %d: Content-Length %d for %d bytes", i, a.length, a.wire)
		}
	}
	m := scrape(t, e.c)
	t.Logf("%d clients on a cold edge, %d-byte segment: %d coded (%d followed a growing variant), wire bytes %.3f x identity; store reads %v",
		clients, len(img), coded, growing, float64(wire)/float64(clients*len(img)), storeReads(m))
	if r := storeReads(m); r != 1 {
		t.Fatalf("%v store reads, want 1:\n%s", r, dumpSyncular(m))
	}
	// Before: every client of a cold storm got identity.
	if coded != clients || growing < clients/2 {
		t.Fatalf("%d of %d answers coded, %d followed a growing variant", coded, clients, growing)
	}
	if ratio := float64(wire) / float64(clients*len(img)); ratio > 0.6 {
		t.Fatalf("wire bytes %.3f x identity", ratio)
	}
	// Kept: a later request gets a complete variant file.
	r, err := rawGet("GET", url, map[string]string{"Accept-Encoding": "gzip"})
	if err != nil || r.Status != 200 || r.Header.Get("Content-Encoding") != "gzip" || r.Header.Get("Content-Length") == "" {
		t.Fatalf("after the storm: status %d, Content-Encoding %q, Content-Length %q (%v)", r.Status, r.Header.Get("Content-Encoding"), r.Header.Get("Content-Length"), err)
	}
	if dec, err := decodeAs("gzip", r.Body); err != nil || !bytes.Equal(dec, img) {
		t.Fatalf("after the storm: the kept gzip variant does not decode to the segment (%v)", err)
	}
}

// A small segment (memory tier) on a cold edge: the first request, which
// reads the identity bytes and starts the build, waits for the build
// (it ends well within store.WaitBound: a tenth of the identity bytes at
// 10 Mbit/s) and gets the variant, not identity.
func TestCompressedSmallWaitsForItsBuild(t *testing.T) {
	rows := segdata.RowsSegment(8000) // ~4 MB: the wait is bounded at ~330 ms
	dbPath := t.TempDir() + "/sync.db"
	id := seedStore(t, dbPath, "wal", rows)[0]
	segKey := randomKey(t)
	site := strings.NewReplacer("STORE_PATH", dbPath, "PORT2", strconv.Itoa(freePort(t))).Replace(compressSites)
	c := startCaddy(t, site, "SEG_KEY="+segKey)
	tok := token.Sign([]byte(segKey), id, hardDigest, hardAud, time.Now().Add(time.Hour).Unix())
	u := c.Base + "/segments/" + id + "?st=" + tok
	for i, coding := range []string{"gzip", "zstd"} {
		r, err := rawGet("GET", u, map[string]string{"Accept-Encoding": coding})
		if err != nil || r.Status != 200 {
			t.Fatalf("%s: status %d, %v", coding, r.Status, err)
		}
		if ce := r.Header.Get("Content-Encoding"); ce != coding {
			t.Fatalf("request %d accepting %s (its build started by it or by nobody before): Content-Encoding %q", i, coding, ce)
		}
		if cl := r.Header.Get("Content-Length"); cl != strconv.Itoa(len(r.Body)) {
			t.Fatalf("Content-Length %q for %d bytes", cl, len(r.Body))
		}
		got, err := decodeAs(coding, r.Body)
		if err != nil || !bytes.Equal(got, rows) {
			t.Fatalf("%s: does not decode to the segment (%v)", coding, err)
		}
	}
	if reads := scrape(t, c)[`caddy_syncular_variants_total{result="made"}`]; reads != 2 {
		t.Fatalf("variants made %v, want 2", reads)
	}
}
