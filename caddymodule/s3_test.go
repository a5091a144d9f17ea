package caddymodule

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/store/s3"
)

// TestRedirectLegacyHeaders provisions redirect handlers against a real
// versitygw: an object carrying the legacy x-amz-meta-syncular-record
// header (which holds the partition id) is streamed by default and
// redirected only with legacy_headers redirect; an object written by a
// current writer (record object, no metadata) is always redirected.
func TestRedirectLegacyHeaders(t *testing.T) {
	srv := s3test.Start(t)
	const bucket, partition = "segs", "tenant-partition-5c1e"
	srv.CreateBucket(t, bucket)
	c := srv.Client()
	record := func(body []byte) map[string]any {
		return map[string]any{
			"partition": partition, "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
			"scopeDigest": digestA, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
			"segmentId": s3test.SegmentID(body), "byteLength": len(body),
			"createdAtMs": testNow.UnixMilli(), "expiresAtMs": testNow.Add(time.Hour).UnixMilli(),
		}
	}
	legacyBody := []byte("written by an older writer, header on the object")
	legacyID := s3test.PutSegment(t, c, bucket, "", legacyBody, s3test.RecordHeader(record(legacyBody)))
	// Both layouts: the record object rules, but the header is still there.
	bothBody := []byte("older object, since republished into a record object")
	bothID := s3test.PutSegment(t, c, bucket, "", bothBody, s3test.RecordHeader(record(bothBody)))
	s3test.PutRecordObject(t, c, bucket, "", bothID, record(bothBody))
	currentBody := []byte("written by a current writer, no metadata")
	currentID := s3test.PutSegment(t, c, bucket, "", currentBody, "")
	s3test.PutRecordObject(t, c, bucket, "", currentID, record(currentBody))

	t.Setenv("SYNCULAR_TEST_S3_AK", srv.AccessKey)
	t.Setenv("SYNCULAR_TEST_S3_SK", srv.SecretKey)
	newHandler := func(t *testing.T, legacy string) *Handler {
		h := testHooks(&Handler{
			Keys:     []string{string(testKey)},
			Audience: &AudienceConfig{Kind: "template", Template: "aud:{partition}"},
			Store: &StoreConfig{Backend: "s3", S3: &S3Config{
				Bucket: bucket, Region: srv.Region, Endpoint: srv.Endpoint,
				AccessKeyID: "{env.SYNCULAR_TEST_S3_AK}", SecretAccessKey: "{env.SYNCULAR_TEST_S3_SK}",
			}},
			LegacyHeaders: legacy,
		}, withClock(func() time.Time { return testNow }))
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(func() { h.Cleanup(); cancel() })
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if err := h.Validate(); err != nil {
			t.Fatal(err)
		}
		if h.Delivery != DeliveryRedirect {
			t.Fatalf("default delivery for s3 is %q", h.Delivery)
		}
		return h
	}
	target := func(id string) string {
		return "/sync/segments/" + url.PathEscape(id) + "?st=" + mintToken(id, digestA, "aud:"+partition, testNow.Add(10*time.Minute))
	}

	for _, tc := range []struct {
		legacy       string
		legacyStream bool
	}{{"", true}, {"stream", true}, {"redirect", false}} {
		t.Run("legacy_headers="+tc.legacy, func(t *testing.T) {
			h := newHandler(t, tc.legacy)
			streamedBefore := requestsOf(outcomeGranted, deliveryStreamLegacy)
			redirectedBefore := requestsOf(outcomeGranted, DeliveryRedirect)
			wantStreamed := 0
			for _, seg := range []struct {
				name, id string
				body     []byte
				header   bool
			}{
				{"header only", legacyID, legacyBody, true},
				{"record object and header", bothID, bothBody, true},
				{"record object only", currentID, currentBody, false},
			} {
				rr, repl := serve(t, h, http.MethodGet, target(seg.id), nil)
				stream := seg.header && tc.legacyStream
				switch {
				case stream:
					wantStreamed++
					if rr.Code != http.StatusOK || !bytes.Equal(rr.Body.Bytes(), seg.body) {
						t.Errorf("%s: status %d, body %q; want 200 with the bytes", seg.name, rr.Code, rr.Body.String())
					}
					if rr.Header().Get("Location") != "" {
						t.Errorf("%s: streamed answer has a Location", seg.name)
					}
					if got := replString(repl, "http.syncular.delivery"); got != deliveryStreamLegacy {
						t.Errorf("%s: delivery placeholder %q", seg.name, got)
					}
				default:
					loc := rr.Header().Get("Location")
					if rr.Code != http.StatusFound || !strings.Contains(loc, "X-Amz-Signature=") || rr.Body.Len() != 0 {
						t.Errorf("%s: status %d, Location %q; want a 302 to a presigned URL", seg.name, rr.Code, loc)
					}
				}
				for k, vs := range rr.Header() {
					if strings.HasPrefix(strings.ToLower(k), "x-amz") {
						t.Errorf("%s: S3 header %s reached the client", seg.name, k)
					}
					for _, v := range vs {
						if strings.Contains(v, partition) {
							t.Errorf("%s: header %s carries the partition id", seg.name, k)
						}
					}
				}
			}
			streamed := requestsOf(outcomeGranted, deliveryStreamLegacy) - streamedBefore
			redirected := requestsOf(outcomeGranted, DeliveryRedirect) - redirectedBefore
			if int(streamed) != wantStreamed || int(redirected) != 3-wantStreamed {
				t.Errorf("requests_total: stream_legacy +%v, redirect +%v; want +%d, +%d", streamed, redirected, wantStreamed, 3-wantStreamed)
			}
		})
	}
}

func TestLegacyHeadersValidate(t *testing.T) {
	for _, tc := range []struct {
		delivery, legacy, want string
	}{
		{DeliveryRedirect, "", ""},
		{DeliveryRedirect, "stream", ""},
		{DeliveryRedirect, "redirect", ""},
		{DeliveryRedirect, "proxy", "legacy_headers must be stream or redirect"},
		{DeliveryProxy, "stream", "applies to delivery redirect only"},
		{DeliveryServe, "redirect", "applies to delivery redirect only"},
	} {
		h := &Handler{Delivery: tc.delivery, LegacyHeaders: tc.legacy, Untokened: "next",
			PresignTTL: caddy.Duration(time.Minute), Store: &StoreConfig{Backend: "s3"}}
		err := h.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("delivery %s legacy_headers %q: %v, want %q", tc.delivery, tc.legacy, err, tc.want)
		}
	}
}

// The start-up check's failures are told apart: no answer at all is
// "unreachable"; an answer refusing the credentials, or naming a missing
// bucket, is not.
func TestS3FailureClasses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&s3.Error{Reason: "connection refused"}, "unreachable"},
		{&s3.Error{Reason: "dns lookup failed"}, "unreachable"},
		{&s3.Error{Reason: "no usable credentials"}, "no usable credentials"},
		{&s3.Error{StatusCode: 403, Code: "SignatureDoesNotMatch"}, "credentials refused"},
		{&s3.Error{StatusCode: 403, Code: "InvalidAccessKeyId"}, "credentials refused"},
		{&s3.Error{StatusCode: 400, Code: "ExpiredToken"}, "credentials refused"},
		{&s3.Error{StatusCode: 404, Code: "NoSuchBucket"}, "bucket not found"},
		{&s3.Error{StatusCode: 500, Code: "InternalError"}, "answered the check with an error"},
	} {
		if got := s3Failure(c.err); !strings.HasPrefix(got, c.want) {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
	}
}
