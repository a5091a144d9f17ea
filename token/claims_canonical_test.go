package token

import (
	"math"
	"strings"
	"testing"
)

// canonicalNear are payloads one step from the signer's layout: each must
// either take the fast path with the full decoder's result or be left to
// the full decoder.
var canonicalNear = []string{
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"","sd":"","aud":"","exp":0}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":-0}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":-1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"ä€😀","exp":999999999999999}`,
	// Reordered, repeated, extra and missing keys.
	`{"v":1,"sd":"d","seg":"s","aud":"a","exp":1750000900}`,
	`{"seg":"s","v":1,"sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900,"exp":1}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","aud":"b","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900,"x":null}`,
	`{"v":1,"seg":"s","sd":"d","exp":1750000900}`,
	`{"v":2,"seg":"s","sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1.0,"seg":"s","sd":"d","aud":"a","exp":1750000900}`,
	// Escapes and characters a string literal may not hold raw.
	`{"v":1,"seg":"s\"","sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"s\u0041","sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d\\","aud":"a","exp":1750000900}`,
	"{\"v\":1,\"seg\":\"s\",\"sd\":\"d\",\"aud\":\"a\x01\",\"exp\":1750000900}",
	"{\"v\":1,\"seg\":\"s\",\"sd\":\"d\",\"aud\":\"a\x00\",\"exp\":1750000900}",
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":"1750000900"}`,
	`{"v":1,"seg":"s","sd":"d","aud":1,"exp":1750000900}`,
	// Numbers: leading zeros, fractions, exponents, too many digits.
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":01750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":-01}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":00}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900.5}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1.7500009e9}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1234567890123456}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":12345678901234567890123}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1e400}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":-}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":+1}`,
	// Whitespace, trailing data, truncation.
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900} `,
	` {"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900 }`,
	`{"v":1, "seg":"s","sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900}}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900}x`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":`,
	`{"v":1,"seg":"s`,
	`{"v":1,"seg":"s","sd":"d","aud":"a}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":17}50}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1,"x":}`,
	`{"v":1,"seg":`,
	``,
}

// TestDecodeCanonicalClaims holds the fast path to the full decoder on
// every vector's payload and on near-canonical texts, and checks that the
// signer's layout does take it.
func TestDecodeCanonicalClaims(t *testing.T) {
	vec := loadTokenVectors(t)
	fast := 0
	for _, sc := range vec.SignCases {
		// The signer's payload takes the fast path unless it escapes a
		// character or its claims are ones the edge refuses anyway.
		c := sc.Claims
		plain := !strings.Contains(sc.PayloadJSON, `\`) && c.V == 1 && c.Exp == math.Trunc(c.Exp) && math.Abs(c.Exp) < 1e15
		if _, ok := decodeCanonical(sc.PayloadJSON); ok != plain {
			t.Errorf("%s: the signer's payload %q: fast path %v, want %v", sc.Name, sc.PayloadJSON, ok, plain)
		}
	}
	var texts []string
	for _, sc := range vec.SignCases {
		texts = append(texts, sc.PayloadJSON)
	}
	for _, vc := range vec.VerifyCases {
		p, _, _ := strings.Cut(vc.Token, ".")
		if payload, err := decodeBase64Loose(p); err == nil {
			texts = append(texts, string(payload))
		}
	}
	texts = append(texts, canonicalNear...)
	texts = append(texts, claimsCases...)
	for _, text := range texts {
		if checkCanonical(t, text) {
			fast++
		}
	}
	if fast == 0 {
		t.Fatal("no text took the fast path")
	}
	for _, text := range []string{canonicalNear[0], canonicalNear[1], canonicalNear[2], canonicalNear[4]} {
		if _, ok := decodeCanonical(text); !ok {
			t.Errorf("%q missed the fast path", text)
		}
	}
	for _, text := range canonicalNear[5:] {
		if _, ok := decodeCanonical(text); ok {
			t.Errorf("%q took the fast path", text)
		}
	}
}

// checkCanonical fails t when the fast path accepts text with claims
// other than the full decoder's; it reports whether it accepted it.
func checkCanonical(t *testing.T, text string) bool {
	t.Helper()
	got, ok := decodeCanonical(text)
	want, st := decodeClaimsFull(text)
	if !ok {
		if g, gst := decodeClaims(text); gst != st || !sameClaims(g, want) {
			t.Errorf("%q: decodeClaims %+v (%d), full decoder %+v (%d)", text, g, gst, want, st)
		}
		return false
	}
	if st != claimsObject || !sameClaims(got, want) {
		t.Errorf("%q: fast path %+v, full decoder %+v (status %d)", text, got, want, st)
	}
	return true
}

// sameClaims compares claim fields bit for bit (-0 is not 0).
func sameClaims(a, b claimFields) bool {
	return a.has == b.has && a.seg == b.seg && a.sd == b.sd && a.aud == b.aud &&
		math.Float64bits(a.v) == math.Float64bits(b.v) && math.Float64bits(a.exp) == math.Float64bits(b.exp)
}

// FuzzCanonicalClaims holds the fast path to the full decoder on any text.
func FuzzCanonicalClaims(f *testing.F) {
	vec := loadTokenVectors(f)
	for _, sc := range vec.SignCases {
		f.Add(sc.PayloadJSON)
	}
	for _, vc := range vec.VerifyCases {
		p, _, _ := strings.Cut(vc.Token, ".")
		if payload, err := decodeBase64Loose(p); err == nil {
			f.Add(string(payload))
		}
	}
	for _, s := range canonicalNear {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkCanonical(t, text)
	})
}
