package caddymodule

import (
	"bytes"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/token"
)

const fuzzID = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// FuzzSegmentFromPath: whatever the request path, the handler only ever
// takes a well-formed segment id from its last element, and that id is
// what the decoded path ends with (no '/', '..', NUL or percent sign can
// survive into it).
func FuzzSegmentFromPath(f *testing.F) {
	enc := strings.Replace(fuzzID, ":", "%3A", 1)
	for _, s := range []string{
		"/segments/" + fuzzID,
		"/sync/segments/" + enc,
		"/segments/" + strings.Replace(fuzzID, ":", "%3a", 1),
		"/segments/%73ha256%3A" + fuzzID[7:],
		"/segments/" + fuzzID + "/",
		"/segments/" + fuzzID + "%00",
		"/segments/%00" + fuzzID,
		"/segments/..%2F" + fuzzID,
		"/segments/../" + fuzzID,
		"/segments/" + fuzzID + "/..",
		"/segments/" + fuzzID + "%2F..",
		"/segments/" + fuzzID + ";x=1",
		"/segments/" + fuzzID + "%",
		"/segments/" + fuzzID + "%4",
		"/segments/%",
		"/segments/" + strings.ToUpper(fuzzID),
		"/segments/" + fuzzID + "0",
		"/segments/" + strings.Repeat("%41", 300),
		"/segments/" + strings.Repeat("a", 10000),
		"/" + enc,
		"",
		"/",
		"//",
		"%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		u, err := url.ParseRequestURI("http://edge" + p)
		if err != nil {
			u = &url.URL{Path: p} // a raw path the parser refuses: still no panic
		}
		pid, ok := segmentFromPath(u)
		id := pid.String()
		// The shortcut for URLs without RawPath agrees with the
		// definition; URLs built by hand (not by the parser) too.
		for _, v := range []*url.URL{u, {Path: u.Path}, {Path: u.Path, RawPath: u.EscapedPath()}} {
			got, gotOK := segmentFromPath(v)
			if want, wantOK := segmentFromEscapedPath(v); got != want || gotOK != wantOK {
				t.Fatalf("%q as %#v: segmentFromPath = %q %v, by definition %q %v", p, v, got, gotOK, want, wantOK)
			}
		}
		if !ok {
			if !pid.IsZero() {
				t.Fatalf("refused path returned id %q", id)
			}
			return
		}
		if !segid.Valid(id) || len(id) != 71 {
			t.Fatalf("accepted %q from %q", id, p)
		}
		if !strings.HasSuffix(u.Path, "/"+id) && u.Path != id {
			t.Fatalf("id %q is not the last element of decoded path %q", id, u.Path)
		}
		if strings.ContainsAny(id, "/%;\x00.") {
			t.Fatalf("id %q carries path syntax", id)
		}
	})
}

// FuzzStParams: stParams agrees with net/url's query parser wherever that
// parser accepts the query, and never invents or drops an st value.
func FuzzStParams(f *testing.F) {
	for _, s := range []string{
		"st=abc.def",
		"st=a&st=b",
		"%73t=a&st=b",
		"%73%74=a",
		"st",
		"st=",
		"st=%zz",
		"st=a%",
		"a=1;st=b",
		"st=a;b",
		"s+t=a",
		"st=a+b%2Bc",
		"&&st=x&&",
		"x=%&st=y",
		"ST=a",
		"st%3Dx=y",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		tokens, present := stParams(raw)
		if present != (len(tokens) > 0) {
			t.Fatalf("present=%v with %d tokens", present, len(tokens))
		}
		if len(tokens) > strings.Count(raw, "&")+1 {
			t.Fatalf("%d tokens from %q", len(tokens), raw)
		}
		vals, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		want := vals["st"]
		if len(want) == 0 {
			want = nil
		}
		if len(tokens) == 0 {
			tokens = nil
		}
		if !reflect.DeepEqual(tokens, want) {
			t.Fatalf("stParams(%q) = %q, url.ParseQuery = %q", raw, tokens, want)
		}
	})
}

