package token

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// oracleClaims is how verification read the claims before decodeClaims
// existed, and still the definition it must meet: parseJSON builds the
// generic value, then the claims are the object's own properties of the
// right JSON type. It also returns the generic object.
func oracleClaims(text string) (claimFields, claimsStatus, map[string]any) {
	parsed, ok := parseJSON(text)
	if !ok {
		return claimFields{}, claimsUnparseable, nil
	}
	if parsed == nil {
		return claimFields{}, claimsNull, nil
	}
	raw, ok := parsed.(map[string]any)
	if !ok {
		return claimFields{}, claimsOther, nil
	}
	var f claimFields
	if x, ok := raw["v"].(float64); ok {
		f.v, f.has = x, f.has|hasV
	}
	if x, ok := raw["exp"].(float64); ok {
		f.exp, f.has = x, f.has|hasExp
	}
	if s, ok := raw["seg"].(string); ok {
		f.seg, f.has = s, f.has|hasSeg
	}
	if s, ok := raw["sd"].(string); ok {
		f.sd, f.has = s, f.has|hasSD
	}
	if s, ok := raw["aud"].(string); ok {
		f.aud, f.has = s, f.has|hasAud
	}
	return f, claimsObject, raw
}

// oracleReason is the reason the reference verifier gives, after a valid
// MAC, for payload text with the claims f read from it (Verify's checks
// when sd and aud are "", VerifyFull's otherwise).
func oracleReason(f claimFields, st claimsStatus, seg, sd, aud string, full bool) string {
	switch {
	case st == claimsUnparseable:
		return ReasonUnparseable
	case st == claimsNull:
		return ReasonMalformed
	case f.has&hasV == 0 || f.v != 1:
		return ReasonVersion
	case f.has&hasExp == 0 || f.exp < float64(testNow.UnixMilli())/1000-DefaultSkew.Seconds():
		return ReasonExpired
	case f.has&hasSeg == 0 || f.seg != seg:
		return ReasonSegment
	case f.has&hasSD == 0 || full && f.sd != sd:
		return ReasonScope
	case f.has&hasAud == 0 || full && f.aud != aud:
		return ReasonAudience
	}
	return ""
}

// sameFields reports whether two decodings agree bit for bit (the sign of
// a zero exp included).
func sameFields(a, b claimFields) bool {
	return a.has == b.has && math.Float64bits(a.v) == math.Float64bits(b.v) &&
		math.Float64bits(a.exp) == math.Float64bits(b.exp) &&
		a.seg == b.seg && a.sd == b.sd && a.aud == b.aud
}

// checkClaimsDifferential holds decodeClaims, and Verify and VerifyFull
// around it, to the oracle for one payload.
func checkClaimsDifferential(t *testing.T, v *Verifier, payload []byte, seg string) {
	t.Helper()
	text := strings.TrimPrefix(decodeUTF8Lossy(payload), "\uFEFF")
	want, wantSt, wantRaw := oracleClaims(text)
	got, gotSt := decodeClaims(text)
	if gotSt != wantSt || !sameFields(got, want) {
		t.Fatalf("text %.300q:\ndecodeClaims %d %+v\noracle       %d %+v", text, gotSt, got, wantSt, want)
	}

	tok := signPayload(testKey, payload)
	segs := []string{seg}
	if want.has&hasSeg != 0 {
		segs = append(segs, want.seg)
	}
	for _, s := range segs {
		for _, full := range []bool{false, true} {
			var (
				c    *Claims
				slot int
				err  error
			)
			if full {
				c, slot, err = v.VerifyFull(tok, s, want.sd, want.aud, testNow)
			} else {
				c, slot, err = v.Verify(tok, s, testNow)
			}
			wantReason := oracleReason(want, wantSt, s, want.sd, want.aud, full)
			if r := reasonOf(t, err); r != wantReason || slot != 1 {
				t.Fatalf("text %.300q, seg %q, full %v: reason %q slot %d, oracle %q slot 1", text, s, full, r, slot, wantReason)
			}
			if err != nil {
				continue
			}
			if c.Seg != want.seg || c.SD != want.sd || c.Aud != want.aud ||
				math.Float64bits(c.Exp) != math.Float64bits(want.exp) || !reflect.DeepEqual(c.Raw(), wantRaw) {
				t.Fatalf("text %.300q: claims %+v raw %#v, oracle %+v raw %#v", text, c, c.Raw(), want, wantRaw)
			}
		}
	}
}

