package store

import "testing"

func TestValidSegmentID(t *testing.T) {
	hex64 := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for id, want := range map[string]bool{
		"sha256:" + hex64:                     true,
		"sha256:" + hex64[:63]:                false,
		"sha256:" + hex64 + "0":               false,
		"sha256:" + hex64[:63] + "A":          false,
		"sha256:" + hex64[:63] + "g":          false,
		"sha256:" + hex64[:63] + "/":          false,
		"sha256:" + hex64[:63] + ":":          false,
		"sha256:" + hex64[:63] + "`":          false,
		"SHA256:" + hex64:                     false,
		"sha512:" + hex64:                     false,
		"sha256;" + hex64:                     false,
		"":                                    false,
		"sha256:" + hex64[:62] + "\u00e9"[:2]: false,
	} {
		if got := ValidSegmentID(id); got != want {
			t.Errorf("ValidSegmentID(%q) = %v", id, got)
		}
	}
}
