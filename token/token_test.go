package token

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"reflect"
	"strings"
	"testing"
	"time"
)

var (
	testKey      = []byte("edge-test-key-1") // tokens.json keys.primary
	testWrongKey = []byte("edge-test-key-2") // tokens.json keys.wrong
)

const (
	testSeg = "sha256:b062df5b328930cdbe90d004024bb83f69bc7256ed6dddc7e30856e2ac4a14d9"
	testSD  = "62c3eb7650e988823b42d68d143556151619c3957ff68f57ec0f612da5ca6751"
	testExp = 1750000900
)

// testNow is 900 s before testExp.
var testNow = time.UnixMilli(1750000000000)

func TestRotation(t *testing.T) {
	tok := Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	tests := []struct {
		name     string
		keys     [][]byte
		wantSlot int
		reason   string
	}{
		{"current key only", [][]byte{testKey}, 0, ""},
		{"old key in slot 1", [][]byte{testWrongKey, testKey}, 1, ""},
		{"same key twice picks the first", [][]byte{testKey, testKey}, 0, ""},
		{"no matching key", [][]byte{testWrongKey}, -1, ReasonBadMAC},
		{"no keys", nil, -1, ReasonBadMAC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, slot, err := NewVerifier(tt.keys, DefaultSkew, 0).VerifyFull(tok, testSeg, testSD, "aud:p1", testNow)
			if got := reasonOf(t, err); got != tt.reason {
				t.Fatalf("reason = %q, want %q", got, tt.reason)
			}
			if slot != tt.wantSlot {
				t.Errorf("slot = %d, want %d", slot, tt.wantSlot)
			}
			if err == nil && c.Aud != "aud:p1" {
				t.Errorf("aud = %q", c.Aud)
			}
		})
	}
}

func TestSlotReportedAfterMAC(t *testing.T) {
	v := NewVerifier([][]byte{testWrongKey, testKey}, DefaultSkew, 0)
	_, slot, err := v.Verify(Sign(testKey, testSeg, testSD, "aud:p1", testExp), "sha256:other", testNow)
	if reasonOf(t, err) != ReasonSegment || slot != 1 {
		t.Errorf("got slot %d, err %v; want slot 1, segment mismatch", slot, err)
	}
}

func TestNewVerifierCopiesKeys(t *testing.T) {
	key := append([]byte(nil), testKey...)
	keys := [][]byte{key}
	v := NewVerifier(keys, DefaultSkew, 0)
	key[0] ^= 0xFF
	keys[0] = testWrongKey
	if _, _, err := v.Verify(Sign(testKey, testSeg, testSD, "a", testExp), testSeg, testNow); err != nil {
		t.Fatal(err)
	}
}

func TestVerifierConcurrent(t *testing.T) {
	v := NewVerifier([][]byte{testWrongKey, testKey}, DefaultSkew, 0)
	good := Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	bad := Sign(testWrongKey, testSeg, testSD, "aud:p1", 0)
	for i := range 8 {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			for range 50 {
				if _, slot, err := v.Verify(good, testSeg, testNow); err != nil || slot != 1 {
					t.Errorf("goroutine %d: slot %d, %v", i, slot, err)
				}
				if _, slot, err := v.Verify(bad, testSeg, testNow); reasonOf(t, err) != ReasonExpired || slot != 0 {
					t.Errorf("goroutine %d: slot %d, %v", i, slot, err)
				}
			}
		})
	}
}

func TestMaxTokenLen(t *testing.T) {
	tok := Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	// atob ignores whitespace, so padding with spaces keeps the token
	// valid: only the cap can reject it.
	pad := func(n int) string { return tok + strings.Repeat(" ", n-len(tok)) }
	tests := []struct {
		name   string
		maxLen int
		token  string
		reason string
	}{
		{"default cap, at the cap", 0, pad(DefaultMaxTokenLen), ""},
		{"default cap, one over", 0, pad(DefaultMaxTokenLen + 1), ReasonMalformed},
		{"negative selects default", -1, pad(DefaultMaxTokenLen + 1), ReasonMalformed},
		{"custom cap, at the cap", len(tok), tok, ""},
		{"custom cap, one over", len(tok) - 1, tok, ReasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, slot, err := NewVerifier([][]byte{testKey}, DefaultSkew, tt.maxLen).Verify(tt.token, testSeg, testNow)
			if got := reasonOf(t, err); got != tt.reason {
				t.Fatalf("reason = %q, want %q", got, tt.reason)
			}
			if err != nil && slot != -1 {
				t.Errorf("slot = %d, want -1", slot)
			}
		})
	}
}

