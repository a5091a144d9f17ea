package presign

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

const cftSeg = "sha256:4f1c8d5e7a9b0c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d"

// cftObjectKey is the S3 store's layout with prefix "syncular/".
func cftObjectKey(id segid.ID) string {
	return "syncular/seg/sha256/" + id.Hex()
}

var (
	cftKeysOnce sync.Once
	cftRSA      *rsa.PrivateKey
	cftEC       *ecdsa.PrivateKey
)

func cftKeys(t testing.TB) (*rsa.PrivateKey, *ecdsa.PrivateKey) {
	t.Helper()
	cftKeysOnce.Do(func() {
		var err error
		if cftRSA, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if cftEC, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
	})
	return cftRSA, cftEC
}

func cftPEM(t testing.TB, typ string, der []byte) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func cftPKCS8(t testing.TB, k any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return cftPEM(t, "PRIVATE KEY", der)
}

func cftSigner(t testing.TB, keyPEM []byte, o CloudFrontOptions) *CloudFrontSigner {
	t.Helper()
	if o.Domain == "" {
		o.Domain = "d111111abcdef8.cloudfront.net"
	}
	if o.KeyPairID == "" {
		o.KeyPairID = "K2JCJMDEHXQW5F"
	}
	o.PrivateKeyPEM = keyPEM
	p, err := NewCloudFrontSigner(cftObjectKey, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// cftParsed is a signed URL taken apart.
type cftParsed struct {
	resource  string // scheme://host/path, what the canned policy names
	expires   int64
	signature []byte
	keyPairID string
}

// cftVerify checks raw as CloudFront does for a canned policy, written
// here independently of the SDK: the query is exactly Expires, Signature
// and Key-Pair-Id (in that order); the signature, in CloudFront's base64
// alphabet, verifies with pub over SHA-1 of the canned policy
// {"Statement":[{"Resource":"<url>","Condition":{"DateLessThan":{"AWS:EpochTime":<exp>}}}]}.
func cftVerify(t testing.TB, raw string, pub crypto.PublicKey, keyPairID string) cftParsed {
	t.Helper()
	base, query, ok := strings.Cut(raw, "?")
	if !ok {
		t.Fatalf("%s: no query", raw)
	}
	parts := strings.Split(query, "&")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "Expires=") || !strings.HasPrefix(parts[1], "Signature=") ||
		!strings.HasPrefix(parts[2], "Key-Pair-Id=") {
		t.Fatalf("%s: query is not Expires, Signature, Key-Pair-Id", raw)
	}
	var p cftParsed
	p.resource = base
	exp, err := strconv.ParseInt(strings.TrimPrefix(parts[0], "Expires="), 10, 64)
	if err != nil {
		t.Fatalf("%s: Expires: %v", raw, err)
	}
	p.expires = exp
	p.keyPairID = strings.TrimPrefix(parts[2], "Key-Pair-Id=")
	if p.keyPairID != keyPairID {
		t.Fatalf("Key-Pair-Id %q, want %q", p.keyPairID, keyPairID)
	}
	sig := strings.TrimPrefix(parts[1], "Signature=")
	if strings.ContainsAny(sig, "+=/") {
		t.Fatalf("signature %q is not in CloudFront's URL-safe alphabet", sig)
	}
	std := strings.NewReplacer("-", "+", "_", "=", "~", "/").Replace(sig)
	p.signature, err = base64.StdEncoding.DecodeString(std)
	if err != nil {
		t.Fatalf("signature: %v", err)
	}
	policy := `{"Statement":[{"Resource":"` + base + `","Condition":{"DateLessThan":{"AWS:EpochTime":` +
		strconv.FormatInt(exp, 10) + `}}}]}`
	digest := sha1.Sum([]byte(policy))
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if err := rsa.VerifyPKCS1v15(k, crypto.SHA1, digest[:], p.signature); err != nil {
			t.Fatalf("%s: RSA signature does not verify: %v", raw, err)
		}
	case *ecdsa.PublicKey:
		if !ecdsa.VerifyASN1(k, digest[:], p.signature) {
			t.Fatalf("%s: ECDSA signature does not verify", raw)
		}
	default:
		t.Fatalf("key %T", pub)
	}
	return p
}