// FuzzParseRange: a partial range always lies inside the body and is
// never empty; a multi-range or oversize header is never partial; nothing
// panics, whatever the size.
func FuzzParseRange(f *testing.F) {
	for _, s := range []struct {
		h    string
		size int64
	}{
		{"bytes=0-0", 1}, {"bytes=0-", 10}, {"bytes=-5", 10}, {"bytes=-0", 10},
		{"bytes=5-2", 10}, {"bytes=10-", 10}, {"bytes=9-9", 10}, {"bytes=0-99999999999999999999", 10},
		{"bytes=-999999999999999999", 3}, {"bytes=0-1,3-4", 10}, {"bytes= 1 - 2 ", 10},
		{"bytes=0-0", 0}, {"bytes=-1", 0}, {"items=0-1", 10}, {"bytes=+1-2", 10}, {"bytes=1--2", 10},
		{"bytes=" + strings.Repeat("0", 300) + "-", 10}, {"bytes=9223372036854775807-", 1 << 62},
		{"bytes=0-9223372036854775807", 1 << 62}, {"bytes=-9223372036854775807", 1 << 62},
	} {
		f.Add(s.h, s.size)
	}
	f.Fuzz(func(t *testing.T, h string, size int64) {
		if size < 0 {
			size = ^size // any non-negative value, MaxInt64 included
		}
		br, rr := parseRange(h, size)
		switch rr {
		case rangePartial:
			if br.off < 0 || br.n < 1 || br.off >= size || br.n > size-br.off {
				t.Fatalf("parseRange(%q, %d) = %+v: outside the body", h, size, br)
			}
			if strings.Contains(h, ",") || len(h) > maxRangeHeader {
				t.Fatalf("parseRange(%q) honoured a multi-range or oversize header", h)
			}
			cr := br.contentRange(size)
			want := "bytes " + strconv.FormatInt(br.off, 10) + "-" + strconv.FormatInt(br.off+br.n-1, 10) + "/" + strconv.FormatInt(size, 10)
			if cr != want {
				t.Fatalf("Content-Range %q, want %q", cr, want)
			}
		case rangeNone:
			if br != (byteRange{}) {
				t.Fatalf("rangeNone with %+v", br)
			}
		case rangeUnsatisfiable:
			if br != (byteRange{}) {
				t.Fatalf("rangeUnsatisfiable with %+v", br)
			}
		default:
			t.Fatalf("unknown result %d", rr)
		}
	})
}

// FuzzServeNeverWronglyGrants drives the whole handler with arbitrary
// paths, queries and Range headers against a store holding one segment.
// Nothing panics, every answer is a success only for a request carrying
// exactly one genuine token for that segment, success bodies are slices
// of the stored bytes, and every refusal is a catalog JSON error.
func FuzzServeNeverWronglyGrants(f *testing.F) {
	fs := newFakeStore()
	body := []byte("SSG2 fuzz segment body, a few bytes long")
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(f, fs, func(h *Handler) { h.Untokened = "reject" })
	good := mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))
	other := mintToken(id, digestB, "aud:p1", testNow.Add(time.Minute))
	for _, s := range []struct{ path, query, rng string }{
		{"/segments/" + id, "st=" + good, ""},
		{"/segments/" + id, "st=" + good, "bytes=3-7"},
		{"/segments/" + id, "st=" + good, "bytes=-4"},
		{"/segments/" + id, "st=" + good, "bytes=0-1,4-5"},
		{"/segments/" + id, "st=" + good, "bytes=99-"},
		{"/segments/" + strings.Replace(id, ":", "%3A", 1), "st=" + good, ""},
		{"/segments/" + id, "st=" + good + "&st=" + good, ""},
		{"/segments/" + id, "st=" + other, ""},
		{"/segments/" + id, "st=" + good[:len(good)-2], ""},
		{"/segments/" + id, "%73t=" + good, ""},
		{"/segments/" + id + "/..", "st=" + good, ""},
		{"/segments/" + id, "st=" + strings.Repeat("A", 5000), ""},
		{"/segments/" + id, "", ""},
	} {
		f.Add(s.path, s.query, s.rng)
	}
	f.Fuzz(func(t *testing.T, p, q, rng string) {
		target := "http://edge" + p
		if q != "" {
			target += "?" + q
		}
		// A request line cannot carry whitespace or controls (and
		// httptest.NewRequest panics on them): not a request Caddy delivers.
		if _, err := url.ParseRequestURI(target); err != nil || strings.ContainsAny(p, "?#") ||
			strings.ContainsFunc(target, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return
		}
		rec, _ := serve(t, h, "GET", target, map[string]string{"Range": rng})
		if rec.Code == 200 || rec.Code == 206 {
			toks, _ := stParams(q)
			segID, okPath := segmentFromPath(mustURL(t, target))
			if len(toks) != 1 || !okPath || segID.String() != id {
				t.Fatalf("granted %s with tokens %q", target, toks)
			}
			if _, _, err := token.NewVerifier([][]byte{testKey}, token.DefaultSkew, 0).Verify(toks[0], id, testNow); err != nil {
				t.Fatalf("granted a token the verifier refuses: %v", err)
			}
			if !bytes.Contains(body, rec.Body.Bytes()) || rec.Body.Len() == 0 {
				t.Fatalf("success body %q is not a slice of the segment", rec.Body.Bytes())
			}
			if rec.Code == 200 && !bytes.Equal(rec.Body.Bytes(), body) {
				t.Fatalf("200 with a partial body")
			}
			return
		}
		wantFuzzError(t, rec.Code, rec.Header(), rec.Body.Bytes())
	})
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.ParseRequestURI(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// wantFuzzError checks that a refusal is one of the catalog's answers.
func wantFuzzError(t *testing.T, status int, hdr http.Header, b []byte) {
	t.Helper()
	codes := map[int][]string{
		403: {"sync.forbidden"}, 404: {"sync.not_found", "sync.segment_expired"},
		416: {"edge.range_not_satisfiable"},
	}[status]
	if codes == nil || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("unexpected answer %d %v %q", status, hdr, b)
	}
	for _, c := range codes {
		if bytes.HasPrefix(b, []byte(`{"code":"`+c+`"`)) {
			return
		}
	}
	t.Fatalf("status %d with body %q", status, b)
}

