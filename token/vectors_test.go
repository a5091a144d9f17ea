package token

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/testkit"
)

// vectorsDir is testkit.VectorsDir: the protocol vectors, or a failed test.
func vectorsDir(t testing.TB) string { return testkit.VectorsDir(t) }

func loadVectors(tb testing.TB, name string, v any) {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(vectorsDir(tb), name))
	if err != nil {
		tb.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
}

type vecKey struct {
	Type  string `json:"type"`
	Value string `json:"value"`
	Hex   string `json:"hex"`
}

// bytes returns the key bytes, checking that a utf8 key's value and hex
// agree.
func (k vecKey) bytes(tb testing.TB) []byte {
	tb.Helper()
	b, err := hex.DecodeString(k.Hex)
	if err != nil {
		tb.Fatalf("key hex: %v", err)
	}
	if k.Type == "utf8" && string(b) != k.Value {
		tb.Fatalf("utf8 key %q does not match its hex %s", k.Value, k.Hex)
	}
	return b
}

type tokenVectors struct {
	Keys     map[string]vecKey `json:"keys"`
	Segments []struct {
		Name      string `json:"name"`
		SegmentID string `json:"segmentId"`
	} `json:"segments"`
	Scopes []struct {
		Name          string              `json:"name"`
		ScopeMap      map[string][]string `json:"scopeMap"`
		CanonicalJSON string              `json:"canonicalJson"`
		ScopeDigest   string              `json:"scopeDigest"`
	} `json:"scopes"`
	Audiences []struct {
		Name       string `json:"name"`
		Partition  string `json:"partition"`
		Aud        string `json:"aud"`
		Derivation string `json:"derivation"`
	} `json:"audiences"`
	SignCases []struct {
		Name   string `json:"name"`
		Key    vecKey `json:"key"`
		Claims struct {
			V   float64 `json:"v"`
			Seg string  `json:"seg"`
			SD  string  `json:"sd"`
			Aud string  `json:"aud"`
			Exp float64 `json:"exp"`
		} `json:"claims"`
		PayloadJSON    string `json:"payloadJson"`
		PayloadUTF8Hex string `json:"payloadUtf8Hex"`
		PayloadB64url  string `json:"payloadB64url"`
		MacHex         string `json:"macHex"`
		MacB64url      string `json:"macB64url"`
		Token          string `json:"token"`
	} `json:"signCases"`
	IssueCases []struct {
		Name   string `json:"name"`
		Config struct {
			Key        vecKey `json:"key"`
			BaseURL    string `json:"baseUrl"`
			TTLSeconds *int64 `json:"ttlSeconds"`
			Audience   string `json:"audience"`
		} `json:"config"`
		Args struct {
			SegmentID   string `json:"segmentId"`
			Partition   string `json:"partition"`
			ScopeDigest string `json:"scopeDigest"`
			NowMs       int64  `json:"nowMs"`
		} `json:"args"`
		Result struct {
			URL            string `json:"url"`
			URLExpiresAtMs int64  `json:"urlExpiresAtMs"`
		} `json:"result"`
		TokenPayloadJSON string `json:"tokenPayloadJson"`
	} `json:"issueCases"`
	VerifyCases []verifyCase `json:"verifyCases"`
}

type verifyCase struct {
	Name         string `json:"name"`
	Construction string `json:"construction"`
	Key          vecKey `json:"key"`
	Token        string `json:"token"`
	Expected     struct {
		SegmentID   string   `json:"segmentId"`
		ScopeDigest string   `json:"scopeDigest"`
		Audience    string   `json:"audience"`
		NowMs       int64    `json:"nowMs"`
		SkewSeconds *float64 `json:"skewSeconds"`
	} `json:"expected"`
	Result struct {
		OK        bool            `json:"ok"`
		ErrorKind string          `json:"errorKind"`
		Message   string          `json:"message"`
		Reason    *string         `json:"reason"`
		Claims    json.RawMessage `json:"claims"`
	} `json:"result"`
}

func loadTokenVectors(tb testing.TB) *tokenVectors {
	tb.Helper()
	var v tokenVectors
	loadVectors(tb, "tokens.json", &v)
	if len(v.VerifyCases) == 0 || len(v.SignCases) == 0 || len(v.IssueCases) == 0 {
		tb.Fatal("tokens.json: no cases")
	}
	return &v
}

// expectedReason is the reason a reimplementation must give: the
// reference's, or ReasonMalformed where the reference let a non-SyncError
// exception escape.
func (c *verifyCase) expectedReason(tb testing.TB) string {
	tb.Helper()
	switch {
	case c.Result.OK:
		return ""
	case c.Result.ErrorKind == "SyncError" && c.Result.Reason != nil:
		return *c.Result.Reason
	case strings.HasPrefix(c.Result.ErrorKind, "non-SyncError"):
		return ReasonMalformed
	}
	tb.Fatalf("unexpected result form %+v", c.Result)
	return ""
}

