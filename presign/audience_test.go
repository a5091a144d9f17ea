package presign

import (
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"testing"
)

// audHMACp1 is tokens.json's aud-hmac-p1: hex(HMAC-SHA256("edge-test-key-1", "p1")).
const audHMACp1 = "1e7ed5573bc38643050f69c7aa9d6b4aaa97a670957408ed49b6af42811a48a1"

func TestHMACAudience(t *testing.T) {
	raw, _ := hex.DecodeString(audHMACp1)
	tests := []struct {
		encoding string
		want     string
	}{
		{"", audHMACp1},
		{"hex", audHMACp1},
		{"base64url", base64.RawURLEncoding.EncodeToString(raw)},
	}
	for _, tt := range tests {
		t.Run("encoding="+tt.encoding, func(t *testing.T) {
			a, err := HMACAudience(testKey, tt.encoding)
			if err != nil {
				t.Fatal(err)
			}
			if got := a.Derive("p1"); got != tt.want {
				t.Errorf("Derive(p1) = %q, want %q", got, tt.want)
			}
			if a.Derive("p2") == tt.want {
				t.Error("p2 derives the same audience as p1")
			}
		})
	}

	for _, enc := range []string{"HEX", "base64", "base64url ", "raw"} {
		if _, err := HMACAudience(testKey, enc); err == nil {
			t.Errorf("HMACAudience(%q) succeeded", enc)
		}
	}
	if _, err := HMACAudience(nil, "hex"); err == nil {
		t.Error("HMACAudience with an empty key succeeded")
	}

	key := append([]byte(nil), testKey...)
	a, _ := HMACAudience(key, "hex")
	key[0] ^= 0xFF
	if got := a.Derive("p1"); got != audHMACp1 {
		t.Errorf("key not copied: Derive(p1) = %q", got)
	}
}

func TestTemplateAudience(t *testing.T) {
	tests := []struct {
		tmpl, partition, want string
	}{
		{"aud:{partition}", "p1", "aud:p1"},
		{"{partition}", "p1", "p1"},
		{"{partition}/{partition}", "x", "x/x"},
		{"fixed", "p1", "fixed"},
		{"{host}{$VAR}{env.X}{Partition}:{partition}", "p1", "{host}{$VAR}{env.X}{Partition}:p1"},
		{"a{partition}", "{partition}", "a{partition}"}, // one pass, no re-expansion
		{"aud:{partition}", "", "aud:"},
	}
	for _, tt := range tests {
		if got := TemplateAudience(tt.tmpl).Derive(tt.partition); got != tt.want {
			t.Errorf("TemplateAudience(%q).Derive(%q) = %q, want %q", tt.tmpl, tt.partition, got, tt.want)
		}
	}
}

// BenchmarkHMACAudienceDerive measures Derive for one partition asked
// again and again (hit) and for partitions cycled over a set far larger
// than any cache (miss).
func BenchmarkHMACAudienceDerive(b *testing.B) {
	a, err := HMACAudience(testKey, "hex")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if a.Derive("p1") != audHMACp1 {
				b.Fatal("wrong audience")
			}
		}
	})
	b.Run("miss", func(b *testing.B) {
		parts := make([]string, 1<<16)
		for i := range parts {
			parts[i] = "partition-" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if len(a.Derive(parts[i%len(parts)])) != 64 {
				b.Fatal("wrong audience length")
			}
			i++
		}
	})
}