func TestSkew(t *testing.T) {
	tok := Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	atExp := time.UnixMilli(testExp * 1000)
	tests := []struct {
		name   string
		skew   time.Duration
		now    time.Time
		reason string
	}{
		{"zero skew at exp", 0, atExp, ""},
		{"zero skew 1ms late", 0, atExp.Add(time.Millisecond), ReasonExpired},
		{"negative skew acts as zero", -time.Hour, atExp, ""},
		{"negative skew acts as zero, late", -time.Hour, atExp.Add(time.Millisecond), ReasonExpired},
		{"fractional skew edge", 1500 * time.Millisecond, atExp.Add(1500 * time.Millisecond), ""},
		{"fractional skew 1ms late", 1500 * time.Millisecond, atExp.Add(1501 * time.Millisecond), ReasonExpired},
		{"sub-millisecond now is ignored like Date.now()", 0, atExp.Add(999 * time.Microsecond), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := NewVerifier([][]byte{testKey}, tt.skew, 0).Verify(tok, testSeg, tt.now)
			if got := reasonOf(t, err); got != tt.reason {
				t.Fatalf("reason = %q, want %q", got, tt.reason)
			}
		})
	}
}

// signRaw MACs an arbitrary payload the way the reference signer would
// have, for payloads its signer never produces.
func signRaw(payload string) string { return signPayload(testKey, []byte(payload)) }

func TestNonStringScopeAndAudience(t *testing.T) {
	const head = `{"v":1,"seg":"` + testSeg + `","exp":1750000900`
	tests := []struct {
		name       string
		payload    string
		verify     string // Verify's reason
		verifyFull string // VerifyFull's (the reference's) reason
	}{
		{"sd number", head + `,"sd":5,"aud":"aud:p1"}`, ReasonScope, ReasonScope},
		{"sd missing", head + `,"aud":"aud:p1"}`, ReasonScope, ReasonScope},
		{"aud null", head + `,"sd":"` + testSD + `","aud":null}`, ReasonAudience, ReasonAudience},
		{"aud missing, sd wrong", head + `,"sd":"x"}`, ReasonAudience, ReasonScope},
		{"empty strings are strings", head + `,"sd":"","aud":""}`, "", ReasonScope},
	}
	v := NewVerifier([][]byte{testKey}, DefaultSkew, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := signRaw(tt.payload)
			_, _, err := v.Verify(tok, testSeg, testNow)
			if got := reasonOf(t, err); got != tt.verify {
				t.Errorf("Verify reason = %q, want %q", got, tt.verify)
			}
			_, _, err = v.VerifyFull(tok, testSeg, testSD, "aud:p1", testNow)
			if got := reasonOf(t, err); got != tt.verifyFull {
				t.Errorf("VerifyFull reason = %q, want %q", got, tt.verifyFull)
			}
		})
	}
}

