package termsafe

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// hostile holds one string per class of character that must never reach
// a terminal raw.
func hostile() map[string]string {
	c1 := ""
	for r := rune(0x80); r <= 0x9f; r++ {
		c1 += string(r)
	}
	raw8bit := ""
	for c := 0x80; c <= 0x9f; c++ {
		raw8bit += string([]byte{byte(c)}) // 0x9b is CSI on an 8-bit terminal
	}
	return map[string]string{
		"osc title and clear": "p\x1b]0;pwned\x07\x1b[2Jq",
		"c0 and del":          "a\x00\x01\t\r\n\x7fz",
		"c1 as code points":   c1,
		"c1 as raw bytes":     raw8bit,
		"bidi":                "a\u202ab\u202bc\u202cd\u202de\u202ef\u2066g\u2067h\u2068i\u2069j\u200ek\u200fl\u061cm",
		"invalid utf-8":       "x\xff\xfe\xc0\xafy\xed\xa0\x80",
		"line separators":     "a\u2028b\u2029c\u0085d",
		"zero width and tags": "a\u200bb\u200dc\ufeffd\U000e0041e",
	}
}

// assertSafe fails when s holds a rune a terminal would act on.
func assertSafe(t *testing.T, what, s string, newlinesOK bool) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Fatalf("%s: output is not valid UTF-8: %q", what, s)
	}
	for _, r := range s {
		if r == '\n' && newlinesOK {
			continue
		}
		if !safe(r) {
			t.Fatalf("%s: output holds %U raw: %q", what, r, s)
		}
	}
	// Belt and braces: none of the named characters, by value.
	for _, r := range []rune{0x1b, 0x07, 0x9b, 0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069, 0x200e, 0x200f, 0x061c} {
		if strings.ContainsRune(s, r) {
			t.Fatalf("%s: output holds %U", what, r)
		}
	}
}

func TestFieldEscapesEveryClass(t *testing.T) {
	for name, s := range hostile() {
		got := Field(s)
		assertSafe(t, name, got, false)
		back, err := strconv.Unquote(got)
		if err != nil || back != s {
			t.Errorf("%s: Field %q does not read back (%v)", name, got, err)
		}
	}
	for _, plain := range []string{"tenant-42", "sha256:00ff", "été", "日本", "a_b.c/d"} {
		if got := Field(plain); got != plain {
			t.Errorf("Field(%q) = %q, want it unchanged", plain, got)
		}
	}
	for _, s := range []string{"", "a b", `say "x"`, `back\slash`, `"quoted"`} {
		if got := Field(s); got != strconv.Quote(s) {
			t.Errorf("Field(%q) = %q, want it quoted (a plain rendering would be ambiguous)", s, got)
		}
	}
}

func TestJSONEscapesEveryClassAndKeepsTheValue(t *testing.T) {
	for name, s := range hostile() {
		got := JSON(s)
		assertSafe(t, name, got, false)
	}
	// Inside JSON strings the escapes denote the same characters.
	doc := "{\"aud\":\"a\u202eb\u2066c\U000e0041\",\"seg\":\"x\u0085y\",\"v\":1}"
	got := JSON(doc)
	assertSafe(t, "json document", got, false)
	var want, have any
	if err := json.Unmarshal([]byte(doc), &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(got), &have); err != nil {
		t.Fatalf("escaped document is not JSON: %v: %s", err, got)
	}
	if a, b := mustJSON(t, want), mustJSON(t, have); a != b {
		t.Errorf("escaped document decodes to %s, want %s", b, a)
	}
	if plain := `{"seg":"sha256:00","aud":"été","v":1}`; JSON(plain) != plain {
		t.Errorf("JSON changed a clean document: %s", JSON(plain))
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestTextAndWriter(t *testing.T) {
	for name, s := range hostile() {
		assertSafe(t, name, Text(s, false), false)
		var b bytes.Buffer
		n, err := Writer{&b}.Write([]byte(s))
		if err != nil || n != len(s) {
			t.Fatalf("%s: Write = %d, %v", name, n, err)
		}
		assertSafe(t, name+" (writer)", b.String(), true)
	}
	if got := Text("a\x1b[2Jb\nc", true); got != `a\x1b[2Jb`+"\nc" {
		t.Errorf("Text = %q", got)
	}
	if got := Text("a\xffb\u202ec", false); got != `a\xffb\u202ec` {
		t.Errorf("Text = %q", got)
	}
	if got := Text(`plain "text" \ kept`, false); got != `plain "text" \ kept` {
		t.Errorf("Text changed clean text: %q", got)
	}
}
