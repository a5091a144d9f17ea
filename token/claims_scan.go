package token

import (
	"strings"
	"unicode/utf16"
)

// This file is the JSON grammar under decodeClaims (claims.go): a
// scanner that validates any JSON value as jsonParser accepts it (the
// depth bound included) without building it, and decodes string literal
// contents. It knows nothing of claims.

// claimsDecoder scans s from offset i; depth counts the containers open.
type claimsDecoder struct {
	s     string
	i     int
	depth int
}

func (d *claimsDecoder) skipSpace() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// atEnd skips trailing whitespace and reports whether nothing follows.
func (d *claimsDecoder) atEnd() bool {
	d.skipSpace()
	return d.i == len(d.s)
}

// consume skips whitespace and then c, reporting whether c was there.
func (d *claimsDecoder) consume(c byte) bool {
	d.skipSpace()
	if d.i < len(d.s) && d.s[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *claimsDecoder) value() bool {
	d.skipSpace()
	if d.i >= len(d.s) {
		return false
	}
	switch c := d.s[d.i]; {
	case c == '{':
		return d.skipObject()
	case c == '[':
		return d.skipArray()
	case c == '"':
		_, _, _, ok := d.str()
		return ok
	case c == '-' || '0' <= c && c <= '9':
		return d.number()
	case strings.HasPrefix(d.s[d.i:], "true"):
		d.i += len("true")
		return true
	case strings.HasPrefix(d.s[d.i:], "false"):
		d.i += len("false")
		return true
	case strings.HasPrefix(d.s[d.i:], "null"):
		d.i += len("null")
		return true
	}
	return false
}

func (d *claimsDecoder) skipObject() bool {
	if d.depth++; d.depth > maxJSONDepth {
		return false
	}
	d.i++ // '{'
	if d.consume('}') {
		d.depth--
		return true
	}
	for {
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			return false
		}
		if _, _, _, ok := d.str(); !ok || !d.consume(':') || !d.value() {
			return false
		}
		if d.consume('}') {
			d.depth--
			return true
		}
		if !d.consume(',') {
			return false
		}
	}
}

func (d *claimsDecoder) skipArray() bool {
	if d.depth++; d.depth > maxJSONDepth {
		return false
	}
	d.i++ // '['
	if d.consume(']') {
		d.depth--
		return true
	}
	for {
		if !d.value() {
			return false
		}
		if d.consume(']') {
			d.depth--
			return true
		}
		if !d.consume(',') {
			return false
		}
	}
}

// str validates the string literal whose opening quote is at d.i and
// returns the bounds of its contents and whether they contain escapes.
func (d *claimsDecoder) str() (start, end int, escaped, ok bool) {
	d.i++ // '"'
	start = d.i
	for {
		d.i = skipPlain(d.s, d.i)
		for d.i < len(d.s) && !strSpecial[d.s[d.i]] {
			d.i++
		}
		if d.i >= len(d.s) {
			break
		}
		switch c := d.s[d.i]; {
		case c == '"':
			end = d.i
			d.i++
			return start, end, escaped, true
		case c < 0x20:
			return 0, 0, false, false
		case c == '\\':
			escaped = true
			if d.i+1 >= len(d.s) {
				return 0, 0, false, false
			}
			switch d.s[d.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				d.i += 2
			case 'u':
				if _, ok := hex4(d.s, d.i+2); !ok {
					return 0, 0, false, false
				}
				d.i += 6
			default:
				return 0, 0, false, false
			}
		}
	}
	return 0, 0, false, false
}

// skipPlain returns the index of the first 8-byte word at or after i
// that holds a byte strSpecial marks, or of the last partial word: a
// string literal's contents are mostly long runs of ordinary bytes (hex
// digests, base64url audiences), which it passes a word at a time; str
// then finds the byte within the word. (The zero-byte tests below can
// also flag a byte above a special one, after a borrow, never a word
// without one.)
func skipPlain(s string, i int) int {
	const (
		ones = 0x0101010101010101
		high = 0x8080808080808080
	)
	for i+8 <= len(s) {
		w := s[i : i+8]
		x := uint64(w[0]) | uint64(w[1])<<8 | uint64(w[2])<<16 | uint64(w[3])<<24 |
			uint64(w[4])<<32 | uint64(w[5])<<40 | uint64(w[6])<<48 | uint64(w[7])<<56
		q := x ^ (ones * '"')
		b := x ^ (ones * '\\')
		// A zero byte in q or b is a quote or a backslash; a byte below
		// 0x20 in x is a control character.
		if ((q-ones)&^q|(b-ones)&^b|(x-ones*0x20)&^x)&high != 0 {
			return i
		}
		i += 8
	}
	return i
}

// strSpecial marks the bytes str must look at: '"', '\\' and the
// control characters a string literal may not contain.
var strSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// number validates -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at d.i.
func (d *claimsDecoder) number() bool {
	digits := func() int {
		n := 0
		for d.i < len(d.s) && '0' <= d.s[d.i] && d.s[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.s[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i < len(d.s) && d.s[d.i] == '0':
		d.i++
	case digits() == 0:
		return false
	}
	if d.i < len(d.s) && d.s[d.i] == '.' {
		d.i++
		if digits() == 0 {
			return false
		}
	}
	if d.i < len(d.s) && (d.s[d.i] == 'e' || d.s[d.i] == 'E') {
		d.i++
		if d.i < len(d.s) && (d.s[d.i] == '+' || d.s[d.i] == '-') {
			d.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// hex4 reads the four hex digits at s[i:] (jsonParser uses it too).
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// appendUnescaped appends the value of the string literal contents raw,
// which str has validated, to b: escapes decoded, a \u high surrogate
// directly followed by a \u low surrogate joined, any other surrogate
// kept as WTF-8 (as jsonParser.escape does).
func appendUnescaped(b []byte, raw string) []byte {
	for i := 0; i < len(raw); {
		j := strings.IndexByte(raw[i:], '\\')
		if j < 0 {
			return append(b, raw[i:]...)
		}
		b = append(b, raw[i:i+j]...)
		i += j
		c := raw[i+1]
		i += 2
		switch c {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, _ := hex4(raw, i)
			i += 4
			if 0xD800 <= r && r < 0xDC00 && strings.HasPrefix(raw[i:], `\u`) {
				if lo, ok := hex4(raw, i+2); ok && 0xDC00 <= lo && lo <= 0xDFFF {
					r = utf16.DecodeRune(r, lo)
					i += 6
				}
			}
			b = appendWTF8(b, r)
		default: // '"', '\\', '/'
			b = append(b, c)
		}
	}
	return b
}
