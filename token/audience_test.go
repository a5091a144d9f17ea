package token

import (
	"crypto/hmac"
	"crypto/sha256"
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

// hmacAudienceRef is the rule computed from scratch.
func hmacAudienceRef(key []byte, encoding, partition string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(partition))
	if encoding == "base64url" {
		return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestHMACAudienceCache derives more partitions than the cache holds,
// twice over, and checks every answer, the bound and the hit path.
func TestHMACAudienceCache(t *testing.T) {
	for _, enc := range []string{"hex", "base64url"} {
		a, err := HMACAudience(testKey, enc)
		if err != nil {
			t.Fatal(err)
		}
		for round := range 2 {
			for i := range 3 * audienceCacheSize {
				p := "partition-" + strconv.Itoa(i)
				if got, want := a.Derive(p), hmacAudienceRef(testKey, enc, p); got != want {
					t.Fatalf("%s round %d: Derive(%q) = %q, want %q", enc, round, p, got, want)
				}
			}
		}
		n := 0
		for i := range a.(*hmacAudience).shards {
			n += a.(*hmacAudience).shards[i].len()
		}
		if n == 0 || n > audienceCacheSize {
			t.Errorf("%s: %d cached audiences, want 1..%d", enc, n, audienceCacheSize)
		}
		a.Derive("p1")
		if allocs := testing.AllocsPerRun(100, func() { a.Derive("p1") }); allocs != 0 {
			t.Errorf("%s: a cached Derive allocates %v times", enc, allocs)
		}
	}

	// A reload builds a new rule: nothing cached under the old key leaks.
	old, _ := HMACAudience(testKey, "hex")
	old.Derive("p1")
	fresh, _ := HMACAudience(testWrongKey, "hex")
	if got, want := fresh.Derive("p1"), hmacAudienceRef(testWrongKey, "hex", "p1"); got != want {
		t.Errorf("new key: Derive(p1) = %q, want %q", got, want)
	}
}

// TestHMACAudienceConcurrent derives overlapping partitions from several
// goroutines through a small working set and a large one (run with -race).
func TestHMACAudienceConcurrent(t *testing.T) {
	a, _ := HMACAudience(testKey, "hex")
	errs := make(chan string, 8)
	for g := range 8 {
		go func() {
			defer func() { errs <- "" }()
			for i := range 2000 {
				n := i % 7
				if g%2 == 1 {
					n = (i*31 + g) % (2 * audienceCacheSize)
				}
				p := "p" + strconv.Itoa(n)
				if got := a.Derive(p); got != hmacAudienceRef(testKey, "hex", p) {
					errs <- "Derive(" + p + ") = " + got
					return
				}
			}
		}()
	}
	for range 8 {
		if e := <-errs; e != "" {
			t.Error(e)
		}
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