// claimsCases are payloads that probe each rule decodeClaims shares with
// parseJSON; they seed FuzzClaimsDifferential and run in
// TestClaimsDifferential.
var claimsCases = []string{
	`{"v":1,"seg":"` + testSeg + `","sd":"` + testSD + `","aud":"aud:p1","exp":1750000900}`,
	// Escapes in values and keys, surrogates paired, lone and reversed.
	`{"v":1,"seg":"\u0073ha256:x","sd":"a\"\\\/\b\f\n\r\t","aud":"\ud83d\ude00\ud800\udc00x\udfff\ud800","exp":1750000900}`,
	`{"\u0076":1,"s\u0065g":"s","\u0073\u0064":"d","au\u0064":"a","\u0065\u0078\u0070":1750000900}`,
	`{"\u0076\u0000":1,"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900,"\ud800":2}`,
	`{"v":1,"seg":"s","sd":"d","aud":"\ud800\u0041\ud800\u","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"\ud83d\ud83d\ude00","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"\uDBFF\uDFFF","exp":1750000900}`,
	// Duplicates: last wins, even with another type.
	`{"v":2,"v":1,"seg":"x","seg":"s","sd":"d","aud":"a","exp":1,"exp":1750000900}`,
	`{"v":1,"v":"1","seg":"s","sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","aud":null,"exp":1750000900}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900,"exp":"1750000900"}`,
	`{"v":1,"seg":"s","seg":["s"],"sd":"d","aud":"a","exp":1750000900}`,
	`{"v":1,"seg":"s","sd":{"x":"d"},"sd":"d","aud":"a","exp":1750000900}`,
	// Number forms.
	`{"v":1e0,"seg":"s","sd":"d","aud":"a","exp":1.7500009e9}`,
	`{"v":1.0000000000000001,"seg":"s","sd":"d","aud":"a","exp":1e400}`,
	`{"v":10e-1,"seg":"s","sd":"d","aud":"a","exp":-1e400}`,
	`{"v":-1,"seg":"s","sd":"d","aud":"a","exp":-0}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1E+2}`,
	`{"v":01,"seg":"s"}`, `{"v":1.,"seg":"s"}`, `{"v":.5}`, `{"v":-}`, `{"v":+1}`, `{"v":1e}`, `{"exp":0x10}`,
	`{"v":Infinity}`, `{"v":NaN}`, `{"v":true}`, `{"v":tru}`, `{"v":nulls}`,
	// Extra members with nested values, valid and not.
	`{"v":1,"x":[1,{"y":[null,true,false,"z",-0.5e-3]},[]],"seg":"s","sd":"d","aud":"a","exp":1750000900,"o":{}}`,
	`{"v":1,"x":[1,],"seg":"s"}`, `{"v":1,"x":{"a"},"seg":"s"}`, `{"v":1,"x":{a:1}}`, `{"v":1,"x":[,1]}`,
	`{"v":1,"x":"\x"}`, `{"v":1,"x":"\u12"}`, "{\"v\":1,\"x\":\"a\x00\"}", `{"v":1,"x":"abc`, `{"v":1,"x":`,
	`{"v":1,}`, `{"v":1 "seg":"s"}`, `{"v"}`, `{"v" 1}`, `{,}`, `{`, `}`,
	// Whitespace, BOM and trailing text.
	" \t\n\r{ \"v\" : 1 , \"seg\" : \"s\" , \"sd\":\"d\",\"aud\":\"a\",\"exp\":1750000900 } \n",
	"\uFEFF{\"v\":1,\"seg\":\"s\",\"sd\":\"d\",\"aud\":\"a\",\"exp\":1750000900}",
	"\uFEFF\uFEFF{}", "\u00a0{}", "\v{}", "{}\v", "{} {}", "{}x", `{}}`,
	// Non-objects.
	`null`, " null\n", `nul`, `"v"`, `1`, `-0`, `true`, `false`, `[]`, `[{"v":1}]`, ``, ` `,
	// Invalid UTF-8 (U+FFFD after decoding), inside strings and out.
	"{\"v\":1,\"seg\":\"s\xff\",\"sd\":\"\xe2\x82\",\"aud\":\"\xed\xa0\x80\",\"exp\":1750000900}",
	"{\"v\":1,\xff\"seg\":\"s\"}", "\xef\xbb{}", "\xef\xbb\xbf\xef\xbb\xbf{}",
	// Raw control characters and the JavaScript-only line separators.
	"{\"v\":1,\"aud\":\"a\tb\"}", "{\"v\":1,\"seg\":\"s\",\"sd\":\"d\",\"aud\":\"\u2028\u2029\x7f\",\"exp\":1750000900}",
	// Depth: the top-level object is level 1.
	`{"x":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `}`,
	`{"x":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `}`,
	strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth),
	strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1),
	`{"x":` + strings.Repeat(`{"a":`, maxJSONDepth-1) + `1` + strings.Repeat("}", maxJSONDepth-1) + `}`,
	`{"x":` + strings.Repeat(`{"a":`, maxJSONDepth) + `1` + strings.Repeat("}", maxJSONDepth) + `}`,
	// Keys long enough to skip decoding, and escaped look-alikes.
	`{"\u0076\u0076\u0076\u0076":1,"\/v":1,"v\/":1,"exp\u0000":1,"\u0065\u0078\u0070\u0020":1}`,
	`{"v":1,"seg":"s","sd":"d","aud":"a","exp":1750000900,"` + strings.Repeat(`\u0061`, 20) + `":1}`,
}

