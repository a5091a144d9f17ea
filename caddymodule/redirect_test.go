package caddymodule

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/store/s3"
)

// TestRedirectNeverOutlivesGrant: a redirect's presigned URL expires
// strictly before the grant ends (a store still accepts it at
// X-Amz-Date+X-Amz-Expires), and is still valid when handed out. In the
// grant's last second(s), where no whole-second URL fits, the edge streams
// the bytes itself instead. The clock is injected; the bucket is a real
// versitygw.
func TestRedirectNeverOutlivesGrant(t *testing.T) {
	srv := s3test.Start(t)
	const bucket = "segs"
	srv.CreateBucket(t, bucket)
	body := bytes.Repeat([]byte("redirect-boundary"), 100)
	// The grant ends on a window boundary (the default window is 15 s).
	base := time.Unix(testNow.Unix()-testNow.Unix()%15, 0)
	end := base.Add(2 * time.Minute)
	rec := map[string]any{
		"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": digestA, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
		"segmentId": s3test.SegmentID(body), "byteLength": len(body),
		"createdAtMs": testNow.UnixMilli(), "expiresAtMs": end.UnixMilli(),
	}
	id := s3test.PutSegment(t, srv.Client(), bucket, "", body, s3test.RecordHeader(rec))
	s3s, err := s3.New(context.Background(), s3.Options{
		Bucket: bucket, Region: srv.Region, Endpoint: srv.Endpoint,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, PathStyle: true, Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s3s.Close()
	var now time.Time
	h := newTestHandler(t, s3s, withClock(func() time.Time { return now }), func(h *Handler) {
		h.Store = &StoreConfig{Backend: "s3", S3: &S3Config{Bucket: bucket}}
		h.Delivery = DeliveryRedirect
	})
	usePresigner(t, h, s3s)
	target := "/sync/segments/" + url.PathEscape(id) + "?st=" + mintToken(id, digestA, "aud:p1", end.Add(time.Hour))

	etag := `"` + id + `"`
	inm := map[string]string{"If-None-Match": etag}
	for _, tc := range []struct {
		left     time.Duration // grant left at now
		redirect bool
	}{
		{30 * time.Second, true},
		{2 * time.Second, true},
		{1001 * time.Millisecond, true},
		{1000 * time.Millisecond, false}, // the URL would end at notAfter itself
		{999 * time.Millisecond, false},
		{300 * time.Millisecond, false},
		{1 * time.Millisecond, false},
		{0, false}, // grant over: segment_expired
	} {
		now = end.Add(-tc.left)
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			rr, _ := serve(t, h, method, target, nil)
			if tc.left == 0 {
				wantError(t, rr, http.StatusNotFound, "sync.segment_expired")
				continue
			}
			if !tc.redirect {
				if rr.Code != http.StatusOK || rr.Header().Get("Location") != "" {
					t.Fatalf("%v left, %s: status %d, Location %q; want the bytes", tc.left, method, rr.Code, rr.Header().Get("Location"))
				}
				if method == http.MethodGet && !bytes.Equal(rr.Body.Bytes(), body) {
					t.Fatalf("%v left: streamed %d bytes, want %d", tc.left, rr.Body.Len(), len(body))
				}
				if cc := rr.Header().Get("Cache-Control"); cc != "private, max-age="+strconv.FormatInt(int64(tc.left/time.Second), 10) {
					t.Fatalf("%v left: Cache-Control %q", tc.left, cc)
				}
				// Streamed bytes are a 200: If-None-Match applies.
				if nm, _ := serve(t, h, method, target, inm); nm.Code != http.StatusNotModified || nm.Header().Get("ETag") != etag {
					t.Fatalf("%v left, %s, If-None-Match: status %d, ETag %q; want 304", tc.left, method, nm.Code, nm.Header().Get("ETag"))
				}
				continue
			}
			if rr.Code != http.StatusFound {
				t.Fatalf("%v left, %s: status %d, want 302", tc.left, method, rr.Code)
			}
			// A 302 carries no ETag, and If-None-Match does not turn it
			// into a 304 (RFC 9110 13.2.1): a cache revalidating a stale
			// 302 would keep its expired Location.
			if e := rr.Header().Get("ETag"); e != "" {
				t.Fatalf("%v left, %s: 302 with ETag %q", tc.left, method, e)
			}
			if nm, _ := serve(t, h, method, target, inm); nm.Code != http.StatusFound || nm.Header().Get("Location") == "" || nm.Header().Get("ETag") != "" {
				t.Fatalf("%v left, %s, If-None-Match: status %d, headers %v; want the 302", tc.left, method, nm.Code, nm.Header())
			}
			loc, err := url.Parse(rr.Header().Get("Location"))
			if err != nil {
				t.Fatal(err)
			}
			q := loc.Query()
			date, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
			if err != nil {
				t.Fatal(err)
			}
			exp, err := strconv.Atoi(q.Get("X-Amz-Expires"))
			if err != nil {
				t.Fatal(err)
			}
			urlEnd := date.Add(time.Duration(exp) * time.Second)
			if date.After(now) || !urlEnd.After(now) || !urlEnd.Before(end) {
				t.Fatalf("%v left (now %v, grant ends %v): URL signed %v for %d s, ends %v",
					tc.left, now, end, date, exp, urlEnd)
			}
			maxAge := int64(urlEnd.Sub(now) / time.Second)
			if cc := rr.Header().Get("Cache-Control"); cc != "private, max-age="+strconv.FormatInt(maxAge, 10) {
				t.Fatalf("%v left: Cache-Control %q, URL ends %v", tc.left, cc, urlEnd)
			}
		}
	}

	// Far from the grant's end, every request of one window gets the same
	// URL (the cache), and the next window another.
	loc := func(at time.Time) string {
		now = at
		rr, _ := serve(t, h, http.MethodGet, target, nil)
		if rr.Code != http.StatusFound {
			t.Fatalf("status %d at %v", rr.Code, at)
		}
		return rr.Header().Get("Location")
	}
	a := loc(base.Add(time.Second))
	if b := loc(base.Add(14*time.Second + 999*time.Millisecond)); b != a {
		t.Errorf("same window, different URLs:\n%s\n%s", a, b)
	}
	if b := loc(base.Add(15 * time.Second)); b == a {
		t.Error("next window, same URL")
	}
}