// TestPayloadEdgeCases covers JSON.parse behaviour beyond the vectors.
func TestPayloadEdgeCases(t *testing.T) {
	const claims = `"seg":"` + testSeg + `","sd":"` + testSD + `","aud":"aud:p1"`
	tests := []struct {
		name    string
		payload string
		reason  string
	}{
		// JSON.parse keeps \ud800 as a lone surrogate, which equals no
		// well-formed audience; encoding/json would make it U+FFFD.
		{"lone surrogate is not U+FFFD", `{"v":1,"seg":"` + testSeg + `","sd":"` + testSD + `","aud":"aud:p1\ud800","exp":1750000900}`, ReasonAudience},
		{"escaped surrogate pair", `{"v":1,` + claims[:len(claims)-1] + `\ud83d\ude00","exp":1750000900}`, ReasonAudience},
		{"exp overflow is Infinity", `{"v":1,` + claims + `,"exp":1e400}`, ""},
		{"exp -Infinity", `{"v":1,` + claims + `,"exp":-1e400}`, ReasonExpired},
		{"exp boolean", `{"v":1,` + claims + `,"exp":true}`, ReasonExpired},
		{"v true", `{"v":true,` + claims + `,"exp":1750000900}`, ReasonVersion},
		{"v 1e0", `{"v":1e0,` + claims + `,"exp":1750000900}`, ""},
		{"v 1.0000000000000001 rounds to 1", `{"v":1.0000000000000001,` + claims + `,"exp":1750000900}`, ""},
		{"string payload", `"v"`, ReasonVersion},
		{"number payload", `1`, ReasonVersion},
		{"boolean payload", `true`, ReasonVersion},
		{"whitespace-only null", " null\n", ReasonMalformed},
		{"two BOMs", "\uFEFF\uFEFF{}", ReasonUnparseable},
		{"NBSP is not JSON whitespace", "\u00a0{}", ReasonUnparseable},
		{"leading zero", `{"v":01}`, ReasonUnparseable},
		{"trailing comma", `{"v":1,}`, ReasonUnparseable},
		{"raw control char in string", "{\"v\":1,\"aud\":\"a\tb\"}", ReasonUnparseable},
		{"single quotes", `{'v':1}`, ReasonUnparseable},
	}
	v := NewVerifier([][]byte{testKey}, DefaultSkew, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := v.VerifyFull(signRaw(tt.payload), testSeg, testSD, "aud:p1", testNow)
			if got := reasonOf(t, err); got != tt.reason {
				t.Fatalf("reason = %q, want %q", got, tt.reason)
			}
		})
	}
}

func TestDecodeBase64Loose(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" with ok false: an error
		ok   bool
	}{
		{"", "", true},
		{"YQ", "a", true},
		{"YQ==", "a", true},
		{"YQ=", "", false}, // 3 chars: padding is only dropped at length 0 mod 4
		{"YQ===", "", false},
		{"Y===", "", false},
		{"YR", "a", true}, // non-zero trailing bits
		{" Y\tQ\n=\f=\r", "a", true},
		{"Y", "", false},
		{"YQ\v", "", false}, // VT is not ASCII whitespace for atob
		{"-_8", "\xfb\xff", true},
		{"+/8", "\xfb\xff", true},
		{"YQ.", "", false},
		{"YQ\u00a0", "", false},
	}
	for _, tt := range tests {
		got, err := decodeBase64Loose(tt.in)
		if (err == nil) != tt.ok || (tt.ok && string(got) != tt.want) {
			t.Errorf("decodeBase64Loose(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestSignEscaping(t *testing.T) {
	tok := Sign(testKey, testSeg, testSD, "a\"\\/<>&\u2028\u2029\x7f\x00\x1f\b\f\n\r\té😀\xff", 1)
	p, _, _ := strings.Cut(tok, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(p)
	want := `{"v":1,"seg":"` + testSeg + `","sd":"` + testSD + `","aud":"a\"\\/<>&` + "\u2028\u2029\x7f" + `\u0000\u001f\b\f\n\r\t` + "é😀\uFFFD" + `","exp":1}`
	if string(payload) != want {
		t.Errorf("payload\n got %s\nwant %s", payload, want)
	}
}

func TestIssueURL(t *testing.T) {
	tests := []struct {
		name      string
		base      string
		ttl       int64
		nowMs     int64
		wantExpMs int64
		wantPre   string
	}{
		{"default ttl", "https://cdn.test/s", 0, 1750000000999, 1750000900000, "https://cdn.test/s/" + testSeg + "?st="},
		{"negative ttl selects default", "https://cdn.test/s", -5, 1750000000000, 1750000900000, "https://cdn.test/s/"},
		{"trailing slash kept", "https://cdn.test/s/", 60, 1750000000000, 1750000060000, "https://cdn.test/s//" + testSeg},
		{"floor before 1970", "b", 10, -1500, 8000, "b/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, expMs := IssueURL(testKey, tt.base, testSeg, testSD, "aud:p1", tt.ttl, tt.nowMs)
			if expMs != tt.wantExpMs || !strings.HasPrefix(url, tt.wantPre) {
				t.Fatalf("IssueURL = %s, %d; want prefix %s, %d", url, expMs, tt.wantPre, tt.wantExpMs)
			}
			_, tok, _ := strings.Cut(url, "?st=")
			c, _, err := NewVerifier([][]byte{testKey}, 0, 0).VerifyFull(tok, testSeg, testSD, "aud:p1", time.UnixMilli(expMs))
			if err != nil || c.Exp*1000 != float64(expMs) {
				t.Errorf("issued token: %v, %+v", err, c)
			}
		})
	}
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"edge-test-key-1", "edge-test-key-1"},
		{"hex:656467652d746573742d6b65792d31", "edge-test-key-1"},
		{"hex:00FF", "\x00\xff"},
		{"base64:ZWRnZS10ZXN0LWtleS0x", "edge-test-key-1"},
		{"base64:+/8=", "\xfb\xff"},
		{"base64:-_8", "\xfb\xff"},
		{"base64:-_8=", "\xfb\xff"},
		{"HEX:00", "HEX:00"},   // prefixes are case-sensitive
		{" hex:00", " hex:00"}, // and not trimmed
		{"base64url:AA", "base64url:AA"},
	}
	for _, tt := range tests {
		got, err := ParseKey(tt.in)
		if err != nil || string(got) != tt.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}

	for _, bad := range []string{
		"",
		"hex:",
		"base64:",
		"hex:zz-secret-zz",
		"hex:abcde",
		"base64:sec!ret",
		"base64:c2VjcmV0===",
		"base64:YR", // non-zero trailing bits: not canonical
	} {
		_, err := ParseKey(bad)
		if err == nil {
			t.Errorf("ParseKey(%q) succeeded", bad)
			continue
		}
		_, secret, _ := strings.Cut(bad, ":")
		if msg := err.Error(); len(secret) >= 3 && strings.Contains(msg, secret) {
			t.Errorf("ParseKey(%q) error echoes the secret: %q", bad, msg)
		}
	}
}

