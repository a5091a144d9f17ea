package token

import "strings"

// decodeCanonical is decodeClaims's fast path: it recognizes the one
// payload layout the reference signer writes (protocol §3, the vectors'
// payloadJson: JSON.stringify of {v, seg, sd, aud, exp} in that order),
//
//	{"v":1,"seg":"…","sd":"…","aud":"…","exp":N}
//
// byte for byte: no whitespace, strings without a backslash or a control
// character, and N an integer in JavaScript's shortest form ("-"? then
// "0" or up to 15 digits not starting with 0, so exact as a float64).
// ok is false for any other text, which the caller hands to the full
// decoder. A text it accepts is a JSON object with exactly these five
// members, each once, so the full decoder reads the same claims: the
// string claims alias text as it does, and N converts as parseNumber
// converts it.
func decodeCanonical(text string) (f claimFields, ok bool) {
	const (
		head   = `{"v":1,"seg":"`
		sdKey  = `","sd":"`
		audKey = `","aud":"`
		expKey = `","exp":`
	)
	if !strings.HasPrefix(text, head) {
		return claimFields{}, false
	}
	i := len(head)
	for _, c := range [...]struct {
		dst  *string
		next string
	}{{&f.seg, sdKey}, {&f.sd, audKey}, {&f.aud, expKey}} {
		end, ok := plainStringEnd(text, i)
		if !ok || !strings.HasPrefix(text[end:], c.next) {
			return claimFields{}, false
		}
		*c.dst = text[i:end]
		i = end + len(c.next)
	}
	if len(text) <= i || text[len(text)-1] != '}' {
		return claimFields{}, false
	}
	lit := text[i : len(text)-1]
	digits := strings.TrimPrefix(lit, "-")
	if len(digits) > 1 && digits[0] == '0' {
		return claimFields{}, false // a leading zero: not JSON
	}
	exp, ok := parseSmallInt(lit)
	if !ok {
		return claimFields{}, false
	}
	f.v, f.exp = 1, exp
	f.has = hasV | hasExp | hasSeg | hasSD | hasAud
	return f, true
}

// plainStringEnd returns the index of the '"' that closes the string
// literal whose contents start at i, when the contents hold no backslash
// and no control character; ok is false otherwise.
func plainStringEnd(s string, i int) (end int, ok bool) {
	i = skipPlain(s, i)
	for i < len(s) && !strSpecial[s[i]] {
		i++
	}
	return i, i < len(s) && s[i] == '"'
}
