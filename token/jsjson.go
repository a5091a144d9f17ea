package token

import (
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the JavaScript-compatible text handling that token
// verification, signing and scope digests share: TextDecoder's lossy
// UTF-8 decode, JSON.parse, and JSON.stringify's string and number
// rendering. Go's encoding/json differs from all three in ways the vectors
// exercise (escaping of <>&/U+2028, lone surrogates, number overflow).
//
// Strings model JavaScript (UTF-16) strings as UTF-8, except that an
// unpaired surrogate is kept as its 3-byte generalized UTF-8 (WTF-8)
// encoding: ED A0..BF 80..BF. Such strings are never valid UTF-8, so they
// cannot be mistaken for a well-formed string.

// maxJSONDepth bounds array/object nesting so that a hostile payload under
// a raised length cap cannot recurse without limit. JSON.parse has no such
// limit, but a payload this deep is never a real token; it is rejected as
// unparseable. encoding/json uses the same bound.
const maxJSONDepth = 10000

// decodeUTF8Lossy is new TextDecoder().decode(b) without the BOM handling:
// each maximal ill-formed subsequence becomes one U+FFFD, per the WHATWG
// Encoding Standard UTF-8 decoder. (Go's per-byte replacement differs for
// truncated multi-byte sequences.)
func decodeUTF8Lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	var (
		cp           rune
		needed, seen int
		lower, upper byte = 0x80, 0xBF
	)
	for i := 0; i < len(b); i++ {
		c := b[i]
		if needed == 0 {
			switch {
			case c <= 0x7F:
				out = append(out, c)
			case 0xC2 <= c && c <= 0xDF:
				needed, cp = 1, rune(c&0x1F)
			case 0xE0 <= c && c <= 0xEF:
				if c == 0xE0 {
					lower = 0xA0
				} else if c == 0xED {
					upper = 0x9F
				}
				needed, cp = 2, rune(c&0x0F)
			case 0xF0 <= c && c <= 0xF4:
				if c == 0xF0 {
					lower = 0x90
				} else if c == 0xF4 {
					upper = 0x8F
				}
				needed, cp = 3, rune(c&0x07)
			default:
				out = utf8.AppendRune(out, utf8.RuneError)
			}
			continue
		}
		if c < lower || c > upper {
			// The sequence so far is one error; c starts afresh.
			cp, needed, seen, lower, upper = 0, 0, 0, 0x80, 0xBF
			out = utf8.AppendRune(out, utf8.RuneError)
			i--
			continue
		}
		lower, upper = 0x80, 0xBF
		cp = cp<<6 | rune(c&0x3F)
		if seen++; seen == needed {
			out = utf8.AppendRune(out, cp)
			cp, needed, seen = 0, 0, 0
		}
	}
	if needed != 0 {
		out = utf8.AppendRune(out, utf8.RuneError)
	}
	return string(out)
}

// parseJSON parses text as JSON.parse does: only the four JSON whitespace
// characters, duplicate object keys last-wins, \u escapes with surrogate
// pairs joined and lone surrogates kept (as WTF-8), numbers as float64
// with overflow to ±Inf, and nothing but whitespace after the value. A
// JSON null yields (nil, true).
func parseJSON(text string) (any, bool) {
	p := jsonParser{s: text}
	v, ok := p.value()
	if !ok {
		return nil, false
	}
	p.skipSpace()
	return v, p.i == len(p.s)
}

type jsonParser struct {
	s     string
	i     int
	depth int
}

func (p *jsonParser) skipSpace() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value() (any, bool) {
	p.skipSpace()
	if p.i >= len(p.s) {
		return nil, false
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		return p.str()
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	case strings.HasPrefix(p.s[p.i:], "true"):
		p.i += len("true")
		return true, true
	case strings.HasPrefix(p.s[p.i:], "false"):
		p.i += len("false")
		return false, true
	case strings.HasPrefix(p.s[p.i:], "null"):
		p.i += len("null")
		return nil, true
	}
	return nil, false
}

// consume skips whitespace and then c, reporting whether c was there.
func (p *jsonParser) consume(c byte) bool {
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *jsonParser) object() (any, bool) {
	if p.depth++; p.depth > maxJSONDepth {
		return nil, false
	}
	defer func() { p.depth-- }()
	p.i++ // '{'
	obj := map[string]any{}
	if p.consume('}') {
		return obj, true
	}
	for {
		p.skipSpace()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return nil, false
		}
		k, ok := p.str()
		if !ok || !p.consume(':') {
			return nil, false
		}
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		obj[k.(string)] = v
		if p.consume('}') {
			return obj, true
		}
		if !p.consume(',') {
			return nil, false
		}
	}
}

