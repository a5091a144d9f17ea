package integration

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
)

// s3LayoutsSite serves one bucket three ways: /r/ redirects (legacy_headers
// left at its default, stream), /o/ redirects with legacy_headers redirect,
// /p/ streams. The record cache lives a minute so request counts do not
// depend on the machine's speed.
const s3LayoutsSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log {
		level DEBUG
		output file {{DIR}}/server.log
	}
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /r/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery redirect
		cache {
			record_ttl 1m
		}
	}
	syncular_segments /o/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery redirect
		legacy_headers redirect
	}
	syncular_segments /p/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery proxy
	}
	respond 404
}
`

// TestS3RecordLayouts drives the real binary against versitygw holding
// objects in every layout of protocol §5.2: record object only (current
// writers), record header only (older writers), both with differing
// publications (the record object rules, both ways), neither, a corrupt
// record object, and empty publication lists (§4). It also checks that
// redirect delivery streams objects carrying the legacy header unless
// legacy_headers redirect says otherwise, counts them as
// delivery="stream_legacy", and what each lookup costs in bucket requests.
func TestS3RecordLayouts(t *testing.T) {
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	cl := srv.Client()
	now := time.Now()
	live := now.Add(time.Hour)
	dA, dB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	const secretPartition = "p1-tenant-secret"

	current := randomBytes(t, 40_000)
	currentID := putCurrent(t, cl, current, record(s3test.SegmentID(current), len(current), secretPartition, dA, live))

	legacy := randomBytes(t, 30_000)
	legacyID := s3test.PutSegment(t, cl, "segments", "", legacy,
		s3test.RecordHeader(record(s3test.SegmentID(legacy), len(legacy), secretPartition, dA, live)))

	// Both: the stale header grants p1/dA only; the record object grants
	// p2/dB only.
	both := randomBytes(t, 20_000)
	bothID := s3test.PutSegment(t, cl, "segments", "", both,
		s3test.RecordHeader(record(s3test.SegmentID(both), len(both), secretPartition, dA, live)))
	s3test.PutRecordObject(t, cl, "segments", "", bothID, record(bothID, len(both), secretPartition, dA, live,
		publication("p2", dB, len(both), live)))

	neither := randomBytes(t, 1000)
	neitherID := s3test.PutSegment(t, cl, "segments", "", neither, "")

	corrupt := randomBytes(t, 1000)
	corruptID := s3test.PutSegment(t, cl, "segments", "", corrupt,
		s3test.RecordHeader(record(s3test.SegmentID(corrupt), len(corrupt), secretPartition, dA, live)))
	s3test.PutRecordObject(t, cl, "segments", "", corruptID, `{"segmentId":`)

	// Empty explicit lists beside top-level fields that alone would grant.
	emptyObj := randomBytes(t, 1000)
	emptyObjID := putCurrent(t, cl, emptyObj,
		strings.TrimSuffix(record(s3test.SegmentID(emptyObj), len(emptyObj), secretPartition, dA, live), "}")+`,"publications":[]}`)
	emptyHdr := randomBytes(t, 1000)
	emptyHdrID := s3test.PutSegment(t, cl, "segments", "", emptyHdr, s3test.RecordHeader(
		strings.TrimSuffix(record(s3test.SegmentID(emptyHdr), len(emptyHdr), secretPartition, dA, live), "}")+`,"publications":[]}`))

	c := startCaddy(t, s3LayoutsSite, "SEG_KEY="+s3Key, "S3_ENDPOINT="+srv.Endpoint, "S3_ACCESS_KEY="+srv.AccessKey, "S3_SECRET_KEY="+srv.SecretKey)
	exp := now.Add(10 * time.Minute)
	get := func(mode, id, sd, p string) response {
		return do(t, "GET", c.Base+"/"+mode+"/segments/"+id+"?st="+mint(id, sd, p, exp), nil)
	}
	// redirected checks a 302 to a presigned URL of the object and follows
	// it; it returns the bucket's answer.
	redirected := func(t *testing.T, r response, id string) response {
		t.Helper()
		if r.Status != 302 || len(r.Body) != 0 {
			t.Fatalf("status %d, want 302: %s", r.Status, r.Body)
		}
		u, err := url.Parse(r.Header.Get("Location"))
		if err != nil || u.Path != "/segments/seg/sha256/"+strings.TrimPrefix(id, "sha256:") || u.Query().Get("X-Amz-Signature") == "" {
			t.Fatalf("Location %q is not a presigned URL of the segment", r.Header.Get("Location"))
		}
		got := do(t, "GET", u.String(), nil)
		if got.Status != 200 || s3test.SegmentID(got.Body) != id {
			t.Fatalf("presigned URL answered %d", got.Status)
		}
		return got
	}
	streamed := func(t *testing.T, r response, id string) {
		t.Helper()
		checkSegmentS3(t, r, id)
		if loc := r.Header.Get("Location"); loc != "" {
			t.Fatalf("streamed answer carries Location %q", loc)
		}
		for k, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(v, secretPartition) {
					t.Fatalf("header %s carries the partition id", k)
				}
			}
		}
	}
	const legacySeries = `caddy_syncular_requests_total{delivery="stream_legacy",outcome="granted",server="srv0"}`
	before := scrape(t, c)
	streams := 0

	t.Run("record object only", func(t *testing.T) {
		// Cold: the record object GET and the bytes HEAD, nothing else.
		n0 := srv.CountRequests(t, "", "")
		r := get("r", currentID, dA, secretPartition)
		cold := srv.CountRequests(t, "", "") - n0
		rec := srv.CountRequests(t, "s3_GetObject", s3test.RecordKey("", currentID))
		head := srv.CountRequests(t, "s3_HeadObject", s3test.ObjectKey("", currentID))
		n1 := srv.CountRequests(t, "", "")
		get("r", currentID, dA, secretPartition)
		get("r", currentID, dA, secretPartition)
		warm := srv.CountRequests(t, "", "") - n1
		t.Logf("redirect, record object layout: cold lookup %d bucket requests (%d record GET, %d bytes HEAD); 2 cached requests: %d", cold, rec, head, warm)
		if cold != 2 || rec != 1 || head != 1 || warm != 0 {
			t.Errorf("bucket requests: cold %d (rec GET %d, HEAD %d), cached %d; want 2 (1, 1), 0", cold, rec, head, warm)
		}
		// No header on the object: redirected in both redirect handlers.
		if got := redirected(t, r, currentID); got.Header.Get("X-Amz-Meta-Syncular-Record") != "" {
			t.Errorf("current writer's object carries a record header")
		}
		redirected(t, get("o", currentID, dA, secretPartition), currentID)
		checkSegmentS3(t, get("p", currentID, dA, secretPartition), currentID)
		checkError(t, get("r", currentID, dB, secretPartition), 403, "sync.forbidden")
	})

	t.Run("header only", func(t *testing.T) {
		n0 := srv.CountRequests(t, "", "")
		streamed(t, get("r", legacyID, dA, secretPartition), legacyID)
		streams++
		cold := srv.CountRequests(t, "", "") - n0
		n1 := srv.CountRequests(t, "", "")
		streamed(t, get("r", legacyID, dA, secretPartition), legacyID)
		streams++
		warm := srv.CountRequests(t, "", "") - n1
		t.Logf("redirect, header layout (streamed): first request %d bucket requests, cached %d", cold, warm)
		if cold != 3 || warm != 0 {
			t.Errorf("bucket requests: first %d (want 2 for the lookup + 1 GET of the bytes), cached %d (want 0)", cold, warm)
		}
		// The opt-out redirects, and the bucket then hands the header
		// (with the partition id) to the client: what the default prevents.
		got := redirected(t, get("o", legacyID, dA, secretPartition), legacyID)
		if h := got.Header.Get("X-Amz-Meta-Syncular-Record"); h == "" {
			t.Errorf("versitygw did not return the record header on the presigned GET: the default is untested")
		}
		checkSegmentS3(t, get("p", legacyID, dA, secretPartition), legacyID)
		checkError(t, get("r", legacyID, dB, secretPartition), 403, "sync.forbidden")
	})

	t.Run("both: the record object rules", func(t *testing.T) {
		// A grant only the record object has.
		streamed(t, get("r", bothID, dB, "p2"), bothID)
		streams++
		redirected(t, get("o", bothID, dB, "p2"), bothID)
		checkSegmentS3(t, get("p", bothID, dB, "p2"), bothID)
		// A grant only the stale header has.
		for _, mode := range []string{"r", "o", "p"} {
			checkError(t, get(mode, bothID, dA, secretPartition), 403, "sync.forbidden")
		}
	})

	t.Run("neither", func(t *testing.T) {
		for _, mode := range []string{"r", "o", "p"} {
			checkError(t, get(mode, neitherID, dA, secretPartition), 404, "sync.not_found")
		}
	})

	t.Run("corrupt record object", func(t *testing.T) {
		for _, mode := range []string{"r", "o", "p"} {
			r := get(mode, corruptID, dA, secretPartition)
			checkError(t, r, 503, "edge.store_unavailable")
			if strings.Contains(string(r.Body), secretPartition) {
				t.Errorf("503 body leaks the partition id")
			}
		}
	})

	t.Run("empty publications list", func(t *testing.T) {
		for _, mode := range []string{"r", "o", "p"} {
			checkError(t, get(mode, emptyObjID, dA, secretPartition), 403, "sync.forbidden")
			checkError(t, get(mode, emptyHdrID, dA, secretPartition), 403, "sync.forbidden")
		}
	})

	t.Run("metrics", func(t *testing.T) {
		after := scrape(t, c)
		if got := after[legacySeries] - before[legacySeries]; int(got) != streams {
			t.Errorf("%s rose by %v, want %d\n%s", legacySeries, got, streams, dumpSyncular(after))
		}
		if after[`caddy_syncular_requests_total{delivery="redirect",outcome="granted",server="srv0"}`] == 0 {
			t.Errorf("no redirect counted\n%s", dumpSyncular(after))
		}
	})

	// The corrupt record object is logged as a store fault: by segment id
	// and field, never by the partition id it names.
	c.Stop()
	b, err := os.ReadFile(filepath.Join(c.Dir(), "server.log"))
	if err != nil || len(b) == 0 {
		t.Fatalf("server.log: %v", err)
	}
	checkNoSecrets(t, "server.log", string(b), []string{srv.SecretKey, srv.AccessKey, s3Key, secretPartition, "X-Amz-Signature"})
	checkNoSecrets(t, "stderr", c.Output(), []string{srv.SecretKey, srv.AccessKey, s3Key, secretPartition})
}
