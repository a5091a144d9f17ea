package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// s3Site serves the same bucket twice: /r/ redirects to presigned URLs,
// /p/ streams through the edge. Credentials come from the environment.
const s3Site = `{
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
		presign_ttl 30s
		store_timeout 3s
	}
	syncular_segments /p/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery proxy
		store_timeout 3s
	}
	respond 404
}
`

const s3Key = "edge-s3-test-key"

// record renders a record JSON the way the reference S3SegmentStore does:
// the SegmentMetadata fields in interface order, then segmentId,
// byteLength and the two times. pubs, when given, are appended as the
// newer writers' publications list.
func record(id string, size int, partition, digest string, expiresAt time.Time, pubs ...map[string]any) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"partition":%q,"logEpoch":"e1","table":"tasks","schemaVersion":3,"mediaType":"rows","scopeDigest":%q,`, partition, digest)
	fmt.Fprintf(&b, `"asOfCommitSeq":42,"rowCount":10,"rowCursor":null,"nextRowCursor":null,"segmentId":%q,"byteLength":%d,`, id, size)
	fmt.Fprintf(&b, `"createdAtMs":%d,"expiresAtMs":%d`, time.Now().Add(-time.Hour).UnixMilli(), expiresAt.UnixMilli())
	if len(pubs) > 0 {
		js, _ := json.Marshal(pubs)
		fmt.Fprintf(&b, `,"publications":%s`, js)
	}
	b.WriteString("}")
	return b.String()
}

func publication(partition, digest string, size int, expiresAt time.Time) map[string]any {
	return map[string]any{
		"partition": partition, "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": digest, "asOfCommitSeq": 42, "rowCount": 10, "rowCursor": nil, "nextRowCursor": nil,
		"byteLength": size, "createdAtMs": time.Now().Add(-time.Hour).UnixMilli(), "expiresAtMs": expiresAt.UnixMilli(),
	}
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return append([]byte("SSG2"), b...)
}

func mint(seg, sd, partition string, exp time.Time) string {
	return token.Sign([]byte(s3Key), seg, sd, "aud:"+partition, exp.Unix())
}

// TestS3 drives every grant outcome through the real binary against a
// real S3-compatible server (versitygw) in redirect and proxy modes.
func TestS3(t *testing.T) {
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	cl := srv.Client()
	now := time.Now()
	dA, dB, dC := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)

	// Objects as current reference writers store them: a record object
	// and a bytes object without metadata (protocol §5.2).
	single := randomBytes(t, 200_000)
	singleID := s3test.SegmentID(single)
	putCurrent(t, cl, single, record(singleID, len(single), "p1", dA, now.Add(time.Hour)))

	multi := randomBytes(t, 5000)
	multiID := s3test.SegmentID(multi)
	putCurrent(t, cl, multi, record(multiID, len(multi), "p1", dA, now.Add(time.Hour),
		publication("p1", dA, len(multi), now.Add(time.Hour)),
		publication("p2", dB, len(multi), now.Add(2*time.Hour)),
		publication("p1", dC, len(multi), now.Add(-time.Minute)),
	))

	gone := randomBytes(t, 100)
	goneID := s3test.SegmentID(gone)
	putCurrent(t, cl, gone, record(goneID, len(gone), "p1", dA, now.Add(time.Hour)))
	s3test.DeleteSegment(t, cl, "segments", "", goneID) // a lifecycle rule removed it

	corrupt := randomBytes(t, 100)
	corruptID := s3test.SegmentID(corrupt)
	s3test.PutSegment(t, cl, "segments", "", corrupt, "not-base64-json!")

	c := startCaddy(t, s3Site, "SEG_KEY="+s3Key, "S3_ENDPOINT="+srv.Endpoint, "S3_ACCESS_KEY="+srv.AccessKey, "S3_SECRET_KEY="+srv.SecretKey)
	exp := now.Add(10 * time.Minute)

	follow := func(t *testing.T, r response, id string, size int) string {
		t.Helper()
		if r.Status != 302 {
			t.Fatalf("status %d, want 302: %s", r.Status, r.Body)
		}
		loc := r.Header.Get("Location")
		u, err := url.Parse(loc)
		if err != nil || u.Scheme+"://"+u.Host != srv.Endpoint || u.Path != "/segments/seg/sha256/"+strings.TrimPrefix(id, "sha256:") {
			t.Fatalf("Location %q is not a presigned URL of the segment's key", loc)
		}
		cc := r.Header.Get("Cache-Control")
		var maxAge int
		if _, err := fmt.Sscanf(cc, "private, max-age=%d", &maxAge); err != nil || maxAge > 30 {
			t.Fatalf("Cache-Control %q", cc)
		}
		got := do(t, "GET", loc, nil)
		if got.Status != 200 || len(got.Body) != size || s3test.SegmentID(got.Body) != id {
			t.Fatalf("presigned URL answered %d with %d bytes", got.Status, len(got.Body))
		}
		return loc
	}

	t.Run("redirect", func(t *testing.T) {
		u := c.Base + "/r/segments/" + singleID + "?st=" + mint(singleID, dA, "p1", exp)
		// Within one signing window every request gets the identical URL.
		// Two requests can straddle a window's edge (X-Amz-Date differs)
		// on a slow machine: then the next pair must agree.
		loc1 := follow(t, do(t, "GET", u, nil), singleID, len(single))
		loc2 := follow(t, do(t, "GET", u, nil), singleID, len(single))
		for try := 0; try < 3 && loc1 != loc2 && amzDate(t, loc1) != amzDate(t, loc2); try++ {
			loc1, loc2 = loc2, follow(t, do(t, "GET", u, nil), singleID, len(single))
		}
		if loc1 != loc2 {
			t.Errorf("repeated requests got different URLs:\n%s\n%s", loc1, loc2)
		}
		// A 302 has no ETag and ignores If-None-Match (RFC 9110 13.2.1):
		// a 304 would revive a cached 302 whose URL has expired.
		r := do(t, "GET", u, map[string]string{"If-None-Match": `"` + singleID + `"`})
		if r.Status != 302 || r.Header.Get("ETag") != "" {
			t.Errorf("If-None-Match: %d, ETag %q; want 302 without ETag", r.Status, r.Header.Get("ETag"))
		}
		follow(t, r, singleID, len(single))
	})

	t.Run("redirect never outlives the token", func(t *testing.T) {
		// A token accepted inside the skew window with about 2.x s left:
		// the URL must expire strictly before the grant does (the bucket
		// still accepts a URL at X-Amz-Date+X-Amz-Expires itself), and the
		// bucket must refuse it after.
		startOfSecond(t)
		tokExp := time.Now().Add(-57 * time.Second)
		tok := mint(singleID, dA, "p1", tokExp)
		r := do(t, "GET", c.Base+"/r/segments/"+singleID+"?st="+tok, nil)
		if r.Status != 302 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		loc, _ := url.Parse(r.Header.Get("Location"))
		q := loc.Query()
		signed, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
		secs, err2 := strconv.Atoi(q.Get("X-Amz-Expires"))
		if err != nil || err2 != nil {
			t.Fatalf("Location lacks X-Amz-Date/Expires: %s", loc)
		}
		// The grant ends at exp + 60 s skew.
		urlEnd, grantEnd := signed.Add(time.Duration(secs)*time.Second), time.Unix(tokExp.Unix()+60, 0)
		if !urlEnd.Before(grantEnd) {
			t.Fatalf("URL valid until %v, grant ends %v", urlEnd, grantEnd)
		}
		time.Sleep(time.Until(grantEnd) + 1500*time.Millisecond)
		got := do(t, "GET", loc.String(), nil)
		if got.Status != 403 {
			t.Fatalf("expired presigned URL answered %d", got.Status)
		}
	})

	t.Run("grant's last second is streamed, not redirected", func(t *testing.T) {
		// Under a second left: no whole-second URL can be valid now and
		// expire before the grant, so the edge streams the bytes.
		startOfSecond(t)
		tok := mint(singleID, dA, "p1", time.Now().Add(-59*time.Second))
		r := do(t, "GET", c.Base+"/r/segments/"+singleID+"?st="+tok, nil)
		if r.Status != 200 || r.Header.Get("Location") != "" || !bytes.Equal(r.Body, single) {
			t.Fatalf("status %d, Location %q, %d bytes; want the segment streamed", r.Status, r.Header.Get("Location"), len(r.Body))
		}
		noAmz(t, r)
	})

	t.Run("proxy", func(t *testing.T) {
		u := c.Base + "/p/segments/" + singleID + "?st=" + mint(singleID, dA, "p1", exp)
		r := do(t, "GET", u, nil)
		checkSegmentS3(t, r, singleID)
		rr := do(t, "GET", u, map[string]string{"Range": "bytes=100-199"})
		if rr.Status != 206 || !bytes.Equal(rr.Body, single[100:200]) || rr.Header.Get("Content-Range") != fmt.Sprintf("bytes 100-199/%d", len(single)) {
			t.Fatalf("Range: %d %v", rr.Status, rr.Header)
		}
		noAmz(t, rr)
		h := do(t, "HEAD", u, nil)
		if h.Status != 200 || h.Header.Get("Content-Length") != strconv.Itoa(len(single)) {
			t.Fatalf("HEAD: %d %v", h.Status, h.Header)
		}
		noAmz(t, h)
		if r := do(t, "GET", u, map[string]string{"If-None-Match": `"` + singleID + `"`}); r.Status != 304 {
			t.Fatalf("If-None-Match: %d", r.Status)
		}
	})

	for _, mode := range []string{"r", "p"} {
		t.Run("outcomes/"+mode, func(t *testing.T) {
			get := func(id, sd, p string) response {
				return do(t, "GET", c.Base+"/"+mode+"/segments/"+id+"?st="+mint(id, sd, p, exp), nil)
			}
			ok := func(r response, id string, size int) {
				t.Helper()
				if mode == "r" {
					follow(t, r, id, size)
				} else {
					checkSegmentS3(t, r, id)
				}
			}
			// Every live publication of a shared content address grants.
			ok(get(multiID, dA, "p1"), multiID, len(multi))
			ok(get(multiID, dB, "p2"), multiID, len(multi))
			checkError(t, get(multiID, dC, "p1"), 404, "sync.segment_expired")
			checkError(t, get(multiID, dB, "p1"), 403, "sync.forbidden")
			checkError(t, get(multiID, dA, "p3"), 403, "sync.forbidden")
			checkError(t, get(goneID, dA, "p1"), 404, "sync.not_found")
			r := get(corruptID, dA, "p1")
			checkError(t, r, 503, "edge.store_unavailable")
			if r.Header.Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
			// Forged: refused before the store.
			forged := token.Sign([]byte("other-key"), singleID, dA, "aud:p1", exp.Unix())
			checkError(t, do(t, "GET", c.Base+"/"+mode+"/segments/"+singleID+"?st="+forged, nil), 403, "sync.forbidden")
		})
	}

	t.Run("reference objects", func(t *testing.T) {
		// The exact objects the older reference S3SegmentStore wrote
		// (headers and bodies from s3-objects.json). They expired in 2025:
		// the edge must decode them and say so. The same headers with only
		// expiresAtMs moved into the future must grant; redirect delivery
		// streams them (they carry the legacy header).
		objs := referenceObjects(t)
		if len(objs) < 5 {
			t.Fatalf("only %d reference objects", len(objs))
		}
		for _, o := range objs {
			s3test.PutSegment(t, cl, "segments", "", o.body, o.header)
			checkError(t, do(t, "GET", c.Base+"/p/segments/"+o.id+"?st="+mint(o.id, o.digest, o.partition, exp), nil), 404, "sync.segment_expired")
		}
		// A refusal decided on a fresh read stands for up to 1 s
		// (the refusal memo) before the record is read again.
		time.Sleep(1100 * time.Millisecond)
		for _, o := range objs {
			moved := regexp.MustCompile(`"expiresAtMs":\d+`).ReplaceAllString(o.json, `"expiresAtMs":`+strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10))
			s3test.PutSegment(t, cl, "segments", "", o.body, base64.RawURLEncoding.EncodeToString([]byte(moved)))
			checkSegmentS3(t, do(t, "GET", c.Base+"/p/segments/"+o.id+"?st="+mint(o.id, o.digest, o.partition, exp), nil), o.id)
			checkSegmentS3(t, do(t, "GET", c.Base+"/r/segments/"+o.id+"?st="+mint(o.id, o.digest, o.partition, exp), nil), o.id)
		}
	})

	// The edge never logs credentials, tokens or partition ids.
	c.Stop()
	b, err := os.ReadFile(filepath.Join(c.Dir(), "server.log"))
	if err != nil || len(b) == 0 {
		t.Fatalf("server.log: %v", err)
	}
	checkNoSecrets(t, "server.log", string(b), []string{srv.SecretKey, srv.AccessKey, s3Key, `"p1"`, `"p2"`, "X-Amz-Signature"})
	checkNoSecrets(t, "stderr", c.Output(), []string{srv.SecretKey, srv.AccessKey, s3Key})
}

// putCurrent stores body as current reference writers do: the bytes
// object without metadata and the record object beside it.
func putCurrent(t testing.TB, cl *s3.Client, body []byte, recordJSON string) string {
	t.Helper()
	id := s3test.PutSegment(t, cl, "segments", "", body, "")
	s3test.PutRecordObject(t, cl, "segments", "", id, recordJSON)
	return id
}

// checkSegmentS3 is checkSegment plus: no S3 header reaches the client.
func checkSegmentS3(t *testing.T, r response, id string) {
	t.Helper()
	checkSegment(t, r, id)
	noAmz(t, r)
}

func noAmz(t *testing.T, r response) {
	t.Helper()
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-amz-") {
			t.Fatalf("S3 header %s reached the client", k)
		}
	}
}

type refObject struct {
	id, digest, partition string
	header, json          string
	body                  []byte
}

func referenceObjects(t *testing.T) []refObject {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(vectorsDir(t), "s3-objects.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Objects []struct {
			Key      string            `json:"key"`
			Headers  map[string]string `json:"headers"`
			BodyUTF8 *string           `json:"bodyUtf8"`
			BodyHex  *string           `json:"bodyHex"`
		} `json:"objects"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	var out []refObject
	for _, o := range v.Objects {
		if !strings.HasPrefix(o.Key, "seg/sha256/") {
			continue
		}
		var body []byte
		switch {
		case o.BodyUTF8 != nil:
			body = []byte(*o.BodyUTF8)
		case o.BodyHex != nil:
			body, err = hex.DecodeString(*o.BodyHex)
			if err != nil {
				t.Fatal(err)
			}
		}
		h := o.Headers["x-amz-meta-syncular-record"]
		js, err := base64.RawURLEncoding.DecodeString(h)
		if err != nil {
			t.Fatalf("%s: header not base64url: %v", o.Key, err)
		}
		var rec struct {
			SegmentID   string `json:"segmentId"`
			Partition   string `json:"partition"`
			ScopeDigest string `json:"scopeDigest"`
		}
		if err := json.Unmarshal(js, &rec); err != nil {
			t.Fatal(err)
		}
		if s3test.SegmentID(body) != rec.SegmentID {
			t.Fatalf("%s: body does not hash to %s", o.Key, rec.SegmentID)
		}
		out = append(out, refObject{id: rec.SegmentID, digest: rec.ScopeDigest, partition: rec.Partition, header: h, json: string(js), body: body})
	}
	return out
}

// startOfSecond waits until just past the start of a wall-clock second, so
// that a test deriving a grant end from whole-second token times has the
// rest of that second to make its request.
func startOfSecond(t *testing.T) {
	t.Helper()
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(time.Second + 50*time.Millisecond).Sub(now))
}

// amzDate is the X-Amz-Date (the signing window's start) of a presigned URL.
func amzDate(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Query().Get("X-Amz-Date")
}
