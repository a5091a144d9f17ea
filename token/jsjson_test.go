package token

import (
	"encoding/hex"
	"encoding/json"
	"math"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// Expected values below were produced by Node.js 20 (new TextDecoder(),
// JSON.parse, JSON.stringify).

func TestDecodeUTF8Lossy(t *testing.T) {
	tests := []struct{ inHex, want string }{
		{"", ""},
		{"616263", "abc"},
		{"e28241", "\uFFFDA"}, // truncated sequence: one U+FFFD (Go's per-byte rule gives two)
		{"eda080", "\uFFFD\uFFFD\uFFFD"},
		{"f09f98", "\uFFFD"},
		{"c080", "\uFFFD\uFFFD"},
		{"ff", "\uFFFD"},
		{"f4908080", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"e08080", "\uFFFD\uFFFD\uFFFD"},
		{"61e282", "a\uFFFD"},
		{"f0808080", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"e282e282ac", "\uFFFD€"},
		{"efbbbf41", "\uFEFFA"}, // the BOM is stripped by the caller
	}
	for _, tt := range tests {
		in, _ := hex.DecodeString(tt.inHex)
		if got := decodeUTF8Lossy(in); got != tt.want {
			t.Errorf("decodeUTF8Lossy(%s) = %+q, want %+q", tt.inHex, got, tt.want)
		}
	}
}

func TestAppendJSNumber(t *testing.T) {
	tests := []struct {
		f    float64
		want string
	}{
		{0, "0"},
		{math.Copysign(0, -1), "0"},
		{1, "1"},
		{-1, "-1"},
		{1.5, "1.5"},
		{1e21, "1e+21"},
		{1e20, "100000000000000000000"},
		{123456789012345680000, "123456789012345680000"},
		{1e-7, "1e-7"},
		{-1e-7, "-1e-7"},
		{1e-6, "0.000001"},
		{1.5e-7, "1.5e-7"},
		{1.23e-18, "1.23e-18"},
		{5e-324, "5e-324"},
		{math.MaxFloat64, "1.7976931348623157e+308"},
		{0.1, "0.1"},
		{1.0 / 3, "0.3333333333333333"},
		{100, "100"},
		{1750000900.5, "1750000900.5"},
		{1 << 53, "9007199254740992"},
		{1e301, "1e+301"},
	}
	for _, tt := range tests {
		if got := string(appendJSNumber(nil, tt.f)); got != tt.want {
			t.Errorf("appendJSNumber(%v) = %s, want %s", tt.f, got, tt.want)
		}
	}
}

func TestAppendJSString(t *testing.T) {
	in := "\xed\xa0\x80x\xed\xb0\x80\U0001F600\u2028<>&/\x7f\x01\x1f\b\f\n\r\t\"\\"
	want := `"\ud800x\udc00😀` + "\u2028" + `<>&/` + "\x7f" + `\u0001\u001f\b\f\n\r\t\"\\"`
	if got := string(appendJSString(nil, in)); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestParseJSON(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		in   string
		want any
		ok   bool
	}{
		{`null`, nil, true},
		{` {"a" : [1, -0.5e1, true, false, null, "x"] } `, map[string]any{"a": []any{1.0, -5.0, true, false, nil, "x"}}, true},
		{`{"a":1,"a":2}`, map[string]any{"a": 2.0}, true},
		{`{"__proto__":1}`, map[string]any{"__proto__": 1.0}, true},
		{`"\u0061\/\"\\\b\f\n\r\t"`, "a/\"\\\b\f\n\r\t", true},
		{`"\ud800"`, "\xed\xa0\x80", true},
		{`"\uDBFF\uDFFF"`, "\U0010FFFF", true},
		{`"\ud83d\ud83d\ude00"`, "\xed\xa0\xbd\U0001F600", true},
		{`"\udc00\ud800"`, "\xed\xb0\x80\xed\xa0\x80", true},
		{`"\ud800\u0041"`, "\xed\xa0\x80A", true},
		{`"\ud800\u"`, nil, false},
		{"\"\u2028\"", "\u2028", true},
		{`1E+2`, 100.0, true},
		{`1e400`, math.Inf(1), true},
		{`1e-400`, 0.0, true},
		{`[]`, []any{}, true},
		{`{}`, map[string]any{}, true},
		{deep(maxJSONDepth), nil, true},
		{deep(maxJSONDepth + 1), nil, false},
		{``, nil, false},
		{` `, nil, false},
		{`1.`, nil, false},
		{`.5`, nil, false},
		{`-`, nil, false},
		{`+1`, nil, false},
		{`1e`, nil, false},
		{`1e+`, nil, false},
		{`0x10`, nil, false},
		{`Infinity`, nil, false},
		{`NaN`, nil, false},
		{`tru`, nil, false},
		{`nulls`, nil, false},
		{`1 2`, nil, false},
		{`[1,]`, nil, false},
		{`[,1]`, nil, false},
		{`{"a":1,}`, nil, false},
		{`{"a"}`, nil, false},
		{`{a:1}`, nil, false},
		{`"\x"`, nil, false},
		{`"\u12"`, nil, false},
		{`"abc`, nil, false},
		{"\"a\x00\"", nil, false},
		{"\v1", nil, false},
		{"\uFEFF1", nil, false},
	}
	for _, tt := range tests {
		got, ok := parseJSON(tt.in)
		if ok != tt.ok {
			t.Errorf("parseJSON(%.40q) ok = %v, want %v", tt.in, ok, tt.ok)
			continue
		}
		if ok && tt.want != nil && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseJSON(%.40q) = %#v, want %#v", tt.in, got, tt.want)
		}
	}
	if v, _ := parseJSON(`-0`); !math.Signbit(v.(float64)) {
		t.Error("-0 lost its sign")
	}
}

// surrogateEscape matches a \u escape of a UTF-16 surrogate, where
// JSON.parse (kept) and encoding/json (U+FFFD) deliberately differ.
var surrogateEscape = regexp.MustCompile(`(?i)\\ud[89a-f]`)

// FuzzParseJSON checks parseJSON against encoding/json wherever the two
// are meant to agree: on valid UTF-8 both accept the same texts, and they
// produce the same values unless a surrogate escape or a number beyond
// the float64 range (an encoding/json error, Infinity in JavaScript) is
// involved.
func FuzzParseJSON(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"seg":"s","exp":1.7500009e9,"x":[1,{"y":null}]}`,
		`{"a":1,"a":2}`, `"\u0061\ud83d\ude00"`, `[1e400]`, `-0`, ` [ ] `, `01`, `{"a":}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		got, ok := parseJSON(s)
		if ok != json.Valid([]byte(s)) {
			t.Fatalf("parseJSON ok = %v, json.Valid = %v", ok, !ok)
		}
		var want any
		if !ok || surrogateEscape.MatchString(s) || json.Unmarshal([]byte(s), &want) != nil {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("parseJSON = %#v, encoding/json = %#v", got, want)
		}
	})
}
