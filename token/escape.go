package token

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The report prints strings an attacker may have chosen (claims, the
// URL's segment) to an operator's terminal, so no control, bidirectional
// override, other invisible format character or invalid UTF-8 byte may
// reach it raw. These are private copies of internal/termsafe's Field,
// JSON and Text: the package needs the standard library only, and a
// test checks the copies against termsafe.

// escField is termsafe.Field: s as it is when every rune is printable
// and it holds no space, quote or backslash, else Go-quoted.
func escField(s string) string {
	if s == "" {
		return `""`
	}
	for i, r := range s {
		if invalidAt(s, i, r) || !unicode.IsPrint(r) || r == ' ' || r == '"' || r == '\\' {
			return strconv.Quote(s)
		}
	}
	return s
}

// escJSON is termsafe.JSON: JSON text with each unsafe rune written as a
// JSON \u escape (a UTF-16 pair above U+FFFF) and each invalid byte as
// \ufffd, so a JSON document stays JSON for the same value.
func escJSON(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case invalidAt(s, i, r):
			b.WriteString(`\ufffd`)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r > 0xFFFF:
			r -= 0x10000
			writeU(&b, 0xD800+(r>>10)&0x3FF)
			writeU(&b, 0xDC00+r&0x3FF)
		default:
			writeU(&b, r)
		}
	}
	return b.String()
}

// escText is termsafe.Text without kept newlines: each unsafe rune or
// invalid byte Go-escaped in place, everything else as it is.
func escText(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case invalidAt(s, i, r):
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}

// invalidAt reports whether r, decoded at s[i], stands for a byte that is
// not UTF-8 (rather than a real U+FFFD).
func invalidAt(s string, i int, r rune) bool {
	if r != utf8.RuneError {
		return false
	}
	_, n := utf8.DecodeRuneInString(s[i:])
	return n == 1
}

func writeU(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	b.WriteString(strconv.FormatUint(uint64(r)|0x10000, 16)[1:])
}