// TestCloudFrontURLShape: the URL is https://<domain><origin path>/<object
// key> with a canned policy that verifies with the public key, for RSA
// (PKCS #1 and PKCS #8) and ECDSA P-256 (SEC 1 and PKCS #8) keys, and a
// tampered URL does not.
func TestCloudFrontURLShape(t *testing.T) {
	rk, ek := cftKeys(t)
	ecDER, err := x509.MarshalECPrivateKey(ek)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, keyType string
		pem           []byte
		pub           crypto.PublicKey
	}{
		{"rsa pkcs1", "rsa", cftPEM(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rk)), &rk.PublicKey},
		{"rsa pkcs8", "rsa", cftPKCS8(t, rk), &rk.PublicKey},
		{"ecdsa sec1", "ecdsa-p256", cftPEM(t, "EC PRIVATE KEY", ecDER), &ek.PublicKey},
		{"ecdsa pkcs8", "ecdsa-p256", cftPKCS8(t, ek), &ek.PublicKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, origin := range []string{"", "/segments", "/a/b-c_d.e~f"} {
				p := cftSigner(t, tc.pem, CloudFrontOptions{Domain: "D111111ABCDEF8.cloudfront.net", OriginPath: origin})
				if p.KeyType() != tc.keyType {
					t.Fatalf("KeyType %q", p.KeyType())
				}
				now := time.Unix(1_800_000_007, 300e6)
				raw, exp, err := p.URL(idOf(cftSeg), now, now.Add(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				u := cftVerify(t, raw, tc.pub, "K2JCJMDEHXQW5F")
				want := "https://d111111abcdef8.cloudfront.net" + origin + "/syncular/seg/sha256/" + strings.TrimPrefix(cftSeg, "sha256:")
				if u.resource != want {
					t.Fatalf("resource %q, want %q", u.resource, want)
				}
				pu, err := url.Parse(raw)
				if err != nil || pu.Query().Get("Expires") == "" {
					t.Fatalf("URL %q does not parse as a URL", raw)
				}
				// No partition id in the URL; the signature is left out of
				// the check, as its base64 holds any short text by chance.
				q := pu.Query()
				q.Del("Signature")
				if bare := pu.Scheme + "://" + pu.Host + pu.Path + "?" + q.Encode(); strings.Contains(bare, "p1") {
					t.Fatalf("URL %q names the partition", raw)
				}
				// Window 15 s (TTL 60 s / 4): signed at 1_800_000_000.
				if u.expires != 1_800_000_060 || exp.Unix() != u.expires || exp.Nanosecond() != 0 {
					t.Fatalf("Expires %d, expires %v", u.expires, exp)
				}
				// The verifier can fail: another resource or expiry does not verify.
				for _, bad := range []string{
					strings.Replace(raw, "Expires=1800000060", "Expires=1800000061", 1),
					strings.Replace(raw, "/seg/sha256/4f", "/seg/sha256/5f", 1),
				} {
					ft := &fakeT{TB: t}
					func() {
						defer func() { _ = recover() }()
						cftVerify(ft, bad, tc.pub, "K2JCJMDEHXQW5F")
					}()
					if !ft.failed {
						t.Fatalf("tampered URL verified: %s", bad)
					}
				}
			}
		})
	}
}

// fakeT records a failure instead of ending the test (to show the
// verifier fails).
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = true
	panic("fatal")
}

