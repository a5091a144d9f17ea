package token

import (
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// JSON.stringify's string and number rendering, for signing and scope
// digests (the parsing side is jsjson.go).

// jsString returns the canonical form (see the top of this file) of the
// JavaScript string s stands for: invalid bytes become U+FFFD, and a WTF-8
// high surrogate followed by a WTF-8 low surrogate becomes the character
// they encode. Valid UTF-8 is returned unchanged.
func jsString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		r, n := decodeUnit(s[i:])
		i += n
		if 0xD800 <= r && r < 0xDC00 {
			if lo, n := decodeUnit(s[i:]); 0xDC00 <= lo && lo <= 0xDFFF {
				r = utf16.DecodeRune(r, lo)
				i += n
			}
		}
		b = appendWTF8(b, r)
	}
	return string(b)
}

// appendJSString appends JSON.stringify(s): only '"', '\' and U+0000..U+001F
// are escaped (\b \f \n \r \t in short form, the rest as lowercase \u00xx);
// a lone surrogate is escaped as lowercase \udxxx (well-formed
// JSON.stringify); everything else, including < > & / U+2028 U+2029 and
// all non-ASCII, is written raw as UTF-8.
func appendJSString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	s = jsString(s)
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, n := decodeUnit(s[i:])
			if utf16.IsSurrogate(r) {
				b = append(b, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
			} else {
				b = append(b, s[i:i+n]...)
			}
			i += n
			continue
		}
		i++
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			} else {
				b = append(b, c)
			}
		}
	}
	return append(b, '"')
}

// appendJSNumber appends the ECMAScript Number::toString rendering of the
// finite number f, which is what JSON.stringify writes: the shortest
// round-trip digits, in plain decimal for 1e-7 <= |f| < 1e21 and as
// d.ddde±x otherwise (e.g. 1e+21, 1.5e-7); -0 is "0".
func appendJSNumber(b []byte, f float64) []byte {
	if f == 0 {
		return append(b, '0')
	}
	if f < 0 {
		b = append(b, '-')
		f = -f
	}
	// 'e' with precision -1 gives the shortest digits as d[.ddd]e±xx.
	mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k, n := len(digits), x+1 // n: position of the decimal point
	switch {
	case k <= n && n <= 21:
		b = append(b, digits...)
		b = append(b, strings.Repeat("0", n-k)...)
	case 0 < n && n <= 21:
		b = append(b, digits[:n]...)
		b = append(b, '.')
		b = append(b, digits[n:]...)
	case -6 < n && n <= 0:
		b = append(b, "0."...)
		b = append(b, strings.Repeat("0", -n)...)
		b = append(b, digits...)
	default:
		b = append(b, digits[0])
		if k > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		if n-1 >= 0 {
			b = append(b, '+')
		}
		b = strconv.AppendInt(b, int64(n-1), 10)
	}
	return b
}
