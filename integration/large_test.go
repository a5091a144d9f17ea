package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/token"
)

// Large segments: segments above max_entry are filled once into
// the disk tier (one store read however many clients), verified, and
// served from the file, whole, by Range, HEAD and 304; bytes that do not
// match their id are never answered completely; memory stays flat with
// many concurrent downloads; the tier survives a restart, evicts under
// readers, and with disk_best_effort an unusable directory only costs a
// warning (without it the config fails: testdata/validate).

const largeSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log {
		output file {{DIR}}/server.log
	}
}

http://127.0.0.1:{{PORT}} {
	log {
		output file {{DIR}}/access.log
		format filter {
			fields {
				request>uri query {
					delete st
				}
			}
		}
	}
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		STORE
		untokened reject
		cache {
			DISK
		}
	}
	respond 404
}
`

const largeSize = 64 << 20

// largeEdge is a running edge and how to sign for it.
type largeEdge struct {
	c   *caddyProc
	key []byte
}

func startLarge(t *testing.T, store, disk string, key []byte, env ...string) largeEdge {
	t.Helper()
	site := strings.NewReplacer("STORE", store, "DISK", disk).Replace(largeSite)
	env = append(env, "SEG_KEY=hex:"+hex.EncodeToString(key))
	return largeEdge{c: startCaddy(t, site, env...), key: key}
}

func (e largeEdge) url(id string) string {
	tok := token.Sign(e.key, id, hardDigest, hardAud, time.Now().Add(time.Hour).Unix())
	return e.c.Base + "/segments/" + id + "?st=" + tok
}

func newKey32(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// sqlStore is the store line of a SQLite edge.
func sqlStore(path string) string { return "store sqlite " + path }

// s3Store is the store block of an S3 proxy edge (credentials from env).
func s3Store(srv *s3test.Server) string {
	return `store s3 {
			bucket segs
			region us-east-1
			endpoint ` + srv.Endpoint + `
			access_key_id {env.S3_KEY}
			secret_access_key {env.S3_SECRET}
		}
		delivery proxy`
}

// bigClient downloads in parallel without reusing a bounded idle pool.
var bigClient = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// fetch GETs url and returns the status, the SHA-256 id of the body and
// its length; err is a transport or body error (a cut connection).
func fetch(url string, hdr map[string]string) (status int, id string, n int64, res *http.Response, err error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", 0, nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err = bigClient.Do(req)
	if err != nil {
		return 0, "", 0, nil, err
	}
	defer res.Body.Close()
	h := sha256.New()
	n, err = io.Copy(h, res.Body)
	return res.StatusCode, "sha256:" + hex.EncodeToString(h.Sum(nil)), n, res, err
}

// parallelFetch runs n concurrent whole downloads of url and fails on any
// answer that is not 200 with the bytes of id.
func parallelFetch(t *testing.T, n int, url, id string) {
	t.Helper()
	parallelFetchN(t, n, url, id, largeSize)
}

// parallelFetchN is parallelFetch for a segment of size bytes.
func parallelFetchN(t *testing.T, n int, url, id string, size int64) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, got, m, _, err := fetch(url, nil)
			if err == nil && (st != 200 || got != id || m != size) {
				err = fmt.Errorf("status %d, %d bytes, id %s", st, m, got)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// statusKB reads a "VmXXX:" line of /proc/<pid>/status in KiB.
func (c *caddyProc) statusKB(t testing.TB, field string) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.pid()))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return n
		}
	}
	t.Fatalf("no %s", field)
	return 0
}

// checkRangeHeadConditional checks a Range, HEAD and If-None-Match answer
// for a segment whose bytes are b.
func checkRangeHeadConditional(t *testing.T, url string, b []byte) {
	t.Helper()
	r := do(t, "GET", url, map[string]string{"Range": "bytes=1000000-1999999"})
	if r.Status != 206 || !bytes.Equal(r.Body, b[1000000:2000000]) {
		t.Fatalf("range: %d, %d bytes", r.Status, len(r.Body))
	}
	r = do(t, "GET", url, map[string]string{"Range": "bytes=-100"})
	if r.Status != 206 || !bytes.Equal(r.Body, b[len(b)-100:]) {
		t.Fatalf("suffix range: %d, %d bytes", r.Status, len(r.Body))
	}
	r = do(t, "HEAD", url, nil)
	if r.Status != 200 || r.Header.Get("Content-Length") != strconv.Itoa(len(b)) || len(r.Body) != 0 {
		t.Fatalf("head: %d %v", r.Status, r.Header)
	}
	r = do(t, "GET", url, map[string]string{"If-None-Match": r.Header.Get("ETag")})
	if r.Status != 304 || len(r.Body) != 0 {
		t.Fatalf("conditional: %d", r.Status)
	}
}

// storeReads is how often the edge read a segment's bytes from the store:
// disk tier fills (successful or not) plus uncached streams.
func storeReads(m map[string]float64) float64 {
	return m["caddy_syncular_disk_fills_total"] + m["caddy_syncular_disk_fill_errors_total"] +
		m["caddy_syncular_cache_pass_through_total"]
}

// TestLargeSQLite: a 64 MiB segment in a SQLite store, 30 concurrent
// downloads, one store read, bounded memory, Range/HEAD/304 from the disk
// tier, and a restart on the same directory serving with no store read.
func TestLargeSQLite(t *testing.T) {
	big := pseudoRandom(largeSize, 41)
	path := filepath.Join(t.TempDir(), "sync.db")
	id := seedStore(t, path, "wal", big)[0]
	diskDir := filepath.Join(t.TempDir(), "disk")
	key := newKey32(t)
	e := startLarge(t, sqlStore(path), "disk "+diskDir, key)

	time.Sleep(200 * time.Millisecond)
	idle := e.c.statusKB(t, "VmRSS")
	parallelFetch(t, 30, e.url(id), id)
	hwm := e.c.statusKB(t, "VmHWM")
	m := scrape(t, e.c)
	t.Logf("30 concurrent 64 MiB downloads (SQLite, disk tier): idle RSS %d MiB, peak RSS %d MiB, %d fds; store reads %v, disk fills %v, followers %v, hits %v",
		idle>>10, hwm>>10, e.c.fdCount(t), storeReads(m), m["caddy_syncular_disk_fills_total"],
		m["caddy_syncular_disk_followers_total"], m["caddy_syncular_disk_hits_total"])
	if r := storeReads(m); r != 1 {
		t.Fatalf("30 concurrent downloads cost %v store reads, want 1:\n%s", r, dumpSyncular(m))
	}
	// Old code: 30 x 64 MiB held at once. Bound: idle + the 64 MiB
	// memory cache budget + 64 MiB of slack for buffers and the runtime.
	if limit := idle + (64+64)<<10; hwm > limit {
		t.Fatalf("peak RSS %d KiB over idle %d KiB + 128 MiB", hwm, idle)
	}

	checkRangeHeadConditional(t, e.url(id), big)
	m = scrape(t, e.c)
	if r := storeReads(m); r != 1 {
		t.Fatalf("Range/HEAD/304 read the store: %v reads", r)
	}

	// Restart on the same directory: the file is re-hashed, not re-read
	// from the store.
	e.c.Stop()
	e = startLarge(t, sqlStore(path), "disk "+diskDir, key)
	st, got, n, _, err := fetch(e.url(id), nil)
	if err != nil || st != 200 || got != id || n != largeSize {
		t.Fatalf("after restart: %d, %d bytes, %v", st, n, err)
	}
	m = scrape(t, e.c)
	if r := storeReads(m); r != 0 || m["caddy_syncular_disk_hits_total"] != 1 {
		t.Fatalf("after restart: %v store reads (want 0):\n%s", r, dumpSyncular(m))
	}
}

// TestLargeS3Proxy: the same from versitygw in proxy delivery; the store
// reads are counted in versitygw's access log.
func TestLargeS3Proxy(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	big := pseudoRandom(largeSize, 42)
	id := s3Segment(t, srv, big)
	objKey := s3test.ObjectKey("", id)
	diskDir := filepath.Join(t.TempDir(), "disk")
	key := newKey32(t)
	env := []string{"S3_KEY=" + srv.AccessKey, "S3_SECRET=" + srv.SecretKey}
	e := startLarge(t, s3Store(srv), "disk "+diskDir, key, env...)

	time.Sleep(200 * time.Millisecond)
	idle := e.c.statusKB(t, "VmRSS")
	parallelFetch(t, 30, e.url(id), id)
	hwm := e.c.statusKB(t, "VmHWM")
	gets := srv.CountRequests(t, "s3_GetObject", objKey)
	t.Logf("30 concurrent 64 MiB downloads (S3 proxy, disk tier): idle RSS %d MiB, peak RSS %d MiB; GetObject of the bytes: %d",
		idle>>10, hwm>>10, gets)
	if gets != 1 {
		t.Fatalf("30 concurrent downloads made %d GETs of the object, want 1", gets)
	}
	if limit := idle + (64+64)<<10; hwm > limit {
		t.Fatalf("peak RSS %d KiB over idle %d KiB + 128 MiB", hwm, idle)
	}
	checkRangeHeadConditional(t, e.url(id), big)
	if n := srv.CountRequests(t, "s3_GetObject", objKey); n != 1 {
		t.Fatalf("Range/HEAD/304 made %d GETs of the object in all, want 1", n)
	}

	e.c.Stop()
	e = startLarge(t, s3Store(srv), "disk "+diskDir, key, env...)
	st, got, n, _, err := fetch(e.url(id), nil)
	if err != nil || st != 200 || got != id || n != largeSize {
		t.Fatalf("after restart: %d, %d bytes, %v", st, n, err)
	}
	if n := srv.CountRequests(t, "s3_GetObject", objKey); n != 1 {
		t.Fatalf("after restart: %d GETs of the object in all, want still 1", n)
	}
}

// neverComplete downloads url and fails the test if the answer is a clean
// 200 with every byte: a corrupt segment must end in a store fault before
// the headers or in a cut connection short of Content-Length.
func neverComplete(t *testing.T, url string, size int) (aborted bool) {
	t.Helper()
	st, _, n, res, err := fetch(url, nil)
	switch {
	case err == nil && st == 503:
		return false
	case st == 200 && err != nil && n < int64(size):
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Logf("cut with %v", err)
		}
		return true
	}
	cl := ""
	if res != nil {
		cl = res.Header.Get("Content-Length")
	}
	t.Fatalf("corrupt segment answered %d with %d bytes (Content-Length %s), err %v", st, n, cl, err)
	return false
}

// TestLargeCorrupt: a large segment whose stored bytes do not hash to its
// id is never answered completely, from SQLite or S3, with the disk tier
// or without; the fault is logged as a warning, and no log holds a token.
func TestLargeCorrupt(t *testing.T) {
	const size = 24 << 20
	good := pseudoRandom(size, 43)
	path := filepath.Join(t.TempDir(), "sync.db")
	id := seedStore(t, path, "wal", good)[0]
	w, err := seed.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	// Same length, other bytes.
	if err := w.Exec(`UPDATE sync_segments SET bytes = zeroblob(length(bytes))`); err != nil {
		t.Fatal(err)
	}
	w.Close()

	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	s3id := s3Segment(t, srv, good)
	bad := bytes.Clone(good)
	bad[size-5] ^= 0xff
	rec := headRecord(t, srv, s3id)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in := &s3.PutObjectInput{
		Bucket: aws.String("segs"), Key: aws.String(s3test.ObjectKey("", s3id)),
		Body: bytes.NewReader(bad), ContentLength: aws.Int64(int64(size)),
	}
	if rec != "" { // the record travels in the object's header: keep it
		in.Metadata = map[string]string{"syncular-record": rec}
	}
	if _, err := srv.Client().PutObject(ctx, in); err != nil {
		t.Fatal(err)
	}
	s3env := []string{"S3_KEY=" + srv.AccessKey, "S3_SECRET=" + srv.SecretKey}

	for _, tc := range []struct {
		name, store, disk, id string
		env                   []string
	}{
		{"sqlite, disk tier", sqlStore(path), "disk " + filepath.Join(t.TempDir(), "d"), id, nil},
		{"sqlite, no disk tier", sqlStore(path), "disk off", id, nil},
		{"s3 proxy, disk tier", s3Store(srv), "disk " + filepath.Join(t.TempDir(), "d"), s3id, s3env},
		{"s3 proxy, no disk tier", s3Store(srv), "disk off", s3id, s3env},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startLarge(t, tc.store, tc.disk, newKey32(t), tc.env...)
			var tokens []string
			aborted := 0
			for range 3 {
				u := e.url(tc.id)
				tokens = append(tokens, u[strings.Index(u, "st=")+3:])
				if neverComplete(t, u, size) {
					aborted++
				}
			}
			if tc.disk == "disk off" && aborted == 0 {
				t.Fatal("streamed from the store, the corrupt body was never cut (expected a mid-body abort)")
			}
			time.Sleep(300 * time.Millisecond) // access log lines land
			logs := e.c.Output()
			for _, f := range []string{"server.log", "access.log"} {
				b, _ := os.ReadFile(filepath.Join(e.c.Dir(), f))
				logs += string(b)
			}
			if !strings.Contains(logs, "do not match their id") && !strings.Contains(logs, "fill failed") {
				t.Fatalf("no store-fault warning in the logs:\n%s", logs)
			}
			if strings.Contains(logs, "panic") {
				t.Fatalf("an aborted response logged a panic:\n%s", logs)
			}
			for _, tok := range tokens {
				if strings.Contains(logs, tok) {
					t.Fatal("a log holds the st token")
				}
			}
			if strings.Contains(logs, "p1") && strings.Contains(logs, `"partition"`) {
				t.Fatal("a log names the partition")
			}
		})
	}
}

// headRecord is the record header of the object of id.
func headRecord(t *testing.T, srv *s3test.Server, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := srv.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("segs"), Key: aws.String(s3test.ObjectKey("", id))})
	if err != nil {
		t.Fatal(err)
	}
	return out.Metadata["syncular-record"]
}

// TestLargeEvictionUnderReader: with room for one segment, filling a
// second evicts the first while a slow client still reads it; that client
// gets every byte, and the first segment is filled again on its next use.
func TestLargeEvictionUnderReader(t *testing.T) {
	const size = 24 << 20
	a, b := pseudoRandom(size, 44), pseudoRandom(size, 45)
	path := filepath.Join(t.TempDir(), "sync.db")
	ids := seedStore(t, path, "wal", a, b)
	e := startLarge(t, sqlStore(path), "disk "+filepath.Join(t.TempDir(), "d")+"\n\t\t\tdisk_max_bytes 40MiB", newKey32(t))

	// Fill a, then hold a download of it open, half read.
	if st, got, _, _, err := fetch(e.url(ids[0]), nil); err != nil || st != 200 || got != ids[0] {
		t.Fatalf("first fill: %d %v", st, err)
	}
	res, err := bigClient.Get(e.url(ids[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, res.Body, size/2); err != nil {
		t.Fatal(err)
	}
	// b needs a's room.
	if st, got, _, _, err := fetch(e.url(ids[1]), nil); err != nil || st != 200 || got != ids[1] {
		t.Fatalf("second segment: %d %v", st, err)
	}
	m := scrape(t, e.c)
	if m["caddy_syncular_disk_evictions_total"] != 1 || m["caddy_syncular_disk_files"] != 1 {
		t.Fatalf("after filling the second segment:\n%s", dumpSyncular(m))
	}
	if n, err := io.Copy(h, res.Body); err != nil || n != size-size/2 || "sha256:"+hex.EncodeToString(h.Sum(nil)) != ids[0] {
		t.Fatalf("the reader of the evicted file: %d more bytes, %v", n, err)
	}
	if st, got, _, _, err := fetch(e.url(ids[0]), nil); err != nil || st != 200 || got != ids[0] {
		t.Fatalf("evicted segment again: %d %v", st, err)
	}
	if m := scrape(t, e.c); m["caddy_syncular_disk_fills_total"] != 3 {
		t.Fatalf("want 3 fills (a, b, a again):\n%s", dumpSyncular(m))
	}
}

// TestLargeUnwritableDiskDirectory: with disk_best_effort, a disk
// directory that cannot exist (under a regular file) still serves every
// request, streamed from the store and verified, with a warning and a
// bypass metric.
func TestLargeUnwritableDiskDirectory(t *testing.T) {
	const size = 24 << 20
	big := pseudoRandom(size, 46)
	path := filepath.Join(t.TempDir(), "sync.db")
	id := seedStore(t, path, "wal", big)[0]
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startLarge(t, sqlStore(path), "disk "+filepath.Join(file, "segments")+"\n\t\t\tdisk_best_effort", newKey32(t))
	for range 2 {
		st, got, n, _, err := fetch(e.url(id), nil)
		if err != nil || st != 200 || got != id || n != size {
			t.Fatalf("unwritable disk directory: %d, %d bytes, %v", st, n, err)
		}
	}
	checkRangeHeadConditional(t, e.url(id), big)
	m := scrape(t, e.c)
	if m[`caddy_syncular_disk_bypasses_total{reason="unavailable"}`] < 2 || m["caddy_syncular_cache_pass_through_total"] < 2 {
		t.Fatalf("metrics:\n%s", dumpSyncular(m))
	}
	logs := e.c.Output()
	if b, err := os.ReadFile(filepath.Join(e.c.Dir(), "server.log")); err == nil {
		logs += string(b)
	}
	if !strings.Contains(logs, "disk cache directory unusable") {
		t.Fatalf("no warning about the directory:\n%s", logs)
	}
}

// TestLargeWithoutDiskTier: with the disk tier off, each download streams
// from the store (SQLite in 1 MiB chunks, S3 as the GET body), hashed on
// the way: 30 concurrent 64 MiB downloads still keep memory bounded (the
// old SQLite serve held each download's whole blob).
func TestLargeWithoutDiskTier(t *testing.T) {
	big := pseudoRandom(largeSize, 47)
	t.Run("sqlite", func(t *testing.T) {
		// 24 MiB: a chunked SQLite stream re-walks the blob's overflow
		// pages per chunk, so its CPU cost grows with the square of the
		// size (about 3.7 s per 64 MiB download, 0.5 s per 24 MiB);
		// 30 x 24 MiB still held whole would be 720 MiB.
		big := big[:24<<20]
		want := sha256.Sum256(big)
		path := filepath.Join(t.TempDir(), "sync.db")
		id := seedStore(t, path, "wal", big)[0]
		if id != "sha256:"+hex.EncodeToString(want[:]) {
			t.Fatal("seeded id is not the bytes' hash")
		}
		e := startLarge(t, sqlStore(path), "disk off", newKey32(t))
		time.Sleep(200 * time.Millisecond)
		idle := e.c.statusKB(t, "VmRSS")
		parallelFetchN(t, 30, e.url(id), id, int64(len(big)))
		hwm := e.c.statusKB(t, "VmHWM")
		m := scrape(t, e.c)
		t.Logf("30 concurrent 24 MiB downloads (SQLite, disk off): idle RSS %d MiB, peak RSS %d MiB; store reads %v",
			idle>>10, hwm>>10, storeReads(m))
		if r := storeReads(m); r != 30 {
			t.Fatalf("%v store reads, want one per download (30)", r)
		}
		if limit := idle + (64+64)<<10; hwm > limit {
			t.Fatalf("peak RSS %d KiB over idle %d KiB + 128 MiB", hwm, idle)
		}
	})
	t.Run("s3 proxy", func(t *testing.T) {
		srv := s3test.Start(t)
		srv.CreateBucket(t, "segs")
		id := s3Segment(t, srv, big)
		e := startLarge(t, s3Store(srv), "disk off", newKey32(t), "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
		time.Sleep(200 * time.Millisecond)
		idle := e.c.statusKB(t, "VmRSS")
		parallelFetch(t, 30, e.url(id), id)
		hwm := e.c.statusKB(t, "VmHWM")
		gets := srv.CountRequests(t, "s3_GetObject", s3test.ObjectKey("", id))
		t.Logf("30 concurrent 64 MiB downloads (S3 proxy, disk off): idle RSS %d MiB, peak RSS %d MiB; GetObject of the bytes: %d",
			idle>>10, hwm>>10, gets)
		if gets != 30 {
			t.Fatalf("%d GETs of the object, want one per download (30)", gets)
		}
		if limit := idle + (64+64)<<10; hwm > limit {
			t.Fatalf("peak RSS %d KiB over idle %d KiB + 128 MiB", hwm, idle)
		}
	})
}