// TestCloudFrontBounds: the window and grant-bound rules with an injected
// clock. Expires is start+TTL or the last whole second strictly before
// the grant's end; no URL when no whole second fits.
func TestCloudFrontBounds(t *testing.T) {
	rk, _ := cftKeys(t)
	keyPEM := cftPKCS8(t, rk)
	base := int64(1_800_000_000) // a multiple of 60
	type c struct {
		name          string
		ttl, window   int64
		now, notAfter float64 // seconds after base
		expires       int64   // expected Expires, seconds after base
		err           error
	}
	cases := []c{
		{name: "far grant, window start", ttl: 60, now: 0, notAfter: 1e6, expires: 60},
		{name: "far grant, inside window", ttl: 60, now: 7.3, notAfter: 1e6, expires: 60},
		{name: "far grant, window end", ttl: 60, now: 14.999, notAfter: 1e6, expires: 60},
		{name: "next window", ttl: 60, now: 15, notAfter: 1e6, expires: 75},
		{name: "grant ends first", ttl: 60, now: 7.3, notAfter: 30.5, expires: 30},
		{name: "grant ends on a second", ttl: 60, now: 7.3, notAfter: 9, expires: 8},
		{name: "grant ends on the next second", ttl: 60, now: 7.3, notAfter: 8, err: ErrCloudFrontGrantTooShort},
		{name: "grant ends within the second", ttl: 60, now: 7.3, notAfter: 7.9, err: ErrCloudFrontGrantTooShort},
		{name: "now on a second, +1000ms", ttl: 60, now: 7, notAfter: 8, err: ErrCloudFrontGrantTooShort},
		{name: "now on a second, +1001ms", ttl: 60, now: 7, notAfter: 8.001, expires: 8},
		{name: "grant ended at now", ttl: 60, now: 7.3, notAfter: 7.3, err: ErrCloudFrontGrantEnded},
		{name: "grant ended before now", ttl: 60, now: 7.3, notAfter: 2, err: ErrCloudFrontGrantEnded},
		{name: "ttl 1h window 10m", ttl: 3600, window: 600, now: 599, notAfter: 1e6, expires: 3600},
		{name: "ttl 1h window 10m, next", ttl: 3600, window: 600, now: 600, notAfter: 1e6, expires: 4200},
		{name: "default ttl", now: 3, notAfter: 1e6, expires: 60},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := cftSigner(t, keyPEM, CloudFrontOptions{TTL: time.Duration(tc.ttl) * time.Second, Window: time.Duration(tc.window) * time.Second})
			at := func(s float64) time.Time { return time.Unix(base, 0).Add(time.Duration(s * float64(time.Second))) }
			now, notAfter := at(tc.now), at(tc.notAfter)
			raw, exp, err := p.URL(idOf(cftSeg), now, notAfter)
			if tc.err != nil {
				if err != tc.err || raw != "" || !errors.Is(err, tc.err) {
					t.Fatalf("URL = %q, %v; want %v", raw, err, tc.err)
				}
				if _, _, ok := p.CachedURL(idOf(cftSeg), now, notAfter); ok {
					t.Fatal("CachedURL answered where URL refused")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			u := cftVerify(t, raw, &rk.PublicKey, "K2JCJMDEHXQW5F")
			if u.expires != base+tc.expires || exp.Unix() != u.expires {
				t.Fatalf("Expires %+d, want %+d (expires %v)", u.expires-base, tc.expires, exp)
			}
			cftInvariants(t, p, now, notAfter, u)
		})
	}
	if !errors.Is(ErrCloudFrontGrantTooShort, ErrGrantTooShort) || !errors.Is(ErrS3GrantTooShort, ErrGrantTooShort) ||
		!errors.Is(ErrCloudFrontGrantEnded, ErrGrantEnded) || !errors.Is(ErrS3GrantEnded, ErrGrantEnded) {
		t.Fatal("the signers' errors do not wrap the shared ones")
	}
}

// cftInvariants: Expires is a whole second after now, no later than
// now+TTL, and strictly before the grant's end.
func cftInvariants(t testing.TB, p *CloudFrontSigner, now, notAfter time.Time, u cftParsed) {
	t.Helper()
	end := time.Unix(u.expires, 0)
	if !end.After(now) || end.After(now.Add(p.TTL())) || !end.Before(notAfter) {
		t.Fatalf("now %v notAfter %v: Expires %v", now, notAfter, end)
	}
}

