package token

import "testing"

// The vector file covers the reference behaviour; these cases cover what
// only a Go caller can pass.
func TestCanonicalScopeJSON(t *testing.T) {
	tests := []struct {
		name string
		m    map[string][]string
		want string
	}{
		{"nil map", nil, `{}`},
		{"nil list", map[string][]string{"k": nil}, `{"k":[]}`},
		{"astral after lone high surrogate", map[string][]string{"k": {"\U0001F600", "\xed\xa0\xbdx", "\uFFFD"}}, `{"k":["\ud83dx","😀","` + "\uFFFD" + `"]}`},
		{"WTF-8 pair is the astral character", map[string][]string{"k": {"\xed\xa0\xbd\xed\xb8\x80", "\U0001F600"}}, `{"k":["😀"]}`},
		{"invalid bytes become U+FFFD and dedup", map[string][]string{"k": {"a\xff", "a\xfe", "a\uFFFD"}}, `{"k":["a` + "\uFFFD" + `"]}`},
		{"keys that coincide merge", map[string][]string{"a\xff": {"2"}, "a\xfe": {"1", "2"}}, `{"a` + "\uFFFD" + `":["1","2"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CanonicalScopeJSON(tt.m); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestCanonicalScopeJSONDoesNotModifyInput(t *testing.T) {
	vals := []string{"b", "a", "b"}
	CanonicalScopeJSON(map[string][]string{"k": vals})
	if vals[0] != "b" || vals[1] != "a" || vals[2] != "b" {
		t.Errorf("input modified: %q", vals)
	}
}