func TestVectorsVerify(t *testing.T) {
	vec := loadTokenVectors(t)
	ran := 0
	for _, vc := range vec.VerifyCases {
		t.Run(vc.Name, func(t *testing.T) {
			ran++
			skew := DefaultSkew
			if s := vc.Expected.SkewSeconds; s != nil {
				skew = time.Duration(*s * float64(time.Second))
			}
			v := NewVerifier([][]byte{vc.Key.bytes(t)}, skew, 0)
			now := time.UnixMilli(vc.Expected.NowMs)
			want := vc.expectedReason(t)

			c, slot, err := v.VerifyFull(vc.Token, vc.Expected.SegmentID, vc.Expected.ScopeDigest, vc.Expected.Audience, now)
			if got := reasonOf(t, err); got != want {
				t.Fatalf("VerifyFull reason = %q, want %q (%s)", got, want, vc.Construction)
			}
			if err != nil {
				if c != nil {
					t.Errorf("claims returned with error: %+v", c)
				}
				if vc.Result.ErrorKind == "SyncError" && err.Error() != vc.Result.Message {
					t.Errorf("message = %q, want %q", err.Error(), vc.Result.Message)
				}
			} else {
				if slot != 0 {
					t.Errorf("slot = %d, want 0", slot)
				}
				checkClaims(t, c, vc.Result.Claims)
			}

			// Verify stops before sd/aud; every vector's sd and aud are
			// strings, so it agrees with VerifyFull up to the segment check.
			vWant := want
			if want == ReasonScope || want == ReasonAudience {
				vWant = ""
			}
			c2, _, err := v.Verify(vc.Token, vc.Expected.SegmentID, now)
			if got := reasonOf(t, err); got != vWant {
				t.Fatalf("Verify reason = %q, want %q", got, vWant)
			}
			if err == nil && (c2.SD != vc.Expected.ScopeDigest) != (want == ReasonScope) {
				t.Errorf("Verify claims sd = %q, expected %q, reason %q", c2.SD, vc.Expected.ScopeDigest, want)
			}
		})
	}
	t.Logf("%d verify vectors", ran)
}

// reasonOf returns the rejection reason of err ("" for nil), failing the
// test if err is not an *Error.
func reasonOf(tb testing.TB, err error) string {
	tb.Helper()
	if err == nil {
		return ""
	}
	var e *Error
	if !errors.As(err, &e) {
		tb.Fatalf("error %v (%T) is not a *token.Error", err, err)
	}
	if err.Error() != "segment token rejected: "+e.Reason {
		tb.Fatalf("message %q does not carry reason %q", err.Error(), e.Reason)
	}
	return e.Reason
}

// checkClaims compares verified claims with the reference's returned
// claims object, decoded as plain JSON values.
func checkClaims(tb testing.TB, c *Claims, wantJSON json.RawMessage) {
	tb.Helper()
	var want map[string]any
	if err := json.Unmarshal(wantJSON, &want); err != nil {
		tb.Fatalf("result.claims: %v", err)
	}
	if !reflect.DeepEqual(c.Raw(), want) {
		tb.Errorf("Raw() = %#v\nwant  %#v", c.Raw(), want)
	}
	if c.Seg != want["seg"] || c.SD != want["sd"] || c.Aud != want["aud"] || c.Exp != want["exp"] {
		tb.Errorf("claims = {Seg:%q SD:%q Aud:%q Exp:%v}, want %v", c.Seg, c.SD, c.Aud, c.Exp, want)
	}
}

func TestVectorsSign(t *testing.T) {
	vec := loadTokenVectors(t)
	for _, sc := range vec.SignCases {
		t.Run(sc.Name, func(t *testing.T) {
			key := sc.Key.bytes(t)
			cl := sc.Claims
			payload := claimsJSON(cl.V, cl.Seg, cl.SD, cl.Aud, cl.Exp)
			if string(payload) != sc.PayloadJSON {
				t.Errorf("payload JSON\n got %s\nwant %s", payload, sc.PayloadJSON)
			}
			if got := hex.EncodeToString(payload); got != sc.PayloadUTF8Hex {
				t.Errorf("payload hex = %s, want %s", got, sc.PayloadUTF8Hex)
			}
			tok := signPayload(key, payload)
			if tok != sc.Token {
				t.Errorf("token\n got %s\nwant %s", tok, sc.Token)
			}
			p, m, _ := strings.Cut(tok, ".")
			if p != sc.PayloadB64url || m != sc.MacB64url {
				t.Errorf("parts = %s . %s, want %s . %s", p, m, sc.PayloadB64url, sc.MacB64url)
			}
			if mac, _ := base64.RawURLEncoding.DecodeString(m); hex.EncodeToString(mac) != sc.MacHex {
				t.Errorf("mac hex = %x, want %s", mac, sc.MacHex)
			}
			// The public signer covers v = 1 with an integral exp.
			if cl.V == 1 && cl.Exp == math.Trunc(cl.Exp) && math.Abs(cl.Exp) < 1<<53 {
				if got := Sign(key, cl.Seg, cl.SD, cl.Aud, int64(cl.Exp)); got != sc.Token {
					t.Errorf("Sign\n got %s\nwant %s", got, sc.Token)
				}
			}
		})
	}
}