func (p *jsonParser) array() (any, bool) {
	if p.depth++; p.depth > maxJSONDepth {
		return nil, false
	}
	defer func() { p.depth-- }()
	p.i++ // '['
	arr := []any{}
	if p.consume(']') {
		return arr, true
	}
	for {
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		arr = append(arr, v)
		if p.consume(']') {
			return arr, true
		}
		if !p.consume(',') {
			return nil, false
		}
	}
}

// str parses a string literal starting at its opening quote.
func (p *jsonParser) str() (any, bool) {
	p.i++ // '"'
	start := p.i
	var b []byte // nil until the first escape
	for p.i < len(p.s) {
		switch c := p.s[p.i]; {
		case c == '"':
			s := p.s[start:p.i]
			p.i++
			if b == nil {
				return s, true
			}
			return string(append(b, s...)), true
		case c < 0x20:
			return nil, false
		case c == '\\':
			b = append(b, p.s[start:p.i]...)
			var ok bool
			if b, ok = p.escape(b); !ok {
				return nil, false
			}
			start = p.i
		default:
			p.i++
		}
	}
	return nil, false
}

// escape appends the character of the escape sequence at p.i (a
// backslash) to b.
func (p *jsonParser) escape(b []byte) ([]byte, bool) {
	if p.i+1 >= len(p.s) {
		return b, false
	}
	c := p.s[p.i+1]
	p.i += 2
	switch c {
	case '"', '\\', '/':
		return append(b, c), true
	case 'b':
		return append(b, '\b'), true
	case 'f':
		return append(b, '\f'), true
	case 'n':
		return append(b, '\n'), true
	case 'r':
		return append(b, '\r'), true
	case 't':
		return append(b, '\t'), true
	case 'u':
		r, ok := p.hex4()
		if !ok {
			return b, false
		}
		// A high surrogate escape directly followed by a low surrogate
		// escape is one character; anything else stays a lone surrogate.
		if 0xD800 <= r && r < 0xDC00 && strings.HasPrefix(p.s[p.i:], `\u`) {
			save := p.i
			p.i += 2
			if lo, ok := p.hex4(); ok && 0xDC00 <= lo && lo <= 0xDFFF {
				r = utf16.DecodeRune(r, lo)
			} else {
				p.i = save
			}
		}
		return appendWTF8(b, r), true
	}
	return b, false
}

// hex4 reads four hex digits at p.i.
func (p *jsonParser) hex4() (rune, bool) {
	r, ok := hex4(p.s, p.i)
	if ok {
		p.i += 4
	}
	return r, ok
}

// number parses -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? and converts
// it with correct rounding, as JSON.parse does. Literals beyond the float64
// range become ±Inf (JavaScript's Infinity), tiny ones 0.
func (p *jsonParser) number() (any, bool) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.s[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.s) && p.s[p.i] == '0':
		p.i++
	case digits() == 0:
		return nil, false
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return nil, false
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, false
		}
	}
	// The grammar above admits nothing ParseFloat rejects; its only
	// possible error is ErrRange, whose result (±Inf or 0) is the
	// JavaScript value.
	f, _ := strconv.ParseFloat(p.s[start:p.i], 64)
	return f, true
}

// decodeUnit decodes the first character of s: a UTF-8 rune, a WTF-8
// encoded surrogate (returned as the surrogate code point), or, for any
// other invalid byte, utf8.RuneError with size 1.
func decodeUnit(s string) (r rune, size int) {
	r, size = utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && size == 1 && len(s) >= 3 &&
		s[0] == 0xED && 0xA0 <= s[1] && s[1] <= 0xBF && s[2]&0xC0 == 0x80 {
		return 0xD000 | rune(s[1]&0x3F)<<6 | rune(s[2]&0x3F), 3
	}
	return r, size
}

// appendWTF8 appends r as UTF-8, or as WTF-8 if r is a surrogate.
func appendWTF8(b []byte, r rune) []byte {
	if utf16.IsSurrogate(r) {
		return append(b, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return utf8.AppendRune(b, r)
}