// differentialMaxLen lifts the token length cap so that the deep nesting
// cases reach the parser.
const differentialMaxLen = 1 << 20

func TestClaimsDifferential(t *testing.T) {
	v := NewVerifier([][]byte{testWrongKey, testKey}, DefaultSkew, differentialMaxLen)
	for _, p := range claimsCases {
		checkClaimsDifferential(t, v, []byte(p), "s")
	}
	for _, vc := range loadTokenVectors(t).VerifyCases {
		p, _, _ := strings.Cut(vc.Token, ".")
		if payload, err := decodeBase64Loose(p); err == nil {
			checkClaimsDifferential(t, v, payload, vc.Expected.SegmentID)
		}
	}
}

// FuzzClaimsDifferential runs decodeClaims and Verify/VerifyFull against
// the generic parseJSON path on arbitrary payload bytes (signed with a
// valid key, so every check after the MAC is reached) and fails on any
// difference in outcome, reason or claim value.
func FuzzClaimsDifferential(f *testing.F) {
	vec := loadTokenVectors(f)
	for _, vc := range vec.VerifyCases {
		p, _, _ := strings.Cut(vc.Token, ".")
		if payload, err := decodeBase64Loose(p); err == nil {
			f.Add(payload, vc.Expected.SegmentID)
		}
	}
	for _, sc := range vec.SignCases {
		f.Add([]byte(sc.PayloadJSON), sc.Claims.Seg)
	}
	for _, p := range claimsCases {
		f.Add([]byte(p), "s")
	}
	v := NewVerifier([][]byte{testWrongKey, testKey}, DefaultSkew, differentialMaxLen)
	f.Fuzz(func(t *testing.T, payload []byte, seg string) {
		checkClaimsDifferential(t, v, payload, seg)
	})
}

// TestDecodeClaimsExamples pins some outcomes by value, not only by
// agreement with the oracle.
func TestDecodeClaimsExamples(t *testing.T) {
	tests := []struct {
		text string
		st   claimsStatus
		want claimFields
	}{
		{`{"\u0076":1,"a\u0075d":"x\u0041","aud":"y\ud800"}`, claimsObject,
			claimFields{v: 1, aud: "y\xed\xa0\x80", has: hasV | hasAud}},
		{`{"v":1,"v":"1","exp":-0,"seg":"s","seg":null}`, claimsObject,
			claimFields{exp: math.Copysign(0, -1), has: hasExp}},
		{`{"sd":"\ud83d\ude00","seg":"\/"}`, claimsObject, claimFields{sd: "😀", seg: "/", has: hasSD | hasSeg}},
		{` null `, claimsNull, claimFields{}},
		{`[1]`, claimsOther, claimFields{}},
		{`{"v":1}x`, claimsUnparseable, claimFields{}},
		{`{"v":1,"x":[}`, claimsUnparseable, claimFields{}},
	}
	for _, tt := range tests {
		got, st := decodeClaims(tt.text)
		if st != tt.st || !sameFields(got, tt.want) {
			t.Errorf("decodeClaims(%q) = %d %+v, want %d %+v", tt.text, st, got, tt.st, tt.want)
		}
	}
}

// TestDecodeClaimsAliasesText checks that unescaped string claims share
// the payload text's memory and that decoding allocates nothing then.
func TestDecodeClaimsAliasesText(t *testing.T) {
	text := string(claimsJSON(1, testSeg, testSD, "aud:p1", testExp))
	f, st := decodeClaims(text)
	if st != claimsObject || f.has != hasV|hasExp|hasSeg|hasSD|hasAud {
		t.Fatalf("decodeClaims = %d %+v", st, f)
	}
	base, end := uintptr(unsafe.Pointer(unsafe.StringData(text))), uintptr(len(text))
	for _, s := range []string{f.seg, f.sd, f.aud} {
		if p := uintptr(unsafe.Pointer(unsafe.StringData(s))); p < base || p >= base+end {
			t.Errorf("claim %q does not alias the payload text", s)
		}
	}
	if n := testing.AllocsPerRun(100, func() { decodeClaims(text) }); n != 0 {
		t.Errorf("decodeClaims allocates %v times per call", n)
	}
}

