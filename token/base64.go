package token

// b64Value maps a byte to its 6-bit value in the union of the standard
// and URL alphabets ('+' and '-' are 62, '/' and '_' are 63), and every
// other byte to 0xFF.
var b64Value = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xFF
	}
	const std = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for i := range len(std) {
		t[std[i]] = byte(i)
	}
	t['-'], t['_'] = 62, 63
	return t
}()

// isB64Space reports whether c is ASCII whitespace as atob strips it.
func isB64Space(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'
}

// appendBase64Loose appends to dst the bytes of s decoded the way the
// reference does: atob(s.replaceAll('-', '+').replaceAll('_', '/')). That
// is the WHATWG forgiving-base64 decode: ASCII whitespace (TAB, LF, FF,
// CR, SPACE) is removed anywhere; when the length is then a multiple of
// 4, one or two trailing '=' are dropped; a length of 1 mod 4, or any
// character outside the standard alphabet (including a remaining '='), is
// an error; non-zero trailing bits in the last character are ignored.
//
// It reports false on an error, when dst may hold part of the output.
// Given the capacity (len(s)*3/4 + 2 is enough), it does not allocate.
func appendBase64Loose(dst []byte, s string) ([]byte, bool) {
	// Every signer emits unpadded base64url: try that first.
	if out, ok := appendBase64Plain(dst, s); ok {
		return out, true
	}
	return appendBase64Forgiving(dst, s)
}

// appendBase64Plain decodes s if it consists of alphabet characters only
// (no whitespace, no padding), where the forgiving decode reduces to a
// plain unpadded one. It reports false for anything else, including input
// the forgiving decode accepts.
func appendBase64Plain(dst []byte, s string) ([]byte, bool) {
	if len(s)%4 == 1 {
		return dst, false
	}
	full := len(s) / 4 * 4
	for i := 0; i < full; i += 4 {
		a, b, c, d := b64Value[s[i]], b64Value[s[i+1]], b64Value[s[i+2]], b64Value[s[i+3]]
		if (a|b|c|d)&0x80 != 0 {
			return dst, false
		}
		q := uint32(a)<<18 | uint32(b)<<12 | uint32(c)<<6 | uint32(d)
		dst = append(dst, byte(q>>16), byte(q>>8), byte(q))
	}
	var acc uint32
	for i := full; i < len(s); i++ {
		v := b64Value[s[i]]
		if v&0x80 != 0 {
			return dst, false
		}
		acc = acc<<6 | uint32(v)
	}
	return appendBase64Tail(dst, acc, len(s)-full), true
}

// appendBase64Tail appends the bytes of the k (0, 2 or 3) characters
// left over after the last whole quad, accumulated in acc; the bits that
// do not fill a byte are dropped.
func appendBase64Tail(dst []byte, acc uint32, k int) []byte {
	switch k {
	case 2:
		dst = append(dst, byte(acc>>4))
	case 3:
		dst = append(dst, byte(acc>>10), byte(acc>>2))
	}
	return dst
}

// appendBase64Forgiving is appendBase64Loose for any input.
func appendBase64Forgiving(dst []byte, s string) ([]byte, bool) {
	// n counts the characters left after whitespace removal, of which
	// the last pad are dropped '=' padding.
	n := 0
	for i := 0; i < len(s); i++ {
		if !isB64Space(s[i]) {
			n++
		}
	}
	pad := 0
	if n%4 == 0 {
		for i := len(s) - 1; i >= 0 && pad < 2; i-- {
			if c := s[i]; c == '=' {
				pad++
			} else if !isB64Space(c) {
				break
			}
		}
	}
	m := n - pad // characters to decode
	if m%4 == 1 {
		return dst, false
	}
	var (
		acc uint32
		k   int // characters in acc
	)
	for i, seen := 0, 0; i < len(s) && seen < m; i++ {
		c := s[i]
		if isB64Space(c) {
			continue
		}
		seen++
		v := b64Value[c]
		if v == 0xFF {
			return dst, false
		}
		acc = acc<<6 | uint32(v)
		if k++; k == 4 {
			dst = append(dst, byte(acc>>16), byte(acc>>8), byte(acc))
			acc, k = 0, 0
		}
	}
	return appendBase64Tail(dst, acc, k), true
}
