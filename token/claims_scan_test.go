package token

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestSkipPlain: skipPlain never passes a quote, a backslash or a control
// byte, wherever it sits in a word, beside any other byte (borrows from
// one byte of a word into the next included).
func TestSkipPlain(t *testing.T) {
	bytesOf := []byte{0, 0x1f, 0x20, 0x21, '"', 0x23, 0x5b, '\\', 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff, 'a'}
	r := rand.New(rand.NewPCG(5, 6))
	for n := 0; n < 200000; n++ {
		b := make([]byte, r.IntN(40))
		for j := range b {
			if r.IntN(4) == 0 {
				b[j] = bytesOf[r.IntN(len(bytesOf))]
			} else {
				b[j] = 'a' + byte(r.IntN(26))
			}
		}
		s := string(b)
		from := 0
		if len(s) > 0 {
			from = r.IntN(len(s))
		}
		got := skipPlain(s, from)
		if got < from || got > len(s) {
			t.Fatalf("skipPlain(%q, %d) = %d: out of range", s, from, got)
		}
		for k := from; k < got; k++ {
			if strSpecial[s[k]] {
				t.Fatalf("skipPlain(%q, %d) = %d passed byte %#x at %d", s, from, got, s[k], k)
			}
		}
		if got < len(s) && len(s)-got >= 8 && (got-from)%8 != 0 {
			t.Fatalf("skipPlain(%q, %d) = %d: not a word boundary", s, from, got)
		}
	}
	// A run of ordinary bytes is passed whole words at a time.
	if got := skipPlain(strings.Repeat("ab", 20)+`"`, 0); got != 40 {
		t.Fatalf("plain run: stopped at %d, want 40", got)
	}
}
