package token

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"unicode/utf16"
)

// CanonicalScopeJSON renders a scope map the way the reference
// canonicalScopeJson does: keys sorted, each value list de-duplicated and
// sorted, both sorts by UTF-16 code unit (the JavaScript default sort, so
// U+1F600 sorts before U+FB01), strings escaped as JSON.stringify does,
// no whitespace: {"k":["v1","v2"],...}. An empty map is {} and an empty
// or nil list is []. No Unicode normalization is applied.
//
// Keys and values that are not valid UTF-8 are taken as the JavaScript
// string they stand for (invalid bytes become U+FFFD); keys that thereby
// coincide have their values merged.
func CanonicalScopeJSON(m map[string][]string) string {
	scopes := make(map[string][]string, len(m))
	for k, vals := range m {
		k = jsString(k)
		for _, v := range vals {
			scopes[k] = append(scopes[k], jsString(v))
		}
		if scopes[k] == nil {
			scopes[k] = []string{}
		}
	}
	keys := sortUTF16(slices.Collect(maps.Keys(scopes)))

	b := []byte{'{'}
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSString(b, k)
		b = append(b, ':', '[')
		for j, v := range slices.Compact(sortUTF16(scopes[k])) {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSString(b, v)
		}
		b = append(b, ']')
	}
	return string(append(b, '}'))
}

// ScopeDigest is the lowercase hex SHA-256 of the UTF-8 bytes of
// CanonicalScopeJSON(m), with no "sha256:" prefix.
func ScopeDigest(m map[string][]string) string {
	sum := sha256.Sum256([]byte(CanonicalScopeJSON(m)))
	return hex.EncodeToString(sum[:])
}

// sortUTF16 sorts canonical strings (see jsjson.go) in place by UTF-16
// code unit, as Array.prototype.sort does by default, and returns them.
func sortUTF16(ss []string) []string {
	units := make(map[string][]uint16, len(ss))
	for _, s := range ss {
		units[s] = utf16Units(s)
	}
	slices.SortFunc(ss, func(a, b string) int { return slices.Compare(units[a], units[b]) })
	return ss
}

// utf16Units returns the UTF-16 code units of the canonical string s.
func utf16Units(s string) []uint16 {
	u := make([]uint16, 0, len(s))
	for i := 0; i < len(s); {
		r, n := decodeUnit(s[i:])
		i += n
		if r >= 0x10000 {
			hi, lo := utf16.EncodeRune(r)
			u = append(u, uint16(hi), uint16(lo))
		} else {
			u = append(u, uint16(r))
		}
	}
	return u
}
