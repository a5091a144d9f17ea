package token

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"math/rand/v2"
	"testing"
)

// The fast paths of verification give the answers of the plain ones.

// decodeBase64Forgiving is the plain form of appendBase64Loose, built on
// encoding/base64: translate the URL alphabet, strip whitespace, drop
// padding, decode unpadded.
func decodeBase64Forgiving(s string) ([]byte, bool) {
	buf := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\t', '\n', '\f', '\r', ' ':
		case '-':
			buf = append(buf, '+')
		case '_':
			buf = append(buf, '/')
		default:
			buf = append(buf, c)
		}
	}
	if len(buf)%4 == 0 {
		for range 2 {
			if n := len(buf); n > 0 && buf[n-1] == '=' {
				buf = buf[:n-1]
			}
		}
	}
	// The unpadded decoder rejects '=', other non-alphabet bytes and a
	// length of 1 mod 4, and (not being Strict) ignores trailing bits.
	out := make([]byte, base64.RawStdEncoding.DecodedLen(len(buf)))
	n, err := base64.RawStdEncoding.Decode(out, buf)
	return out[:n], err == nil
}

func checkBase64Loose(t *testing.T, s string, allocs bool) {
	t.Helper()
	want, wok := decodeBase64Forgiving(s)
	prefix := []byte("xyz")
	got, ok := appendBase64Loose(prefix, s)
	if ok != wok || ok && (!bytes.Equal(got[:3], prefix) || !bytes.Equal(got[3:], want)) {
		t.Fatalf("%q: appendBase64Loose %x %v, forgiving %x %v", s, got, ok, want, wok)
	}
	if !allocs {
		return
	}
	// With enough capacity it decodes in place, without allocating.
	dst := make([]byte, 0, len(s)*3/4+2)
	if n := testing.AllocsPerRun(1, func() { appendBase64Loose(dst, s) }); n != 0 {
		t.Fatalf("%q: %v allocations", s, n)
	}
}

func TestAppendBase64Loose(t *testing.T) {
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/= \t\n\f\r\v.é"
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		b := make([]byte, r.IntN(48))
		// Mostly the base64url alphabet, sometimes anything in alpha.
		n := 64
		if i%2 == 1 {
			n = len(alpha)
		}
		for j := range b {
			b[j] = alpha[r.IntN(n)]
		}
		checkBase64Loose(t, string(b), i%64 == 0)
	}
}

// FuzzBase64Loose holds appendBase64Loose to the encoding/base64 form.
func FuzzBase64Loose(f *testing.F) {
	for _, s := range []string{"", "YQ", "YQ==", "YQ=", "YQ===", "Y===", "YR", " Y\tQ\n=\f=\r", "Y", "YQ\v",
		"-_8", "+/8", "YQ.", "YQ\u00a0", "YWJj ZA= =", "ab=c", "====", "YW Jj"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkBase64Loose(t, s, true) })
}

func TestMatchKey(t *testing.T) {
	keys := [][]byte{[]byte("k1"), bytes.Repeat([]byte{7}, 100), {}, []byte("k4")}
	v := NewVerifier(keys, 0, 0)
	s := v.scratch.Get().(*verifyScratch)
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 200; i++ {
		payload := make([]byte, r.IntN(300))
		for j := range payload {
			payload[j] = byte(r.IntN(256))
		}
		slot := r.IntN(len(keys))
		m := hmac.New(sha256.New, keys[slot])
		m.Write(payload)
		mac := m.Sum(nil)
		// An empty key and a key of 100 bytes (longer than the block) too.
		want := slot
		for k := 0; k < slot; k++ {
			if bytes.Equal(keys[k], keys[slot]) {
				want = k
			}
		}
		// The reused HMAC states carry nothing over between calls.
		if got := v.matchKey(s, payload, mac); got != want {
			t.Fatalf("payload %d: slot %d, want %d", i, got, want)
		}
		if got := v.matchKey(s, payload, append(mac[:31:31], mac[31]^1)); got != -1 {
			t.Fatalf("a wrong MAC matched slot %d", got)
		}
		if got := v.matchKey(s, payload, mac[:31]); got != -1 {
			t.Fatalf("a short MAC matched slot %d", got)
		}
	}
}
