package token

import (
	"strconv"
	"strings"
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
// status they are zero. The reference signer's exact layout takes the
// fast path (claims_canonical.go); any other text the full decoder.
func decodeClaims(text string) (claimFields, claimsStatus) {
	if f, ok := decodeCanonical(text); ok {
		return f, claimsObject
	}
	return decodeClaimsFull(text)
}

// decodeClaimsFull is decodeClaims for any text: the whole JSON grammar.
func decodeClaimsFull(text string) (claimFields, claimsStatus) {
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
