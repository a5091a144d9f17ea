package caddymodule

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
)

func TestUnmarshalCache(t *testing.T) {
	wrap := func(block string) string {
		return "syncular_segments {\n key k\n audience template a:{partition}\n store sqlite db\n" + block + "\n}"
	}
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(wrap(`cache {
		max_bytes 128MiB
		max_entry 512KiB
		record_ttl 500ms
		max_records 42
	}`))); err != nil {
		t.Fatal(err)
	}
	c := h.Cache
	if c == nil || *c.MaxBytes != 128<<20 || *c.MaxEntry != 512<<10 || *c.RecordTTL != caddy.Duration(500*time.Millisecond) || *c.MaxRecords != 42 {
		t.Fatalf("parsed %+v", c)
	}

	h = new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(wrap("cache {\n max_bytes 0\n record_ttl 0\n}"))); err != nil {
		t.Fatal(err)
	}
	o := h.Cache.options(time.Second, time.Now)
	if o.MaxBytes != 0 || o.RecordTTL != 0 || o.MaxEntry != store.DefaultMaxEntry || o.MaxRecords != store.DefaultMaxRecords || o.Timeout != time.Second {
		t.Fatalf("explicit zeros: %+v", o)
	}
	o = (*CacheConfig)(nil).options(3*time.Second, time.Now)
	if o.MaxBytes != 64<<20 || o.MaxEntry != 8<<20 || o.RecordTTL != 2*time.Second || o.MaxRecords != 10000 || o.Timeout != 3*time.Second {
		t.Fatalf("defaults: %+v", o)
	}

	for name, block := range map[string]string{
		"stray arg":      "cache on {\n}",
		"unknown":        "cache {\n max_size 1MiB\n}",
		"repeated":       "cache {\n max_bytes 1MiB\n max_bytes 2MiB\n}",
		"bad size":       "cache {\n max_bytes lots\n}",
		"negative size":  "cache {\n max_entry -1\n}",
		"missing size":   "cache {\n max_bytes\n}",
		"extra size":     "cache {\n max_bytes 1MiB 2MiB\n}",
		"bad duration":   "cache {\n record_ttl soon\n}",
		"neg duration":   "cache {\n record_ttl -1s\n}",
		"bad records":    "cache {\n max_records -3\n}",
		"cache repeated": "cache {\n}\ncache {\n}",
	} {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(wrap(block))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestServeStormCoalesced: a burst of requests for one uncached segment
// through the handler reads the record once and the bytes once.
func TestServeStormCoalesced(t *testing.T) {
	fs := newFakeStore()
	fs.delay = 300 * time.Millisecond
	body := bytes.Repeat([]byte("storm"), 50_000)
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, nil, nil)
	h.setStore(store.NewCached(fs, h.Cache.options(time.Duration(h.StoreTimeout), h.now)))
	target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))

	const n = 40
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, _ := serve(t, h, http.MethodGet, target, nil)
			if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), body) {
				t.Errorf("status %d, %d bytes", rec.Code, rec.Body.Len())
			}
		}()
	}
	wg.Wait()
	if l, o := fs.counts(); l != 1 || o != 1 {
		t.Fatalf("%d concurrent requests: %d store lookups and %d opens, want 1 and 1", n, l, o)
	}
	// Range and HEAD from the cache.
	rec, _ := serve(t, h, http.MethodGet, target, map[string]string{"Range": "bytes=5-9"})
	if rec.Code != http.StatusPartialContent || rec.Body.String() != string(body[5:10]) {
		t.Fatalf("range: %d %q", rec.Code, rec.Body.String())
	}
	rec, _ = serve(t, h, http.MethodHead, target, nil)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Length") != "250000" {
		t.Fatalf("head: %d %v", rec.Code, rec.Header())
	}
	if l, o := fs.counts(); l != 1 || o != 1 {
		t.Fatalf("cached answers read the store: %d lookups, %d opens", l, o)
	}
}

// TestServeCorruptSegmentIsFault: bytes that do not hash to their id are a
// store fault (503), never a 200.
func TestServeCorruptSegmentIsFault(t *testing.T) {
	fs := newFakeStore()
	body := []byte("the real bytes")
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	fs.data[id] = []byte("other bytes!!!") // same length, wrong content
	h := newTestHandler(t, nil, nil)
	h.setStore(store.NewCached(fs, h.Cache.options(time.Duration(h.StoreTimeout), h.now)))
	target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
	for range 2 {
		rec, _ := serve(t, h, http.MethodGet, target, nil)
		wantError(t, rec, http.StatusServiceUnavailable, "edge.store_unavailable")
	}
}