func TestVectorsIssue(t *testing.T) {
	vec := loadTokenVectors(t)
	for _, ic := range vec.IssueCases {
		t.Run(ic.Name, func(t *testing.T) {
			if ic.Config.Audience != `partition => "aud:" + partition` {
				t.Fatalf("unexpected audience rule %q", ic.Config.Audience)
			}
			aud := TemplateAudience("aud:{partition}").Derive(ic.Args.Partition)
			var ttl int64 // null: the default
			if ic.Config.TTLSeconds != nil {
				ttl = *ic.Config.TTLSeconds
			}
			url, expMs := IssueURL(ic.Config.Key.bytes(t), ic.Config.BaseURL, ic.Args.SegmentID, ic.Args.ScopeDigest, aud, ttl, ic.Args.NowMs)
			if url != ic.Result.URL {
				t.Errorf("url\n got %s\nwant %s", url, ic.Result.URL)
			}
			if expMs != ic.Result.URLExpiresAtMs {
				t.Errorf("urlExpiresAtMs = %d, want %d", expMs, ic.Result.URLExpiresAtMs)
			}
			_, tok, _ := strings.Cut(url, "?st=")
			p, _, _ := strings.Cut(tok, ".")
			if payload, _ := base64.RawURLEncoding.DecodeString(p); string(payload) != ic.TokenPayloadJSON {
				t.Errorf("payload = %s, want %s", payload, ic.TokenPayloadJSON)
			}
		})
	}
}

func TestVectorsAudiences(t *testing.T) {
	vec := loadTokenVectors(t)
	hmacAud, err := HMACAudience(vec.Keys["primary"].bytes(t), "hex")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range vec.Audiences {
		t.Run(a.Name, func(t *testing.T) {
			rule := TemplateAudience("aud:{partition}")
			if strings.HasPrefix(a.Derivation, "lowercase hex(HMAC-SHA256") {
				rule = hmacAud
			}
			if got := rule.Derive(a.Partition); got != a.Aud {
				t.Errorf("Derive(%q) = %q, want %q", a.Partition, got, a.Aud)
			}
		})
	}
}

type scopeVectors struct {
	Cases []struct {
		Name                 string              `json:"name"`
		ScopeMap             map[string][]string `json:"scopeMap"`
		CanonicalJSON        string              `json:"canonicalJson"`
		CanonicalJSONUTF8Hex string              `json:"canonicalJsonUtf8Hex"`
		ScopeDigest          string              `json:"scopeDigest"`
	} `json:"cases"`
}

func TestVectorsScopeDigests(t *testing.T) {
	var vec scopeVectors
	loadVectors(t, "scope-digests.json", &vec)
	if len(vec.Cases) == 0 {
		t.Fatal("scope-digests.json: no cases")
	}
	for _, sc := range vec.Cases {
		t.Run(sc.Name, func(t *testing.T) {
			got := CanonicalScopeJSON(sc.ScopeMap)
			if got != sc.CanonicalJSON {
				t.Errorf("canonical JSON\n got %s\nwant %s", got, sc.CanonicalJSON)
			}
			if h := hex.EncodeToString([]byte(got)); h != sc.CanonicalJSONUTF8Hex {
				t.Errorf("canonical hex = %s, want %s", h, sc.CanonicalJSONUTF8Hex)
			}
			if d := ScopeDigest(sc.ScopeMap); d != sc.ScopeDigest {
				t.Errorf("digest = %s, want %s", d, sc.ScopeDigest)
			}
		})
	}
	// tokens.json carries the digests its tokens were signed with.
	for _, sc := range loadTokenVectors(t).Scopes {
		t.Run("tokens/"+sc.Name, func(t *testing.T) {
			if got := CanonicalScopeJSON(sc.ScopeMap); got != sc.CanonicalJSON {
				t.Errorf("canonical JSON\n got %s\nwant %s", got, sc.CanonicalJSON)
			}
			if d := ScopeDigest(sc.ScopeMap); d != sc.ScopeDigest {
				t.Errorf("digest = %s, want %s", d, sc.ScopeDigest)
			}
		})
	}
}
