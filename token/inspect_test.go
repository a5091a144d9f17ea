package token

import (
	"strings"
	"testing"
	"time"
)

// TestVectorsInspect runs every verifyCases entry of tokens.json through
// Inspect: with the vector's key the verdict and reason must be the
// reference's; without a key the claims-only reason must be the
// reference's for every case whose MAC is valid; with the key in the
// second slot the report must name slot 2.
func TestVectorsInspect(t *testing.T) {
	vec := loadTokenVectors(t)
	wrong := vec.Keys["wrong"].bytes(t)
	ran := 0
	for _, vc := range vec.VerifyCases {
		t.Run(vc.Name, func(t *testing.T) {
			ran++
			skew := DefaultSkew
			if s := vc.Expected.SkewSeconds; s != nil {
				skew = time.Duration(*s * float64(time.Second))
			}
			want := vc.expectedReason(t)
			wantVerdict := VerdictAccept
			if want != "" {
				wantVerdict = VerdictRefuse
			}
			opts := InspectOptions{
				Keys:      [][]byte{vc.Key.bytes(t)},
				SegmentID: vc.Expected.SegmentID, ScopeDigest: vc.Expected.ScopeDigest, Audience: vc.Expected.Audience,
				Now: time.UnixMilli(vc.Expected.NowMs), Skew: skew,
			}
			r := Inspect(vc.Token, opts)
			if r.Verdict != wantVerdict || r.Reason != want {
				t.Fatalf("Inspect = %s %q, want %s %q (%s)\n%s", r.Verdict, r.Reason, wantVerdict, want, vc.Construction, r)
			}
			if want != "" && r.Detail == "" {
				t.Errorf("refusal %q without detail", want)
			}
			if want == "" && r.Slot != 0 {
				t.Errorf("slot %d, want 0", r.Slot)
			}
			if !strings.Contains(r.String(), "verdict:") {
				t.Errorf("String() lacks a verdict line:\n%s", r)
			}

			// The signing key in the second slot, a wrong key first.
			opts.Keys = [][]byte{wrong, vc.Key.bytes(t)}
			r2 := Inspect(vc.Token, opts)
			if r2.Verdict != r.Verdict || r2.Reason != r.Reason {
				t.Fatalf("two keys: %s %q, one key: %s %q", r2.Verdict, r2.Reason, r.Verdict, r.Reason)
			}
			if r.Slot == 0 && r2.Slot != 1 {
				t.Errorf("two keys: slot %d, want 1", r2.Slot)
			}

			// No key: the MAC is unchecked; every later check is the
			// reference's whenever the MAC is valid.
			opts.Keys = nil
			r3 := Inspect(vc.Token, opts)
			if r3.Verdict != VerdictUnchecked || r3.MACChecked || r3.Slot != -1 {
				t.Fatalf("no key: verdict %s checked %v slot %d", r3.Verdict, r3.MACChecked, r3.Slot)
			}
			if r.Slot >= 0 && r3.Reason != want {
				t.Fatalf("no key: reason %q, want %q\n%s", r3.Reason, want, r3)
			}
			if !strings.Contains(r3.String(), "unchecked") {
				t.Errorf("no key: report does not say the MAC is unchecked:\n%s", r3)
			}
		})
	}
	if ran != len(vec.VerifyCases) || ran == 0 {
		t.Fatalf("ran %d of %d verify vectors", ran, len(vec.VerifyCases))
	}
}

func TestInspectDetail(t *testing.T) {
	key := []byte("k1")
	seg := "sha256:" + strings.Repeat("a", 64)
	other := "sha256:" + strings.Repeat("b", 64)
	sd := strings.Repeat("c", 64)
	now := time.Unix(1_750_000_000, 0)
	tok := Sign(key, seg, sd, "aud:p1", now.Unix()-200)

	r := Inspect(tok, InspectOptions{Keys: [][]byte{key}, SegmentID: seg, Now: now, Skew: DefaultSkew})
	if r.Reason != ReasonExpired || r.Remaining != -140*time.Second || !strings.Contains(r.Detail, "expired 2m20s ago") {
		t.Fatalf("expired: %q %v %q", r.Reason, r.Remaining, r.Detail)
	}
	if r.Slot != 0 {
		t.Fatalf("expired token's MAC verified by slot %d, want 0", r.Slot)
	}

	tok = Sign(key, seg, sd, "aud:p1", now.Unix()+900)
	r = Inspect(tok, InspectOptions{Keys: [][]byte{key}, SegmentID: other, Now: now})
	if r.Reason != ReasonSegment || !strings.Contains(r.Detail, other) || !strings.Contains(r.Detail, seg) {
		t.Fatalf("segment: %q %q", r.Reason, r.Detail)
	}
	r = Inspect(tok, InspectOptions{Keys: [][]byte{key}, Audience: "aud:p2", Now: now})
	if r.Reason != ReasonAudience || !strings.Contains(r.Detail, `"aud:p2"`) {
		t.Fatalf("audience only: %q %q", r.Reason, r.Detail)
	}
	r = Inspect(tok, InspectOptions{Keys: [][]byte{key}, ScopeDigest: strings.Repeat("d", 64), Now: now})
	if r.Reason != ReasonScope {
		t.Fatalf("scope only: %q", r.Reason)
	}
	r = Inspect(tok, InspectOptions{Keys: [][]byte{[]byte("other"), []byte("old"), key}, SegmentID: seg, ScopeDigest: sd, Audience: "aud:p1", Now: now})
	if r.Verdict != VerdictAccept || r.Slot != 2 || r.Remaining != 900*time.Second {
		t.Fatalf("accept: %s slot %d remaining %v", r.Verdict, r.Slot, r.Remaining)
	}
	if !strings.Contains(r.String(), "verified by key 3") {
		t.Fatalf("report does not name key 3:\n%s", r)
	}
	r = Inspect(tok, InspectOptions{Keys: [][]byte{[]byte("other")}, Now: now})
	if r.Reason != ReasonBadMAC || r.Slot != -1 || !r.Decoded || r.Seg != seg {
		t.Fatalf("bad MAC: %q slot %d decoded %v", r.Reason, r.Slot, r.Decoded)
	}
}

func TestTokenFromURL(t *testing.T) {
	seg := "sha256:" + strings.Repeat("a", 64)
	for _, tc := range []struct {
		in, tok, seg, err string
	}{
		{"abc.def", "abc.def", "", ""},
		{"  abc.def\n", "abc.def", "", ""},
		{"http://h/sync/segments/" + seg + "?st=abc.def", "abc.def", seg, ""},
		{"https://h/segments/sha256%3A" + strings.Repeat("a", 64) + "?x=1&st=a_b-c.d", "a_b-c.d", seg, ""},
		{"http://h/segments/" + seg, "", "", "no st"},
		{"http://h/segments/" + seg + "?st=a.b&st=c.d", "", "", "more than one"},
	} {
		tok, s, err := TokenFromURL(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || tok != tc.tok || s != tc.seg {
			t.Errorf("%q: %q %q %v", tc.in, tok, s, err)
		}
	}
	if tm, err := ParseTime("1750000000123"); err != nil || tm.UnixMilli() != 1750000000123 {
		t.Errorf("unix ms: %v %v", tm, err)
	}
	if tm, err := ParseTime("2025-06-15T15:06:40Z"); err != nil || tm.Unix() != 1750000000 {
		t.Errorf("rfc3339: %v %v", tm, err)
	}
}