// TestVerifyAllocations bounds the allocations of an accepted token: the
// payload text and the Claims, nothing per key or per buffer.
func TestVerifyAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	v := NewVerifier([][]byte{testKey, testWrongKey}, DefaultSkew, 0)
	tok := Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	if n := testing.AllocsPerRun(100, func() {
		if _, _, err := v.Verify(tok, testSeg, testNow); err != nil {
			t.Fatal(err)
		}
	}); n > 2 {
		t.Errorf("Verify allocates %v times per call, want at most 2", n)
	}
	// VerifyInto: the payload text only.
	var c Claims
	if n := testing.AllocsPerRun(100, func() {
		if _, err := v.VerifyInto(&c, tok, testSeg, testNow); err != nil {
			t.Fatal(err)
		}
	}); n > 1 {
		t.Errorf("VerifyInto allocates %v times per call, want at most 1", n)
	}
	bad := tok[:len(tok)-2] + "AA"
	if n := testing.AllocsPerRun(100, func() { v.Verify(bad, testSeg, testNow) }); n > 1 {
		t.Errorf("a bad MAC allocates %v times per call, want at most 1 (the error)", n)
	}
}

// TestVerifyConcurrent verifies from several goroutines at once (run
// with -race): the pooled scratch state is never shared.
func TestVerifyConcurrent(t *testing.T) {
	v := NewVerifier([][]byte{testWrongKey, testKey}, DefaultSkew, 0)
	done := make(chan error)
	for g := range 8 {
		go func() {
			aud := "aud:p" + string(rune('0'+g))
			tok := Sign(testKey, testSeg, testSD, aud, testExp)
			var err error
			for range 200 {
				c, slot, e := v.VerifyFull(tok, testSeg, testSD, aud, testNow.Add(time.Duration(g)*time.Second))
				if e != nil || slot != 1 || c.Aud != aud {
					err = e
					if err == nil {
						err = &Error{"claims of another goroutine: " + c.Aud}
					}
					break
				}
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestParseSmallInt holds the integer fast path to strconv.ParseFloat.
func TestParseSmallInt(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	cases := []string{"0", "-0", "1", "-1", "9", "1764590000", "999999999999999", "-999999999999999",
		"1000000000000000", "9007199254740993", "1e3", "1.5", "-", "", "12a", "--1"}
	for range 20000 {
		s := strconv.FormatInt(r.Int64N(1_000_000_000_000_000)>>r.IntN(60), 10)
		if r.IntN(2) == 0 {
			s = "-" + s
		}
		cases = append(cases, s)
	}
	for _, s := range cases {
		got, ok := parseSmallInt(s)
		want, err := strconv.ParseFloat(s, 64)
		digits := strings.TrimPrefix(s, "-")
		simple := err == nil && len(digits) > 0 && len(digits) <= 15 && strings.Trim(digits, "0123456789") == ""
		if ok != simple {
			t.Fatalf("parseSmallInt(%q): ok=%v, want %v", s, ok, simple)
		}
		if ok && (got != want || math.Signbit(got) != math.Signbit(want)) {
			t.Fatalf("parseSmallInt(%q) = %v, ParseFloat = %v", s, got, want)
		}
	}
}

// TestVerifyInto: the claims Verify returns, written in place; a rejected
// token leaves the destination as it was.
func TestVerifyInto(t *testing.T) {
	v := NewVerifier([][]byte{testWrongKey, testKey}, DefaultSkew, 0)
	tok := Sign(testKey, testSeg, testSD, "aud:p1", testExp)
	want, wantSlot, err := v.Verify(tok, testSeg, testNow)
	if err != nil {
		t.Fatal(err)
	}
	c := Claims{Seg: "previous"}
	slot, err := v.VerifyInto(&c, tok, testSeg, testNow)
	if err != nil || slot != wantSlot || c.Seg != want.Seg || c.SD != want.SD || c.Aud != want.Aud || c.Exp != want.Exp ||
		!reflect.DeepEqual(c.Raw(), want.Raw()) {
		t.Fatalf("VerifyInto = %+v, slot %d, %v; Verify = %+v, slot %d", c, slot, err, *want, wantSlot)
	}
	before := c
	for _, bad := range []string{tok[:len(tok)-2] + "AA", Sign(testKey, testSeg, testSD, "aud:p1", 1), "x"} {
		if _, err := v.VerifyInto(&c, bad, testSeg, testNow); err == nil {
			t.Fatalf("%q accepted", bad)
		}
		if c != before {
			t.Fatalf("rejected %q changed the claims to %+v", bad, c)
		}
	}
}
