package caddymodule

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// Full ServeHTTP on a warm edge, in process (no network, no Caddy server
// around it, metrics not provisioned): token verify, record from the
// record cache, grant check, then either the bytes from the bytes cache
// (serve) or a cached presigned URL (redirect). The stores behind the
// cache are real: a seeded SQLite file, and versitygw on loopback.

// discardWriter is a ResponseWriter that keeps headers and drops the body.
type discardWriter struct {
	hdr    http.Header
	status int
	n      int64
}

func (w *discardWriter) Header() http.Header { return w.hdr }
func (w *discardWriter) WriteHeader(s int)   { w.status = s }
func (w *discardWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

func benchServeHTTP(b *testing.B, h *Handler, target string, wantStatus int, wantBytes int64) {
	b.Helper()
	// Warm the caches with one request, as a storm's first client would.
	if rec, _ := serve(b, h, http.MethodGet, target, nil); rec.Code != wantStatus {
		b.Fatalf("warm-up: status %d", rec.Code)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		repl := caddyhttp.NewTestReplacer(req)
		ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
		req = req.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{}))
		w := &discardWriter{hdr: http.Header{}}
		for pb.Next() {
			clear(w.hdr)
			w.status, w.n = 0, 0
			if err := h.ServeHTTP(w, req, nextHandler); err != nil {
				b.Error(err)
				return
			}
			if w.status != wantStatus || w.n != wantBytes {
				b.Errorf("status %d, %d bytes", w.status, w.n)
				return
			}
		}
	})
}

func benchCacheOptions(h *Handler) store.CacheOptions {
	o := h.Cache.options(time.Duration(h.StoreTimeout), h.now)
	o.RecordTTL = time.Hour // the clock is fixed anyway; no refetch during the run
	return o
}

func BenchmarkServeHTTPServeHit(b *testing.B) {
	// _metrics: with the module's metrics on, as a production edge runs.
	for _, tc := range []struct {
		size    int
		metrics bool
	}{{2 << 10, false}, {256 << 10, false}, {256 << 10, true}} {
		size, name := tc.size, byteSize(tc.size)
		if tc.metrics {
			name += "_metrics"
		}
		b.Run(name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "bench.sqlite")
			w, err := seed.Create(path, 3)
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			body := bytes.Repeat([]byte("segment!"), size/8)
			id, err := w.Put(seed.SegmentInput{Bytes: body, Publication: pub("p1", digestA, testNow.Add(time.Hour))})
			if err != nil {
				b.Fatal(err)
			}
			s, err := sqlite.Open(path, sqlite.Options{})
			if err != nil {
				b.Fatal(err)
			}
			h := newTestHandler(b, nil, nil)
			c := store.NewCached(s, benchCacheOptions(h))
			defer c.Close()
			h.setStore(c)
			if tc.metrics {
				defer useMetrics(h, "srv0")()
			}
			target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
			benchServeHTTP(b, h, target, http.StatusOK, int64(size))
			b.StopTimer()
			if st := c.Stats(); st.ByteMisses != 1 || st.RecordMisses != 1 {
				b.Fatalf("not warm: %+v", st)
			}
		})
	}
}

