package token

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// TestReportStringEscapes: Report.String shows every string of the token
// and of the options escaped (C0 and C1 controls, bidi overrides and
// isolates, invalid UTF-8), in each verdict's wording.
func TestReportStringEscapes(t *testing.T) {
	payload := "{\"v\":{\"\u202e\":\"\u0085\"},\"seg\":\"sha256:\\u001b]0;t\\u0007\\u001b[2J\",\"sd\":\"\u2066\u200f\u061c\xff\"," +
		"\"aud\":\"\u009b2J\u202a\u202b\u202c\u202d\u2067\u2068\u2069\u200e\",\"exp\":1}"
	tok := base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".AAAA"
	v1 := "{\"v\":1,\"seg\":\"s\u202e\",\"sd\":\"d\",\"aud\":\"a\",\"exp\":9999999999}"
	tok1 := base64.RawURLEncoding.EncodeToString([]byte(v1)) + ".AAAA"
	hostile := "\x1b]0;title\x07\x1b[2J\u202e\x9b\xff"
	now := time.Unix(1800000000, 0)
	for _, c := range []struct {
		tok  string
		opts InspectOptions
	}{
		{tok, InspectOptions{Now: now}},
		{tok, InspectOptions{Now: now, SegmentID: hostile, ScopeDigest: hostile, Audience: hostile}},
		{tok, InspectOptions{Now: now, Keys: [][]byte{[]byte("0123456789abcdef")}, SegmentID: hostile}},
		{tok1, InspectOptions{Now: now, SegmentID: hostile}}, // segment mismatch, with the URL's segment in the words
		{tok1, InspectOptions{Now: now, SegmentID: "s\u202e", ScopeDigest: hostile, Audience: "a"}},
	} {
		out := Inspect(c.tok, c.opts).String()
		if !utf8.ValidString(out) {
			t.Fatalf("not valid UTF-8: %q", out)
		}
		for _, r := range out {
			if r != '\n' && !unicode.IsPrint(r) {
				t.Fatalf("report holds %U raw:\n%q", r, out)
			}
		}
		if !strings.Contains(out, "claims:") {
			t.Fatalf("no claims line:\n%s", out)
		}
	}
}
