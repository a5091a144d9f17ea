package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/segdata"
	"github.com/syncular/caddy-syncular/token"
)

// compressSites: the default (compression on) on {{PORT}}, `compress off`
// on PORT2, same store.
const compressSites = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite STORE_PATH
		untokened reject
	}
}

http://127.0.0.1:PORT2 {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite STORE_PATH
		untokened reject
		compress off
	}
}
`

// rawClient shows the coding on the wire: it never decodes (as
// DisableCompression makes net/http) and never follows redirects.
var rawClient = &http.Client{
	Timeout:       30 * time.Second,
	Transport:     &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 128},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

func rawGet(method, url string, hdr map[string]string) (response, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return response{}, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := rawClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{res.StatusCode, res.Header, body}, nil
}

// decodeAs decodes body per its Content-Encoding ("" is identity).
func decodeAs(encoding string, body []byte) ([]byte, error) {
	switch encoding {
	case "":
		return body, nil
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		return io.ReadAll(zr)
	}
	return nil, fmt.Errorf("unexpected Content-Encoding %q", encoding)
}

func hasVary(h http.Header) bool {
	for _, v := range h.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), "Accept-Encoding") {
				return true
			}
		}
	}
	return false
}

func TestCompressedDelivery(t *testing.T) {
	rows := segdata.RowsSegment(3000) // ~1.5 MB of rows: compressible
	noise := pseudoRandom(64<<10, 7)  // does not shrink by 10%
	corrupt := segdata.RowsSegment(400)

	dbPath := t.TempDir() + "/sync.db"
	w, err := seed.Create(dbPath, 3)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, b := range [][]byte{rows, noise, corrupt} {
		id, err := w.Put(seed.SegmentInput{Bytes: b, Publication: hardPub()})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rowsID, noiseID, corruptID := ids[0], ids[1], ids[2]
	// A store fault: the corrupt segment's bytes no longer hash to its id.
	bad := bytes.Clone(corrupt)
	bad[len(bad)/2] ^= 0x20
	if err := w.Exec(`UPDATE sync_segments SET bytes = ? WHERE segment_id = ?`, bad, corruptID); err != nil {
		t.Fatal(err)
	}
	w.Close()

	segKey := randomKey(t)
	port2 := freePort(t)
	site := strings.NewReplacer("STORE_PATH", dbPath, "PORT2", strconv.Itoa(port2)).Replace(compressSites)
	c := startCaddy(t, site, "SEG_KEY="+segKey)
	off := fmt.Sprintf("http://127.0.0.1:%d", port2)
	url := func(base, id string) string {
		tok := token.Sign([]byte(segKey), id, hardDigest, hardAud, time.Now().Add(time.Hour).Unix())
		return base + "/segments/" + id + "?st=" + tok
	}
	get := func(t *testing.T, method, u string, hdr map[string]string) response {
		t.Helper()
		r, err := rawGet(method, u, hdr)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// checkDecodes: 200, and the body decodes per Content-Encoding to want.
	checkDecodes := func(t *testing.T, r response, want []byte) {
		t.Helper()
		if r.Status != 200 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		if cl := r.Header.Get("Content-Length"); cl != strconv.Itoa(len(r.Body)) {
			t.Fatalf("Content-Length %s for a %d-byte body", cl, len(r.Body))
		}
		got, err := decodeAs(r.Header.Get("Content-Encoding"), r.Body)
		if err != nil {
			t.Fatalf("decoding %q: %v", r.Header.Get("Content-Encoding"), err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%q body decodes to %d bytes that are not the segment", r.Header.Get("Content-Encoding"), len(got))
		}
	}
	// awaitCoding asks until the answer carries coding (the variant is
	// built in the background; the first answers may be identity).
	awaitCoding := func(t *testing.T, u string, hdr map[string]string, coding string, want []byte) response {
		t.Helper()
		var last response
		if waitFor(20*time.Second, func() bool {
			last = get(t, "GET", u, hdr)
			checkDecodes(t, last, want)
			return last.Header.Get("Content-Encoding") == coding
		}) < 0 {
			t.Fatalf("no %s answer within 20s (last Content-Encoding %q)", coding, last.Header.Get("Content-Encoding"))
		}
		return last
	}
	browser := map[string]string{"Accept-Encoding": "gzip, deflate, br, zstd"}
	rust := map[string]string{"Accept-Encoding": "gzip"}

	t.Run("one build under 100 concurrent requests", func(t *testing.T) {
		u := url(c.Base, rowsID)
		checkDecodes(t, get(t, "GET", u, nil), rows) // the identity bytes are read into memory
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for range 100 {
			wg.Go(func() {
				r, err := rawGet("GET", u, browser)
				if err != nil {
					errs <- err
					return
				}
				got, err := decodeAs(r.Header.Get("Content-Encoding"), r.Body)
				if r.Status != 200 || err != nil || !bytes.Equal(got, rows) {
					errs <- fmt.Errorf("status %d, Content-Encoding %q: %v", r.Status, r.Header.Get("Content-Encoding"), err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		awaitCoding(t, u, browser, "zstd", rows)
		m := scrape(t, c)
		if made := m[`caddy_syncular_variants_total{result="made"}`]; made != 1 {
			t.Fatalf("variants made = %v, want 1 (one zstd build)\n%s", made, dumpSyncular(m))
		}
	})

	t.Run("browser gets zstd", func(t *testing.T) {
		r := awaitCoding(t, url(c.Base, rowsID), browser, "zstd", rows)
		if r.Header.Get("ETag") != `"`+rowsID+`+zstd"` || !hasVary(r.Header) {
			t.Fatalf("ETag %q, Vary %q", r.Header.Get("ETag"), r.Header.Values("Vary"))
		}
		if len(r.Body) >= len(rows)*9/10 {
			t.Fatalf("zstd answer of %d bytes for a %d-byte segment", len(r.Body), len(rows))
		}
	})

	t.Run("rust client gets gzip", func(t *testing.T) {
		r := awaitCoding(t, url(c.Base, rowsID), rust, "gzip", rows)
		if r.Header.Get("ETag") != `"`+rowsID+`+gzip"` || !hasVary(r.Header) {
			t.Fatalf("ETag %q, Vary %q", r.Header.Get("ETag"), r.Header.Values("Vary"))
		}
	})

	t.Run("no Accept-Encoding gets identity", func(t *testing.T) {
		for _, hdr := range []map[string]string{nil, {"Accept-Encoding": "identity"}, {"Accept-Encoding": "br, deflate"}, {"Accept-Encoding": "gzip;q=0, zstd;q=0"}} {
			r := get(t, "GET", url(c.Base, rowsID), hdr)
			checkDecodes(t, r, rows)
			if r.Header.Get("Content-Encoding") != "" || r.Header.Get("ETag") != `"`+rowsID+`"` || !hasVary(r.Header) {
				t.Fatalf("%v: Content-Encoding %q, ETag %q, Vary %q", hdr, r.Header.Get("Content-Encoding"), r.Header.Get("ETag"), r.Header.Values("Vary"))
			}
		}
	})

	t.Run("q-values, identity;q=0 and *", func(t *testing.T) {
		for ae, want := range map[string]string{
			"identity;q=0, gzip;q=0.5": "gzip",
			"*":                        "zstd",
			"*;q=0.1, zstd;q=0":        "gzip",
			"GZIP;q=1":                 "gzip",
		} {
			r := get(t, "GET", url(c.Base, rowsID), map[string]string{"Accept-Encoding": ae})
			checkDecodes(t, r, rows)
			if r.Header.Get("Content-Encoding") != want {
				t.Errorf("Accept-Encoding %q: Content-Encoding %q, want %q", ae, r.Header.Get("Content-Encoding"), want)
			}
		}
	})

	t.Run("Range is identity", func(t *testing.T) {
		r := get(t, "GET", url(c.Base, rowsID), map[string]string{"Accept-Encoding": "gzip, zstd", "Range": "bytes=100-1099"})
		if r.Status != 206 || r.Header.Get("Content-Encoding") != "" || !bytes.Equal(r.Body, rows[100:1100]) {
			t.Fatalf("status %d, Content-Encoding %q, %d bytes", r.Status, r.Header.Get("Content-Encoding"), len(r.Body))
		}
		if r.Header.Get("ETag") != `"`+rowsID+`"` || !hasVary(r.Header) {
			t.Fatalf("ETag %q, Vary %q", r.Header.Get("ETag"), r.Header.Values("Vary"))
		}
	})

	t.Run("HEAD tells the variant GET sends", func(t *testing.T) {
		g := get(t, "GET", url(c.Base, rowsID), rust)
		h := get(t, "HEAD", url(c.Base, rowsID), rust)
		if h.Status != 200 || len(h.Body) != 0 {
			t.Fatalf("HEAD: %d with %d body bytes", h.Status, len(h.Body))
		}
		for _, k := range []string{"Content-Encoding", "Content-Length", "ETag"} {
			if h.Header.Get(k) != g.Header.Get(k) {
				t.Fatalf("HEAD %s %q, GET %q", k, h.Header.Get(k), g.Header.Get(k))
			}
		}
		if h.Header.Get("Content-Length") != strconv.Itoa(len(g.Body)) || g.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("HEAD Content-Length %s, GET sent %d bytes of %q", h.Header.Get("Content-Length"), len(g.Body), g.Header.Get("Content-Encoding"))
		}
	})

	t.Run("If-None-Match matches every variant", func(t *testing.T) {
		for _, tc := range []struct{ inm, ae, etag string }{
			{`"` + rowsID + `+gzip"`, "", `"` + rowsID + `"`},
			{`"` + rowsID + `"`, "gzip", `"` + rowsID + `+gzip"`},
			{`W/"` + rowsID + `+zstd"`, "zstd", `"` + rowsID + `+zstd"`},
		} {
			r := get(t, "GET", url(c.Base, rowsID), map[string]string{"If-None-Match": tc.inm, "Accept-Encoding": tc.ae})
			if r.Status != 304 || r.Header.Get("ETag") != tc.etag || !hasVary(r.Header) || len(r.Body) != 0 {
				t.Fatalf("If-None-Match %s, Accept-Encoding %q: %d, ETag %q, Vary %q", tc.inm, tc.ae, r.Status, r.Header.Get("ETag"), r.Header.Values("Vary"))
			}
		}
		r := get(t, "GET", url(c.Base, rowsID), map[string]string{"If-None-Match": `"` + rowsID + `+br"`, "Accept-Encoding": "gzip"})
		if r.Status != 200 {
			t.Fatalf("an ETag of no variant answered %d", r.Status)
		}
	})

	t.Run("incompressible segment is identity", func(t *testing.T) {
		u := url(c.Base, noiseID)
		for range 20 {
			r := get(t, "GET", u, browser)
			checkDecodes(t, r, noise)
			if r.Header.Get("Content-Encoding") != "" {
				t.Fatalf("an incompressible segment went out as %q", r.Header.Get("Content-Encoding"))
			}
		}
		if waitFor(10*time.Second, func() bool {
			get(t, "GET", u, browser)
			return scrape(t, c)[`caddy_syncular_variants_total{result="incompressible"}`] >= 1
		}) < 0 {
			t.Fatal("the incompressible segment was never counted")
		}
	})

	t.Run("corrupt store bytes never make a variant", func(t *testing.T) {
		made := scrape(t, c)[`caddy_syncular_variants_total{result="made"}`]
		u := url(c.Base, corruptID)
		for range 10 {
			r := get(t, "GET", u, browser)
			if r.Status == 200 || r.Header.Get("Content-Encoding") != "" {
				t.Fatalf("corrupt segment answered %d with Content-Encoding %q", r.Status, r.Header.Get("Content-Encoding"))
			}
		}
		if now := scrape(t, c)[`caddy_syncular_variants_total{result="made"}`]; now != made {
			t.Fatalf("variants made went from %v to %v on corrupt bytes", made, now)
		}
	})

	t.Run("compress off", func(t *testing.T) {
		for range 5 {
			r := get(t, "GET", url(off, rowsID), browser)
			checkDecodes(t, r, rows)
			if r.Header.Get("Content-Encoding") != "" || hasVary(r.Header) {
				t.Fatalf("compress off: Content-Encoding %q, Vary %q", r.Header.Get("Content-Encoding"), r.Header.Values("Vary"))
			}
		}
	})

	t.Run("bytes per coding", func(t *testing.T) {
		m := scrape(t, c)
		for _, k := range []string{"identity", "gzip", "zstd"} {
			sum := 0.0 // over both sites (servers); only one compresses
			for series, v := range m {
				if strings.HasPrefix(series, `caddy_syncular_coded_bytes_served_total{coding="`+k+`",`) {
					sum += v
				}
			}
			if sum <= 0 {
				t.Errorf("coded bytes %s = %v\n%s", k, sum, dumpSyncular(m))
			}
		}
		if v := m[`caddy_syncular_variants_total{result="rejected"}`]; v != 0 {
			t.Errorf("variants rejected = %v, want 0", v)
		}
	})
}

// TestCompressedProxy: proxy delivery from a real S3 server compresses
// what the bytes cache holds (one object GET, however many codings), and
// a segment larger than max_entry as its disk tier fill lands.
func TestCompressedProxy(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	small := segdata.RowsSegment(1500)
	large := segdata.RowsSegment(20000) // about 10 MB: over the default 8 MiB max_entry
	smallID, largeID := s3Segment(t, srv, small), s3Segment(t, srv, large)
	key := randomKey(t)
	c := startCaddy(t, strings.Replace(abuseSite, "ENDPOINT", srv.Endpoint, 1),
		"SEG_KEY="+key, "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
	get := func(u string, hdr map[string]string) response {
		t.Helper()
		r, err := rawGet("GET", u, hdr)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != 200 && r.Status != 206 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		return r
	}

	u := signURL(c.Base, key, smallID, 15*time.Minute)
	for _, coding := range []string{"gzip", "zstd"} {
		var r response
		if waitFor(20*time.Second, func() bool {
			r = get(u, map[string]string{"Accept-Encoding": coding})
			return r.Header.Get("Content-Encoding") == coding
		}) < 0 {
			t.Fatalf("no %s answer in proxy mode within 20s", coding)
		}
		got, err := decodeAs(coding, r.Body)
		if err != nil || !bytes.Equal(got, small) || !hasVary(r.Header) || r.Header.Get("ETag") != `"`+smallID+`+`+coding+`"` {
			t.Fatalf("%s: %v, ETag %q", coding, err, r.Header.Get("ETag"))
		}
	}
	r := get(u, map[string]string{"Accept-Encoding": "gzip", "Range": "bytes=0-99"})
	if r.Status != 206 || r.Header.Get("Content-Encoding") != "" || !bytes.Equal(r.Body, small[:100]) {
		t.Fatalf("proxy Range: %d %q", r.Status, r.Header.Get("Content-Encoding"))
	}
	if n := srv.CountRequests(t, "s3_GetObject", s3test.ObjectKey("", smallID)); n != 1 {
		t.Fatalf("%d object GETs for the small segment, want 1 (variants are built from the cached bytes)", n)
	}

	// Over max_entry: the (default) disk tier fills it once and encodes
	// its zstd variant as the fill lands, which the first answer
	// follows; every answer decodes to the segment.
	lu := signURL(c.Base, key, largeID, 15*time.Minute)
	for i := range 5 {
		r := get(lu, map[string]string{"Accept-Encoding": "gzip, zstd"})
		got, err := decodeAs(r.Header.Get("Content-Encoding"), r.Body)
		if err != nil || !bytes.Equal(got, large) {
			t.Fatalf("a segment over max_entry: a %q answer that does not decode to it (%v)", r.Header.Get("Content-Encoding"), err)
		}
		if i == 0 && r.Header.Get("Content-Encoding") != "zstd" {
			t.Fatalf("the first answer of a segment over max_entry is %q, want the zstd variant encoded as it is filled", r.Header.Get("Content-Encoding"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := srv.CountRequests(t, "s3_GetObject", s3test.ObjectKey("", largeID)); n != 1 {
		t.Fatalf("%d object GETs for the large segment, want 1 (its variant follows the fill)", n)
	}
}