func BenchmarkServeHTTPRedirect(b *testing.B) {
	srv := s3test.Start(b)
	srv.CreateBucket(b, "bench")
	body := bytes.Repeat([]byte{1}, 2048)
	rec := map[string]any{
		"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": digestA, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
		"segmentId": s3test.SegmentID(body), "byteLength": len(body),
		"createdAtMs": testNow.UnixMilli(), "expiresAtMs": testNow.Add(time.Hour).UnixMilli(),
	}
	id := s3test.PutSegment(b, srv.Client(), "bench", "", body, s3test.RecordHeader(rec))
	s3s, err := s3.New(context.Background(), s3.Options{
		Bucket: "bench", Region: srv.Region, Endpoint: srv.Endpoint,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, PathStyle: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	// The template audience of the tests, and the keyed audience a
	// production edge uses (its derived audiences memoised).
	for _, aud := range []struct {
		name string
		cfg  *AudienceConfig
	}{
		{"template", &AudienceConfig{Kind: "template", Template: "aud:{partition}"}},
		{"hmac", &AudienceConfig{Kind: "hmac_sha256", Key: "hex:" + strings.Repeat("a5", 32)}},
	} {
		h := newTestHandler(b, nil, func(h *Handler) {
			h.Store = &StoreConfig{Backend: "s3", S3: &S3Config{Bucket: "bench"}}
			h.Delivery = DeliveryRedirect
			h.Audience = aud.cfg
		})
		usePresigner(b, h, s3s)
		target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, h.audience.Derive("p1"), testNow.Add(10*time.Minute))
		name := "record_cached"
		if aud.name != "template" {
			name += "_" + aud.name
		}
		// The same with the module's metrics on, as a production edge runs
		// (the other cases leave them off). Compare the two in separate
		// runs (-bench '...hmac$', then '...hmac_metrics$'): run one after
		// the other in one process, the first is slower whichever it is.
		b.Run(name+"_metrics", func(b *testing.B) {
			c := store.NewCached(s3s, benchCacheOptions(h))
			defer c.Close()
			h.setStore(c)
			defer useMetrics(h, "srv0")()
			benchServeHTTP(b, h, target, http.StatusFound, 0)
		})
		b.Run(name, func(b *testing.B) {
			c := store.NewCached(s3s, benchCacheOptions(h))
			defer c.Close()
			h.setStore(c)
			benchServeHTTP(b, h, target, http.StatusFound, 0)
			b.StopTimer()
			if st := c.Stats(); st.RecordMisses != 1 {
				b.Fatalf("record not cached: %+v", st)
			}
		})
		if aud.name != "template" {
			continue
		}
		// Every request GETs the record object and HEADs the bytes object at
		// the real versitygw on loopback.
		b.Run("record_uncached", func(b *testing.B) {
			h.setBareStore(s3s)
			benchServeHTTP(b, h, target, http.StatusFound, 0)
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<10 {
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// BenchmarkServeHTTPDiskHit is a warm hit of the disk tier (a segment
// above max_entry, its file complete and verified) through the whole
// handler with the module's metrics on, from each store as the bench's
// (e) runs it: SQLite with serve delivery, S3 (versitygw on loopback)
// with proxy delivery. A disk hit reads neither store, so the two should
// cost the same; the body goes through a writer without ReadFrom (a
// read/write copy of the small file, the same for both).
func BenchmarkServeHTTPDiskHit(b *testing.B) {
	const size = 64 << 10
	body := bytes.Repeat([]byte("segment!"), size/8)
	diskOpts := func(b *testing.B, h *Handler) store.CacheOptions {
		o := benchCacheOptions(h)
		o.MaxEntry = 16 << 10 // the segment is for the disk tier
		d, err := store.NewDiskTier(store.DiskOptions{Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		o.Disk = d
		return o
	}
	b.Run("sqlite_serve", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "bench.sqlite")
		w, err := seed.Create(path, 3)
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		id, err := w.Put(seed.SegmentInput{Bytes: body, Publication: pub("p1", digestA, testNow.Add(time.Hour))})
		if err != nil {
			b.Fatal(err)
		}
		s, err := sqlite.Open(path, sqlite.Options{})
		if err != nil {
			b.Fatal(err)
		}
		h := newTestHandler(b, nil, nil)
		c := store.NewCached(s, diskOpts(b, h))
		defer c.Close()
		h.setStore(c)
		defer useMetrics(h, "srv0")()
		target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
		benchServeHTTP(b, h, target, http.StatusOK, size)
	})
	b.Run("s3_proxy", func(b *testing.B) {
		srv := s3test.Start(b)
		srv.CreateBucket(b, "bench")
		rec := map[string]any{
			"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
			"scopeDigest": digestA, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
			"segmentId": s3test.SegmentID(body), "byteLength": len(body),
			"createdAtMs": testNow.UnixMilli(), "expiresAtMs": testNow.Add(time.Hour).UnixMilli(),
		}
		id := s3test.PutSegment(b, srv.Client(), "bench", "", body, s3test.RecordHeader(rec))
		s3s, err := s3.New(context.Background(), s3.Options{
			Bucket: "bench", Region: srv.Region, Endpoint: srv.Endpoint,
			AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, PathStyle: true,
		})
		if err != nil {
			b.Fatal(err)
		}
		h := newTestHandler(b, nil, func(h *Handler) {
			h.Store = &StoreConfig{Backend: "s3", S3: &S3Config{Bucket: "bench"}}
			h.Delivery = DeliveryProxy
		})
		c := store.NewCached(s3s, diskOpts(b, h))
		defer c.Close()
		h.setStore(c)
		defer useMetrics(h, "srv0")()
		target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
		benchServeHTTP(b, h, target, http.StatusOK, size)
	})
}