// TestProxyS3SendsOnlyEdgeHeaders: in proxy mode the edge streams the
// object from a real S3 server (versitygw, which returns the record header
// x-amz-meta-syncular-record holding the partition id on GET) and writes
// only its own headers, cached or streamed, whole or ranged.
func TestProxyS3SendsOnlyEdgeHeaders(t *testing.T) {
	srv := s3test.Start(t)
	const bucket, partition = "segs", "tenant-partition-7f3a"
	srv.CreateBucket(t, bucket)
	body := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	rec := map[string]any{
		"partition": partition, "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": digestA, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
		"segmentId": s3test.SegmentID(body), "byteLength": len(body),
		"createdAtMs": testNow.UnixMilli(), "expiresAtMs": testNow.Add(time.Hour).UnixMilli(),
	}
	id := s3test.PutSegment(t, srv.Client(), bucket, "", body, s3test.RecordHeader(rec))

	for _, tc := range []struct {
		name     string
		maxEntry int64
	}{{"cached", store.DefaultMaxEntry}, {"streamed", 1024}} {
		t.Run(tc.name, func(t *testing.T) {
			s3s, err := s3.New(context.Background(), s3.Options{
				Bucket: bucket, Region: srv.Region, Endpoint: srv.Endpoint,
				AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, PathStyle: true, Timeout: 5 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			h := newTestHandler(t, nil, func(h *Handler) {
				h.Store = &StoreConfig{Backend: "s3", S3: &S3Config{Bucket: bucket}}
				h.Delivery = DeliveryProxy
				h.Cache = &CacheConfig{MaxEntry: &tc.maxEntry}
			})
			h.setStore(store.NewCached(s3s, h.Cache.options(time.Duration(h.StoreTimeout), h.now)))
			defer h.store.Close()
			target := "/sync/segments/" + url.PathEscape(id) + "?st=" + mintToken(id, digestA, "aud:"+partition, testNow.Add(10*time.Minute))
			for _, req := range []struct {
				method, rng string
				status      int
				want        []byte
			}{
				{http.MethodGet, "", 200, body},
				{http.MethodGet, "", 200, body},
				{http.MethodGet, "bytes=100-199", 206, body[100:200]},
				{http.MethodHead, "", 200, nil},
			} {
				hdr := map[string]string{}
				if req.rng != "" {
					hdr["Range"] = req.rng
				}
				rr, _ := serve(t, h, req.method, target, hdr)
				if rr.Code != req.status || !bytes.Equal(rr.Body.Bytes(), req.want) {
					t.Fatalf("%s %s: status %d, %d bytes", req.method, req.rng, rr.Code, rr.Body.Len())
				}
				for k, vs := range rr.Header() {
					if strings.HasPrefix(strings.ToLower(k), "x-amz") {
						t.Errorf("S3 header %s reached the client", k)
					}
					for _, v := range vs {
						if strings.Contains(v, partition) || strings.Contains(v, s3test.RecordHeader(rec)[:20]) {
							t.Errorf("header %s carries the record or partition", k)
						}
					}
				}
				allowed := map[string]bool{"Etag": true, "Cache-Control": true, "Content-Type": true, "Content-Length": true,
					"Accept-Ranges": true, "X-Content-Type-Options": true, "Content-Range": true}
				for k := range rr.Header() {
					if !allowed[k] {
						t.Errorf("unexpected header %s", k)
					}
				}
			}
			gets := srv.CountRequests(t, "s3_GetObject", s3test.ObjectKey("", id))
			// Three GETs answered: one object read when cached, one each
			// when streamed (after the cached subtest's one).
			if want := map[string]int{"cached": 1, "streamed": 4}[tc.name]; gets != want {
				t.Errorf("versitygw saw %d GETs of the object so far, want %d", gets, want)
			}
		})
	}
}

// TestRefusalRevalidates: a refusal is never decided on a stale cached
// record: one decided on a fresh read is remembered for the refusal window
// (1s, at most record_ttl) and then re-read, so a segment re-published with
// a later expiry is granted within that window, while the granted path
// keeps answering from the cache.
func TestRefusalRevalidates(t *testing.T) {
	fs := newFakeStore()
	body := []byte("republished segment")
	id := fs.add(body, pub("p1", digestA, testNow.Add(-time.Minute))) // expired
	now := testNow
	h := newTestHandler(t, nil, withClock(func() time.Time { return now }))
	h.setStore(store.NewCached(fs, h.Cache.options(time.Duration(h.StoreTimeout), h.now)))
	target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))

	rec, _ := serve(t, h, http.MethodGet, target, nil)
	wantError(t, rec, http.StatusNotFound, "sync.segment_expired")
	rec, _ = serve(t, h, http.MethodGet, target, nil) // remembered: no re-read
	wantError(t, rec, http.StatusNotFound, "sync.segment_expired")
	if l, _ := fs.counts(); l != 1 {
		t.Fatalf("%d lookups, want 1 (a miss; the repeated refusal is remembered)", l)
	}
	now = now.Add(store.RefusalWindow)
	rec, _ = serve(t, h, http.MethodGet, target, nil) // cached record, refusal re-read
	wantError(t, rec, http.StatusNotFound, "sync.segment_expired")
	if l, _ := fs.counts(); l != 2 {
		t.Fatalf("%d lookups, want 2 (a miss, then a revalidation past the window)", l)
	}
	fs.mu.Lock()
	fs.recs[id] = &store.Record{SegmentID: id, ByteLength: int64(len(body)), MediaType: store.MediaRows,
		Publications: []store.Publication{pub("p1", digestA, testNow.Add(time.Hour))}}
	fs.mu.Unlock()
	now = now.Add(store.RefusalWindow)
	rec, _ = serve(t, h, http.MethodGet, target, nil)
	if rec.Code != http.StatusOK || rec.Body.String() != string(body) {
		t.Fatalf("re-published segment: %d %s", rec.Code, rec.Body.String())
	}
	l, _ := fs.counts()
	for range 5 {
		if rec, _ := serve(t, h, http.MethodGet, target, nil); rec.Code != http.StatusOK {
			t.Fatalf("status %d", rec.Code)
		}
	}
	if l2, _ := fs.counts(); l2 != l {
		t.Fatalf("granted requests read the record again (%d lookups)", l2-l)
	}
}