// FuzzVerify checks that arbitrary tokens never panic, that rejections
// are well-formed, and that an accepted token is stable and carries a MAC
// that an independent HMAC computation confirms.
func FuzzVerify(f *testing.F) {
	vec := loadTokenVectors(f)
	for _, vc := range vec.VerifyCases {
		f.Add(vc.Token, vc.Expected.SegmentID)
	}
	for _, sc := range vec.SignCases {
		f.Add(sc.Token, sc.Claims.Seg)
	}
	keys := [][]byte{testWrongKey, testKey}
	v := NewVerifier(keys, DefaultSkew, 0)
	reasons := map[string]bool{
		ReasonMalformed: true, ReasonBadMAC: true, ReasonUnparseable: true, ReasonVersion: true,
		ReasonExpired: true, ReasonSegment: true, ReasonScope: true, ReasonAudience: true,
	}
	f.Fuzz(func(t *testing.T, token, seg string) {
		c, slot, err := v.Verify(token, seg, testNow)
		if err != nil {
			reason := reasonOf(t, err)
			if !reasons[reason] || c != nil || slot < -1 || slot >= len(keys) {
				t.Fatalf("bad rejection: %v, slot %d, claims %v", err, slot, c)
			}
			// Only a length, split, base64 or MAC failure leaves no slot
			// (a null payload is malformed after the MAC).
			if reason == ReasonBadMAC && slot != -1 || slot == -1 && reason != ReasonMalformed && reason != ReasonBadMAC {
				t.Fatalf("reason %q with slot %d", reason, slot)
			}
			return
		}
		if slot < 0 || slot >= len(keys) || c.Seg != seg {
			t.Fatalf("accepted with slot %d, claims %+v", slot, c)
		}
		c2, slot2, err := v.Verify(token, seg, testNow)
		if err != nil || slot2 != slot || !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-verify: %v, slot %d vs %d", err, slot2, slot)
		}
		// Independent MAC check: normalize to plain unpadded base64.
		clean := strings.NewReplacer(" ", "", "\t", "", "\n", "", "\f", "", "\r", "", "-", "+", "_", "/", "=", "")
		p, m, _ := strings.Cut(token, ".")
		payload, err1 := base64.RawStdEncoding.DecodeString(clean.Replace(p))
		mac, err2 := base64.RawStdEncoding.DecodeString(clean.Replace(m))
		h := hmac.New(sha256.New, keys[slot])
		h.Write(payload)
		if err1 != nil || err2 != nil || !hmac.Equal(h.Sum(nil), mac) {
			t.Fatalf("accepted token's MAC does not check out (%v, %v)", err1, err2)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	v := NewVerifier([][]byte{testKey, testWrongKey}, DefaultSkew, 0)
	tok := Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := v.Verify(tok, testSeg, testNow); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSign(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	}
}
