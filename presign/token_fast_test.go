package presign

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"math/rand/v2"
	"testing"
)

// The fast paths of verification give the answers of the plain ones.

func TestDecodeBase64FastPath(t *testing.T) {
	const url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		b := make([]byte, r.IntN(48))
		for j := range b {
			b[j] = url[r.IntN(len(url))]
		}
		s := string(b)
		if !base64URLOnly(s) {
			t.Fatalf("%q not recognized as base64url", s)
		}
		got, gerr := decodeBase64Loose(s)
		want, werr := decodeBase64Forgiving(s)
		if (gerr == nil) != (werr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("%q: fast %x %v, forgiving %x %v", s, got, gerr, want, werr)
		}
	}
	for _, s := range []string{"ab+c", "ab/c", "ab=c", "ab c", "abc=", "a\tb", "é"} {
		if base64URLOnly(s) {
			t.Errorf("%q taken for base64url", s)
		}
	}
}

func TestMatchKeyClonedHMAC(t *testing.T) {
	keys := [][]byte{[]byte("k1"), bytes.Repeat([]byte{7}, 100), {}, []byte("k4")}
	v := NewVerifier(keys, 0, 0)
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
		if got := v.matchKey(payload, mac); got != want {
			t.Fatalf("payload %d: slot %d, want %d", i, got, want)
		}
		if got := v.matchKey(payload, append(mac[:31:31], mac[31]^1)); got != -1 {
			t.Fatalf("a wrong MAC matched slot %d", got)
		}
	}
}