// TestForgedTokenRevealsNothing: for a refused token the answer about an
// existing segment and about a segment that does not exist is byte for
// byte the same (status, headers, body), and the store is never asked, so
// neither the answer nor its cost depends on what the store holds.
func TestForgedTokenRevealsNothing(t *testing.T) {
	fs := newFakeStore()
	exists := fs.add([]byte("a stored segment"), pub("p1", digestA, testNow.Add(time.Hour)))
	missing := "sha256:" + strings.Repeat("7", 64)
	h := newTestHandler(t, fs, nil)
	exp := testNow.Add(time.Minute)
	forgeries := map[string]func(seg string) string{
		"wrong key": func(seg string) string {
			return token.Sign([]byte("not-the-edge-key"), seg, digestA, "aud:p1", exp.Unix())
		},
		"truncated mac": func(seg string) string { t := mintToken(seg, digestA, "aud:p1", exp); return t[:len(t)-3] },
		"flipped mac": func(seg string) string {
			t := []byte(mintToken(seg, digestA, "aud:p1", exp))
			if t[len(t)-1] == 'A' {
				t[len(t)-1] = 'B'
			} else {
				t[len(t)-1] = 'A'
			}
			return string(t)
		},
		"expired":        func(seg string) string { return mintToken(seg, digestA, "aud:p1", testNow.Add(-time.Hour)) },
		"other segment":  func(string) string { return mintToken("sha256:"+strings.Repeat("5", 64), digestA, "aud:p1", exp) },
		"garbage":        func(string) string { return "not-a-token" },
		"oversize":       func(seg string) string { return strings.Repeat("A", 5000) + mintToken(seg, digestA, "aud:p1", exp) },
		"payload swap":   func(seg string) string { return swapPayload(mintToken(seg, digestA, "aud:p1", exp)) },
		"no mac":         func(seg string) string { p, _, _ := strings.Cut(mintToken(seg, digestA, "aud:p1", exp), "."); return p },
		"empty":          func(string) string { return "" },
		"two dots":       func(seg string) string { return mintToken(seg, digestA, "aud:p1", exp) + ".x" },
		"padding abuse":  func(seg string) string { return mintToken(seg, digestA, "aud:p1", exp) + "====" },
		"whitespace mac": func(seg string) string { return mintToken(seg, digestA, "aud:p1", exp) + "%20A" },
	}
	for name, forge := range forgeries {
		t.Run(name, func(t *testing.T) {
			for _, method := range []string{"GET", "HEAD"} {
				a, _ := serve(t, h, method, "/segments/"+exists+"?st="+forge(exists), nil)
				b, _ := serve(t, h, method, "/segments/"+missing+"?st="+forge(missing), nil)
				if a.Code != 403 || b.Code != 403 {
					t.Fatalf("%s: statuses %d and %d, want 403", method, a.Code, b.Code)
				}
				if !reflect.DeepEqual(a.Header(), b.Header()) {
					t.Fatalf("%s: headers differ:\n%v\n%v", method, a.Header(), b.Header())
				}
				if !bytes.Equal(a.Body.Bytes(), b.Body.Bytes()) {
					t.Fatalf("%s: bodies differ:\n%s\n%s", method, a.Body.Bytes(), b.Body.Bytes())
				}
			}
		})
	}
	if l, o := fs.counts(); l != 0 || o != 0 {
		t.Fatalf("forged tokens reached the store: %d lookups, %d opens", l, o)
	}
}

// swapPayload re-encodes the payload with a different exp, keeping the MAC.
func swapPayload(tok string) string {
	p, m, _ := strings.Cut(tok, ".")
	return strings.Replace(p, "e", "f", 1) + "." + m
}

// TestManyRangesBounded: a request naming thousands of ranges (or a huge
// Range header) costs one whole-body answer, never a multipart body.
func TestManyRangesBounded(t *testing.T) {
	fs := newFakeStore()
	body := bytes.Repeat([]byte("0123456789"), 100)
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	url := "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))
	var many strings.Builder
	many.WriteString("bytes=")
	for i := 0; i < 5000; i++ {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(strconv.Itoa(i%1000) + "-" + strconv.Itoa(i%1000))
	}
	for _, rng := range []string{many.String(), "bytes=0-0,0-0", "bytes=0-" + strings.Repeat("9", 300), "bytes=" + strings.Repeat(" ", 1000) + "0-0"} {
		rec, _ := serve(t, h, "GET", url, map[string]string{"Range": rng})
		if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), body) || rec.Header().Get("Content-Range") != "" {
			t.Fatalf("Range of %d bytes: %d, %d body bytes, Content-Range %q", len(rng), rec.Code, rec.Body.Len(), rec.Header().Get("Content-Range"))
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/octet-stream" {
			t.Fatalf("Content-Type %q (multipart?)", ct)
		}
	}
	if _, o := fs.counts(); o != 4 {
		t.Fatalf("%d store opens for 4 requests", o)
	}
}