// TestCloudFrontBoundsRandom: the invariants over random clocks, TTLs,
// windows and grants; too short exactly when no whole second lies
// strictly between now and the grant's end.
func TestCloudFrontBoundsRandom(t *testing.T) {
	rk, _ := cftKeys(t)
	keyPEM := cftPKCS8(t, rk)
	rng := mrand.New(mrand.NewPCG(3, 4))
	base := time.Unix(1_800_000_000, 0)
	for i := 0; i < 200; i++ {
		ttl := int64(1 + rng.IntN(3600))
		window := int64(1 + rng.IntN(int(ttl)))
		p := cftSigner(t, keyPEM, CloudFrontOptions{TTL: time.Duration(ttl) * time.Second, Window: time.Duration(window) * time.Second})
		now := base.Add(time.Duration(rng.Int64N(int64(2 * time.Hour))))
		var notAfter time.Time
		switch rng.IntN(3) {
		case 0:
			notAfter = now.Add(time.Duration(1 + rng.Int64N(int64(2*time.Second))))
		case 1:
			notAfter = now.Add(time.Duration(1 + rng.Int64N(ttl*int64(time.Second))))
		default:
			notAfter = now.Add(24 * time.Hour)
		}
		raw, _, err := p.URL(idOf(cftSeg), now, notAfter)
		last := notAfter.Add(-1).Truncate(time.Second)
		if !last.After(now) {
			if err != ErrCloudFrontGrantTooShort {
				t.Fatalf("now %v notAfter %v: %q, %v; want ErrCloudFrontGrantTooShort", now, notAfter, raw, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		u := cftVerify(t, raw, &rk.PublicKey, "K2JCJMDEHXQW5F")
		cftInvariants(t, p, now, notAfter, u)
		// A long grant gets at least TTL-W of life.
		if notAfter.Sub(now) > time.Duration(ttl+1)*time.Second && time.Unix(u.expires, 0).Sub(now) < time.Duration(ttl-window)*time.Second {
			t.Fatalf("ttl %d window %d now %v: Expires %d too soon", ttl, window, now, u.expires)
		}
	}
}

// TestCloudFrontSameURL: within a window every request gets the identical
// URL (from the cache), a second signer with the same configuration (an
// other edge) produces the identical URL for RSA and for ECDSA, and the
// next window gets a new one.
func TestCloudFrontSameURL(t *testing.T) {
	rk, ek := cftKeys(t)
	for _, keyPEM := range [][]byte{cftPKCS8(t, rk), cftPKCS8(t, ek)} {
		a := cftSigner(t, keyPEM, CloudFrontOptions{OriginPath: "/cdn"})
		b := cftSigner(t, keyPEM, CloudFrontOptions{OriginPath: "/cdn"})
		base := time.Unix(1_800_000_000, 0)
		first, _, err := a.URL(idOf(cftSeg), base.Add(100*time.Millisecond), base.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		for _, off := range []time.Duration{time.Second, 7 * time.Second, 14999 * time.Millisecond} {
			for _, p := range []*CloudFrontSigner{a, b} {
				u, _, err := p.URL(idOf(cftSeg), base.Add(off), base.Add(time.Hour))
				if err != nil || u != first {
					t.Fatalf("at +%v: %q, %v; want %q", off, u, err, first)
				}
			}
		}
		if a.Len() != 1 {
			t.Fatalf("Len %d after one distinct URL", a.Len())
		}
		if u, _, ok := a.CachedURL(idOf(cftSeg), base.Add(3*time.Second), base.Add(time.Hour)); !ok || u != first {
			t.Fatalf("CachedURL %q %v", u, ok)
		}
		next, _, err := a.URL(idOf(cftSeg), base.Add(15*time.Second), base.Add(time.Hour))
		if err != nil || next == first {
			t.Fatalf("next window: %q, %v", next, err)
		}
		// Another grant end inside the TTL is another URL (its own Expires).
		short, _, err := a.URL(idOf(cftSeg), base.Add(time.Second), base.Add(20*time.Second))
		if err != nil || short == first || !strings.Contains(short, "Expires=1800000019&") {
			t.Fatalf("short grant: %q, %v", short, err)
		}
	}
}

// TestCloudFrontConfigRefused: every bad option is refused at
// construction, and no error quotes the key.
func TestCloudFrontConfigRefused(t *testing.T) {
	rk, _ := cftKeys(t)
	good := cftPKCS8(t, rk)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	// Deprecated API, but an encrypted PEM is what must be refused, and
	// the standard library has no other way to make one.
	//lint:ignore SA1019 the test needs a legacy encrypted PEM block to refuse it
	enc, err := x509.EncryptPEMBlock(rand.Reader, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rk), []byte("pw"), x509.PEMCipherAES256)
	if err != nil {
		t.Fatal(err)
	}
	goodOpts := CloudFrontOptions{Domain: "d111111abcdef8.cloudfront.net", KeyPairID: "K2JCJMDEHXQW5F", PrivateKeyPEM: good}
	if _, err := NewCloudFrontSigner(cftObjectKey, goodOpts); err != nil {
		t.Fatalf("good options refused: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		mod        func(o *CloudFrontOptions)
		objectKey  func(segid.ID) string
	}{
		{"no key", "not PEM", func(o *CloudFrontOptions) { o.PrivateKeyPEM = nil }, nil},
		{"garbage key", "not PEM", func(o *CloudFrontOptions) { o.PrivateKeyPEM = []byte("not a key") }, nil},
		{"truncated key", "does not parse", func(o *CloudFrontOptions) {
			b, _ := pem.Decode(good)
			o.PrivateKeyPEM = cftPEM(t, "PRIVATE KEY", b.Bytes[:len(b.Bytes)/2])
		}, nil},
		{"rsa pkcs1 bytes labelled ec", "does not parse", func(o *CloudFrontOptions) {
			o.PrivateKeyPEM = cftPEM(t, "EC PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rk))
		}, nil},
		{"two blocks", "more than one", func(o *CloudFrontOptions) { o.PrivateKeyPEM = append(append([]byte{}, good...), good...) }, nil},
		{"rsa 1024", "1024-bit", func(o *CloudFrontOptions) { o.PrivateKeyPEM = cftPKCS8(t, small) }, nil},
		{"ecdsa p384", "P-256 only", func(o *CloudFrontOptions) { o.PrivateKeyPEM = cftPKCS8(t, p384) }, nil},
		{"ed25519", "RSA 2048 or ECDSA P-256", func(o *CloudFrontOptions) { o.PrivateKeyPEM = cftPKCS8(t, edKey) }, nil},
		{"public key", "not a private key", func(o *CloudFrontOptions) { o.PrivateKeyPEM = cftPEM(t, "PUBLIC KEY", pubDER) }, nil},
		{"encrypted", "encrypted", func(o *CloudFrontOptions) { o.PrivateKeyPEM = pem.EncodeToMemory(enc) }, nil},
		{"no domain", "domain is required", func(o *CloudFrontOptions) { o.Domain = "" }, nil},
		{"https scheme", "without a scheme", func(o *CloudFrontOptions) { o.Domain = "https://d111111abcdef8.cloudfront.net" }, nil},
		{"path", "without a path", func(o *CloudFrontOptions) { o.Domain = "d111111abcdef8.cloudfront.net/segments" }, nil},
		{"trailing slash", "without a path", func(o *CloudFrontOptions) { o.Domain = "d111111abcdef8.cloudfront.net/" }, nil},
		{"query", "without a path", func(o *CloudFrontOptions) { o.Domain = "d111111abcdef8.cloudfront.net?x" }, nil},
		{"port", "not a host name", func(o *CloudFrontOptions) { o.Domain = "d111111abcdef8.cloudfront.net:443" }, nil},
		{"user info", "not a host name", func(o *CloudFrontOptions) { o.Domain = "u@d111111abcdef8.cloudfront.net" }, nil},
		{"empty label", "not a host name", func(o *CloudFrontOptions) { o.Domain = "d1..cloudfront.net" }, nil},
		{"origin path without slash", "origin_path", func(o *CloudFrontOptions) { o.OriginPath = "segments" }, nil},
		{"origin path trailing slash", "origin_path", func(o *CloudFrontOptions) { o.OriginPath = "/segments/" }, nil},
		{"origin path dot-dot", "origin_path", func(o *CloudFrontOptions) { o.OriginPath = "/a/../b" }, nil},
		{"origin path query", "origin_path", func(o *CloudFrontOptions) { o.OriginPath = "/a?b" }, nil},
		{"origin path space", "origin_path", func(o *CloudFrontOptions) { o.OriginPath = "/a b" }, nil},
		{"no key pair id", "key_pair_id", func(o *CloudFrontOptions) { o.KeyPairID = "" }, nil},
		{"key pair id with &", "key_pair_id", func(o *CloudFrontOptions) { o.KeyPairID = "K2&x=y" }, nil},
		{"ttl too long", "ttl", func(o *CloudFrontOptions) { o.TTL = 8 * 24 * time.Hour }, nil},
		{"window beyond ttl", "window", func(o *CloudFrontOptions) { o.TTL = time.Minute; o.Window = 2 * time.Minute }, nil},
		{"prefix with a space", "object keys", nil, func(id segid.ID) string { return "my segs/" + id.Hex() }},
		{"prefix with dot-dot", "object keys", nil, func(id segid.ID) string { return "../" + id.Hex() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := goodOpts
			if tc.mod != nil {
				tc.mod(&o)
			}
			ok := cftObjectKey
			if tc.objectKey != nil {
				ok = tc.objectKey
			}
			p, err := NewCloudFrontSigner(ok, o)
			if err == nil || p != nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "BEGIN") || strings.Contains(err.Error(), "MII") {
				t.Fatalf("error quotes the key: %v", err)
			}
		})
	}
	if _, _, err := cftSigner(t, good, CloudFrontOptions{}).URL(idOf("sha256:ABC"), time.Unix(0, 0), time.Unix(100, 0)); err == nil {
		t.Fatal("malformed id accepted")
	}
}

// TestCloudFrontBotocore: the signed URLs are byte for byte those of a
// second implementation, botocore's CloudFrontSigner with an RSA signer
// from python's cryptography (RSA PKCS #1 v1.5 is deterministic, so the
// whole URL must match). Skipped when python3 with botocore and
// cryptography is not installed.
func TestCloudFrontBotocore(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	if out, err := exec.Command(py, "-c", "import botocore.signers, cryptography").CombinedOutput(); err != nil {
		t.Skipf("python3 without botocore/cryptography: %s", out)
	}
	rk, _ := cftKeys(t)
	keyPEM := cftPEM(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rk))
	keyFile := filepath.Join(t.TempDir(), "cf.pem")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	const script = `
import sys, datetime
from botocore.signers import CloudFrontSigner
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding
key = serialization.load_pem_private_key(open(sys.argv[1], 'rb').read(), password=None)
signer = CloudFrontSigner(sys.argv[2], lambda m: key.sign(m, padding.PKCS1v15(), hashes.SHA1()))
for line in sys.stdin:
    url, exp = line.split()
    print(signer.generate_presigned_url(url, date_less_than=datetime.datetime.fromtimestamp(int(exp), tz=datetime.timezone.utc)))
`
	p := cftSigner(t, keyPEM, CloudFrontOptions{OriginPath: "/cdn", TTL: time.Hour})
	var in strings.Builder
	var ours []string
	base := time.Unix(1_800_000_000, 0)
	for i, grant := range []time.Duration{2 * time.Hour, 90 * time.Second, 1500 * time.Millisecond} {
		now := base.Add(time.Duration(i) * 17 * time.Minute)
		raw, exp, err := p.URL(idOf(cftSeg), now, now.Add(grant))
		if err != nil {
			t.Fatal(err)
		}
		ours = append(ours, raw)
		resource, _, _ := strings.Cut(raw, "?")
		in.WriteString(resource + " " + strconv.FormatInt(exp.Unix(), 10) + "\n")
	}
	cmd := exec.Command(py, "-c", script, keyFile, "K2JCJMDEHXQW5F")
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("botocore: %v: %s", err, out)
	}
	theirs := strings.Fields(string(out))
	if len(theirs) != len(ours) {
		t.Fatalf("botocore printed %q", out)
	}
	for i := range ours {
		if ours[i] != theirs[i] {
			t.Errorf("URL %d:\nours     %s\nbotocore %s", i, ours[i], theirs[i])
		}
	}
}

// BenchmarkCloudFrontURL: a URL from the cache (the common case: one
// signing per segment and window) against a fresh signing per call, for
// RSA 2048 and ECDSA P-256.
func BenchmarkCloudFrontURL(b *testing.B) {
	rk, ek := cftKeys(b)
	for _, k := range []struct {
		name string
		key  any
	}{{"rsa2048", rk}, {"ecdsa-p256", ek}} {
		p := cftSigner(b, cftPKCS8(b, k.key), CloudFrontOptions{})
		now := time.Unix(1_800_000_000, 0)
		b.Run(k.name+"/cached", func(b *testing.B) {
			if _, _, err := p.URL(idOf(cftSeg), now, now.Add(time.Hour)); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, _, ok := p.CachedURL(idOf(cftSeg), now, now.Add(time.Hour)); !ok {
					b.Fatal("miss")
				}
			}
		})
		b.Run(k.name+"/sign", func(b *testing.B) {
			i := 0
			for b.Loop() {
				// A new grant end each time: a new URL, signed.
				i++
				if _, _, err := p.URL(idOf(cftSeg), now, now.Add(time.Duration(2+i%50)*time.Second)); err != nil {
					b.Fatal(err)
				}
				if i%50 == 0 {
					now = now.Add(15 * time.Second)
				}
			}
		})
	}
}

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
