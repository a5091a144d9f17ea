package token

import (
	"strconv"
	"strings"
	"unicode/utf16"
)

// This file decodes a token payload straight into the five claims the
// edge looks at, with the outcome parseJSON followed by the reference's
// property reads would give: the whole text is validated as JSON (extra
// members, nested values and the depth bound included), duplicate keys
// are last-wins, keys and values may be escaped, and a claim of the wrong
// JSON type is as good as missing. It builds no map and, for strings
// without escapes, no copies: the string claims alias the payload text.
// FuzzClaimsDifferential holds it to parseJSON on arbitrary input.

// claimsStatus is what the JSON text as a whole turned out to be.
type claimsStatus uint8

const (
	claimsObject      claimsStatus = iota // a JSON object: the claims are read from it
	claimsUnparseable                     // not JSON: JSON.parse throws
	claimsNull                            // JSON null: reading claims.v throws
	claimsOther                           // array, string, number or boolean: no own claims
)

// Bits of claimFields.has: the claim is present with the JSON type the
// reference needs (number for v and exp, string for the rest).
const (
	hasV = 1 << iota
	hasExp
	hasSeg
	hasSD
	hasAud
)

// claimFields holds the claims of a payload object. A field is only
// meaningful when its has bit is set.
type claimFields struct {
	v, exp       float64
	seg, sd, aud string
	has          uint8
}

// claimKey numbers the members the decoder captures.
type claimKey uint8

const (
	keyOther claimKey = iota
	keyV
	keyExp
	keySeg
	keySD
	keyAud
)

// span is the text of the last value seen for a claim: a number literal,
// or the contents of a string literal between its quotes.
type span struct {
	start, end int
	escaped    bool // a string with backslash escapes: must be decoded
}

// decodeClaims decodes text (the payload after UTF-8 decoding and BOM
// strip). For claimsObject the fields are the claims; for every other
// status they are zero.
func decodeClaims(text string) (claimFields, claimsStatus) {
	d := claimsDecoder{s: text}
	d.skipSpace()
	if d.i >= len(d.s) || d.s[d.i] != '{' {
		isNull := strings.HasPrefix(d.s[d.i:], "null")
		if !d.value() || !d.atEnd() {
			return claimFields{}, claimsUnparseable
		}
		if isNull {
			return claimFields{}, claimsNull
		}
		return claimFields{}, claimsOther
	}
	var (
		spans [keyAud + 1]span
		is    uint8 // which spans hold a value of the right type
	)
	if !d.object(&spans, &is) || !d.atEnd() {
		return claimFields{}, claimsUnparseable
	}
	var f claimFields
	f.has = is
	if is&hasV != 0 {
		f.v = parseNumber(text, spans[keyV])
	}
	if is&hasExp != 0 {
		f.exp = parseNumber(text, spans[keyExp])
	}
	if is&hasSeg != 0 {
		f.seg = stringValue(text, spans[keySeg])
	}
	if is&hasSD != 0 {
		f.sd = stringValue(text, spans[keySD])
	}
	if is&hasAud != 0 {
		f.aud = stringValue(text, spans[keyAud])
	}
	return f, claimsObject
}

// parseNumber converts a number literal the grammar accepted; see
// jsonParser.number for why the error can be ignored.
func parseNumber(text string, sp span) float64 {
	lit := text[sp.start:sp.end]
	if lit == "1" {
		return 1 // v, every time
	}
	if f, ok := parseSmallInt(lit); ok {
		return f // exp, every time
	}
	f, _ := strconv.ParseFloat(lit, 64)
	return f
}

// parseSmallInt converts a literal of at most 15 digits with an optional
// '-', and nothing else, exactly: every such integer is a float64, so the
// result is the one ParseFloat rounds to (negative zero included).
func parseSmallInt(lit string) (float64, bool) {
	digits := strings.TrimPrefix(lit, "-")
	if len(digits) == 0 || len(digits) > 15 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if len(digits) < len(lit) {
		return -float64(n), true // -0 for "-0", as ParseFloat
	}
	return float64(n), true
}

// stringValue returns the string literal's value: a substring of text when
// it has no escapes (text is immutable, so aliasing it is safe), a new
// string otherwise.
func stringValue(text string, sp span) string {
	raw := text[sp.start:sp.end]
	if !sp.escaped {
		return raw
	}
	return string(appendUnescaped(make([]byte, 0, len(raw)), raw))
}

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

// object reads the top-level object at d.i (its '{'), recording in spans
// the last value of each claim and in is whether that value has the
// claim's type.
func (d *claimsDecoder) object(spans *[keyAud + 1]span, is *uint8) bool {
	d.depth = 1
	d.i++ // '{'
	if d.consume('}') {
		return true
	}
	for {
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			return false
		}
		ks, ke, kesc, ok := d.str()
		if !ok || !d.consume(':') {
			return false
		}
		key := lookupKey(d.s[ks:ke], kesc)
		d.skipSpace()
		start := d.i
		var c byte
		if d.i < len(d.s) {
			c = d.s[d.i]
		}
		switch key {
		case keyV, keyExp:
			bit := uint8(1) << (key - keyV)
			if c != '-' && (c < '0' || c > '9') {
				*is &^= bit
				if !d.value() {
					return false
				}
				break
			}
			if !d.number() {
				return false
			}
			spans[key] = span{start: start, end: d.i}
			*is |= bit
		case keySeg, keySD, keyAud:
			bit := uint8(1) << (key - keyV)
			if c != '"' {
				*is &^= bit
				if !d.value() {
					return false
				}
				break
			}
			s, e, esc, ok := d.str()
			if !ok {
				return false
			}
			spans[key] = span{start: s, end: e, escaped: esc}
			*is |= bit
		default:
			if !d.value() {
				return false
			}
		}
		if d.consume('}') {
			return true
		}
		if !d.consume(',') {
			return false
		}
	}
}

// lookupKey names the member key whose literal contents are raw.
func lookupKey(raw string, escaped bool) claimKey {
	if escaped {
		// Every escape stands for at least one byte and takes at most six
		// characters, so a key longer than 3*6 decodes to more than the 3
		// bytes of the longest claim name.
		if len(raw) > 18 {
			return keyOther
		}
		var buf [24]byte
		raw = string(appendUnescaped(buf[:0], raw))
	}
	switch raw {
	case "v":
		return keyV
	case "exp":
		return keyExp
	case "seg":
		return keySeg
	case "sd":
		return keySD
	case "aud":
		return keyAud
	}
	return keyOther
}

// value validates one JSON value of any type, as jsonParser.value
// accepts it, without building it.
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
