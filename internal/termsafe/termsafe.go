// Package termsafe renders untrusted text for a terminal: no C0 or C1
// control, bidirectional override or isolate, other invisible format
// character, or invalid UTF-8 byte reaches the output raw. The operator
// tools print partition ids, claims and other strings that come from a
// store or a token, which an attacker may have chosen: ESC ] 0 ; … BEL
// retitles a terminal, ESC [ 2 J clears it, and U+202E reverses the text
// that follows it on screen.
//
// Unsafe is every rune unicode.IsPrint refuses (controls, format
// characters such as U+061C, U+200E/F, U+202A–U+202E and U+2066–U+2069,
// separators other than the ASCII space, private use and unassigned code
// points) and every byte that is not valid UTF-8. The escapes are Go's
// (strconv.Quote: \x1b, \u202e, \U000e0001, \xff for a byte that is no
// UTF-8): they name invalid bytes exactly, which a code-point form such
// as \u{...} cannot, and a quoted field reads back with strconv.Unquote.
// The package needs the standard library only.
package termsafe

import (
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// safe reports whether r may reach a terminal as it is.
func safe(r rune) bool { return unicode.IsPrint(r) }

// Field renders one value (a partition id, a table name, a digest): as it
// is when every rune is printable and it holds no space, quote or
// backslash, else Go-quoted (strconv.Quote). A value shown in quotes was
// therefore escaped, and reads back with strconv.Unquote.
func Field(s string) string {
	if s == "" {
		return `""`
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				return strconv.Quote(s)
			}
		}
		if !safe(r) || r == ' ' || r == '"' || r == '\\' {
			return strconv.Quote(s)
		}
	}
	return s
}

// JSON renders JSON text (a token's payload) with each unsafe rune
// written as a JSON \u escape (a UTF-16 pair above U+FFFF) and each
// invalid byte as \ufffd. Inside a JSON string the escape denotes the same
// character, so the rendering of a JSON document is still JSON for the
// same value. Everything else is left as it is.
func JSON(s string) string {
	if clean(s, false) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				b.WriteString(`\ufffd`)
				continue
			}
		}
		if safe(r) {
			b.WriteRune(r)
			continue
		}
		if r > 0xFFFF {
			r1, r2 := utf16Pair(r)
			writeU(&b, r1)
			writeU(&b, r2)
			continue
		}
		writeU(&b, r)
	}
	return b.String()
}

// Text renders free text (an error message) with each unsafe rune or
// invalid byte Go-escaped in place; printable text, quotes and
// backslashes are left as they are. keepNewlines leaves '\n' raw (for
// text that is several lines on purpose).
func Text(s string, keepNewlines bool) string {
	if clean(s, keepNewlines) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				b.WriteString(`\x`)
				b.WriteString(hex2(s[i]))
				continue
			}
		}
		if safe(r) || (keepNewlines && r == '\n') {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRune(r) // '\x1b', '\u202e'
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
}

// clean reports whether s needs no escaping at all.
func clean(s string, keepNewlines bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c < 0x7f || keepNewlines && c == '\n' {
			continue
		}
		if c < utf8.RuneSelf {
			return false
		}
		// Non-ASCII: decide rune by rune from here.
		for j, r := range s[i:] {
			if r == utf8.RuneError {
				if _, n := utf8.DecodeRuneInString(s[i+j:]); n == 1 {
					return false
				}
			}
			if !safe(r) && !(keepNewlines && r == '\n') {
				return false
			}
		}
		return true
	}
	return true
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xD800 + (r>>10)&0x3FF, 0xDC00 + r&0x3FF
}

func writeU(b *strings.Builder, r rune) {
	const digits = "0123456789abcdef"
	b.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		b.WriteByte(digits[(r>>shift)&0xF])
	}
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xF]})
}

// Writer escapes what is written to w as Text with newlines kept: a last
// line of defence under output whose fields are already rendered with
// Field or JSON, so that no message of a store or library (an error's
// text) reaches the terminal raw either. Each Write is escaped on its
// own; a rune split across two writes is escaped as invalid bytes, never
// passed raw.
type Writer struct{ W io.Writer }

// Write escapes p and writes it; it reports len(p) when the escaped text
// was written whole.
func (w Writer) Write(p []byte) (int, error) {
	s := string(p)
	if clean(s, true) {
		return w.W.Write(p)
	}
	if _, err := io.WriteString(w.W, Text(s, true)); err != nil {
		return 0, err
	}
	return len(p), nil
}
