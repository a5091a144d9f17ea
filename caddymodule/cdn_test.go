package caddymodule

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/syncular/caddy-syncular/internal/s3test"
)

const cdnTestKeyID = "K2JCJMDEHXQW5F"

// cdnWriteKey writes k as PKCS #8 PEM to a temp file and returns its path.
func cdnWriteKey(t testing.TB, k any) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "cloudfront.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// cdnCheckSigned checks loc as CloudFront checks a canned-policy URL,
// independently of the SDK: https://<domain><path>?Expires&Signature&Key-Pair-Id
// and nothing else, the signature (CloudFront's base64 alphabet) verifying
// with pub over SHA-1 of
// {"Statement":[{"Resource":"<url>","Condition":{"DateLessThan":{"AWS:EpochTime":<exp>}}}]}.
// It returns the resource and Expires.
func cdnCheckSigned(t testing.TB, loc string, pub crypto.PublicKey) (string, time.Time) {
	t.Helper()
	resource, query, _ := strings.Cut(loc, "?")
	parts := strings.Split(query, "&")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "Expires=") || !strings.HasPrefix(parts[1], "Signature=") ||
		parts[2] != "Key-Pair-Id="+cdnTestKeyID {
		t.Fatalf("Location %q is not a canned-policy signed URL", loc)
	}
	exp, err := strconv.ParseInt(strings.TrimPrefix(parts[0], "Expires="), 10, 64)
	if err != nil {
		t.Fatalf("Expires: %v", err)
	}
	sig, err := base64.StdEncoding.DecodeString(strings.NewReplacer("-", "+", "_", "=", "~", "/").Replace(strings.TrimPrefix(parts[1], "Signature=")))
	if err != nil {
		t.Fatalf("Signature: %v", err)
	}
	digest := sha1.Sum([]byte(`{"Statement":[{"Resource":"` + resource + `","Condition":{"DateLessThan":{"AWS:EpochTime":` + strconv.FormatInt(exp, 10) + `}}}]}`))
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if err := rsa.VerifyPKCS1v15(k, crypto.SHA1, digest[:], sig); err != nil {
			t.Fatalf("Location %q: signature does not verify: %v", loc, err)
		}
	case *ecdsa.PublicKey:
		if !ecdsa.VerifyASN1(k, digest[:], sig) {
			t.Fatalf("Location %q: signature does not verify", loc)
		}
	}
	return resource, time.Unix(exp, 0)
}

// TestCDNRedirect provisions handlers with a cdn cloudfront block on a
// real bucket (versitygw) and an injected clock: a granted request is
// answered 302 to a CloudFront URL that verifies with the public key,
// never outlives the grant (the grant's last second is streamed), is the
// same for every request of a window and from a second edge with the
// same config, carries no partition id; objects with a legacy record
// header are streamed unless legacy_headers redirect.
func TestCDNRedirect(t *testing.T) {
	srv := s3test.Start(t)
	const bucket = "segs"
	srv.CreateBucket(t, bucket)
	base := time.Unix(testNow.Unix()-testNow.Unix()%15, 0) // a window boundary (default window 15 s)
	end := base.Add(2 * time.Minute)
	rec := func(body []byte) map[string]any {
		return map[string]any{
			"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
			"scopeDigest": digestA, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
			"segmentId": s3test.SegmentID(body), "byteLength": len(body),
			"createdAtMs": testNow.UnixMilli(), "expiresAtMs": end.UnixMilli(),
		}
	}
	const prefix = "syncular/"
	current := bytes.Repeat([]byte("cdn-current"), 100)
	curID := s3test.PutSegment(t, srv.Client(), bucket, prefix, current, "")
	s3test.PutRecordObject(t, srv.Client(), bucket, prefix, curID, rec(current))
	legacy := bytes.Repeat([]byte("cdn-legacy"), 100)
	legID := s3test.PutSegment(t, srv.Client(), bucket, prefix, legacy, s3test.RecordHeader(rec(legacy)))

	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaFile := cdnWriteKey(t, rk)
	ecFile := cdnWriteKey(t, ek)
	ecDER, _ := x509.MarshalECPrivateKey(ek)
	t.Setenv("SYNCULAR_TEST_CF_KEY", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER})))

	var now time.Time
	mk := func(t *testing.T, privateKey, legacyHeaders string) *Handler {
		t.Helper()
		h := testHooks(&Handler{
			Keys:     []string{string(testKey)},
			Audience: &AudienceConfig{Kind: "template", Template: "aud:{partition}"},
			Store: &StoreConfig{Backend: "s3", S3: &S3Config{
				Bucket: bucket, Region: srv.Region, Endpoint: srv.Endpoint, Prefix: prefix,
				AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey,
			}},
			Delivery:      DeliveryRedirect,
			LegacyHeaders: legacyHeaders,
			CDN: &CDNConfig{CloudFront: &CloudFrontConfig{
				Domain: "d111111abcdef8.cloudfront.net", KeyPairID: cdnTestKeyID, PrivateKey: privateKey, OriginPath: "/cdn",
			}},
			DisableMetrics: true,
			Compress:       []string{"off"},
			Cache:          &CacheConfig{RecordTTL: new(caddy.Duration), Disk: "off"},
		}, withWeakKeys(), withClock(func() time.Time { return now }))
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Cleanup() })
		return h
	}
	target := func(id string) string {
		return "/sync/segments/" + url.PathEscape(id) + "?st=" + mintToken(id, digestA, "aud:p1", end.Add(time.Hour))
	}
	wantResource := "https://d111111abcdef8.cloudfront.net/cdn/syncular/seg/sha256/" + strings.TrimPrefix(curID, "sha256:")

	for _, key := range []struct {
		name, placeholder string
		pub               crypto.PublicKey
	}{
		{"rsa from file", "{file." + rsaFile + "}", &rk.PublicKey},
		{"ecdsa sec1 from env", "{env.SYNCULAR_TEST_CF_KEY}", &ek.PublicKey},
		{"ecdsa pkcs8 from file", "{file." + ecFile + "}", &ek.PublicKey},
	} {
		t.Run(key.name, func(t *testing.T) {
			h := mk(t, key.placeholder, "")
			for _, tc := range []struct {
				left     time.Duration
				redirect bool
			}{
				{90 * time.Second, true},
				{30 * time.Second, true},
				{2 * time.Second, true},
				{1001 * time.Millisecond, true},
				{1000 * time.Millisecond, false}, // Expires would be the grant's end itself
				{300 * time.Millisecond, false},
			} {
				now = end.Add(-tc.left)
				for _, method := range []string{http.MethodGet, http.MethodHead} {
					rr, _ := serve(t, h, method, target(curID), nil)
					for k, vs := range rr.Header() {
						if k != "Location" && strings.Contains(strings.Join(vs, " "), "p1") {
							t.Fatalf("header %s carries the partition id: %q", k, vs)
						}
					}
					if !tc.redirect {
						if rr.Code != http.StatusOK || rr.Header().Get("Location") != "" {
							t.Fatalf("%v left: status %d, Location %q; want the bytes", tc.left, rr.Code, rr.Header().Get("Location"))
						}
						if method == http.MethodGet && !bytes.Equal(rr.Body.Bytes(), current) {
							t.Fatalf("%v left: streamed %d bytes", tc.left, rr.Body.Len())
						}
						continue
					}
					if rr.Code != http.StatusFound || rr.Header().Get("ETag") != "" || rr.Body.Len() != 0 {
						t.Fatalf("%v left, %s: status %d, ETag %q; want a bare 302", tc.left, method, rr.Code, rr.Header().Get("ETag"))
					}
					loc := rr.Header().Get("Location")
					resource, expires := cdnCheckSigned(t, loc, key.pub)
					if resource != wantResource {
						t.Fatalf("resource %q, want %q", resource, wantResource)
					}
					if !expires.After(now) || !expires.Before(end) || expires.After(now.Add(60*time.Second)) {
						t.Fatalf("%v left (now %v, grant ends %v): Expires %v", tc.left, now, end, expires)
					}
					maxAge := int64(expires.Sub(now) / time.Second)
					if cc := rr.Header().Get("Cache-Control"); cc != "private, max-age="+strconv.FormatInt(maxAge, 10) {
						t.Fatalf("%v left: Cache-Control %q, Expires %v", tc.left, cc, expires)
					}
				}
			}

			// One window, one URL; another edge (handler) with the same
			// config hands out the identical URL; the next window another.
			other := mk(t, key.placeholder, "")
			loc := func(h *Handler, at time.Time) string {
				now = at
				rr, _ := serve(t, h, http.MethodGet, target(curID), nil)
				if rr.Code != http.StatusFound {
					t.Fatalf("status %d at %v", rr.Code, at)
				}
				return rr.Header().Get("Location")
			}
			a := loc(h, base.Add(time.Second))
			if b := loc(h, base.Add(14*time.Second+999*time.Millisecond)); b != a {
				t.Errorf("same window, different URLs:\n%s\n%s", a, b)
			}
			if b := loc(other, base.Add(7*time.Second)); b != a {
				t.Errorf("another edge, same window, different URL:\n%s\n%s", a, b)
			}
			if b := loc(h, base.Add(15*time.Second)); b == a {
				t.Error("next window, same URL")
			}

			// A legacy record header would reach the client through the
			// CDN: the object is streamed.
			now = base.Add(time.Second)
			rr, _ := serve(t, h, http.MethodGet, target(legID), nil)
			if rr.Code != http.StatusOK || rr.Header().Get("Location") != "" || !bytes.Equal(rr.Body.Bytes(), legacy) {
				t.Fatalf("legacy object: status %d, Location %q", rr.Code, rr.Header().Get("Location"))
			}
		})
	}

	t.Run("legacy_headers redirect", func(t *testing.T) {
		h := mk(t, "{file."+rsaFile+"}", legacyHeadersRedirect)
		now = base.Add(time.Second)
		rr, _ := serve(t, h, http.MethodGet, target(legID), nil)
		if rr.Code != http.StatusFound {
			t.Fatalf("status %d, want 302", rr.Code)
		}
		resource, _ := cdnCheckSigned(t, rr.Header().Get("Location"), &rk.PublicKey)
		if !strings.HasSuffix(resource, strings.TrimPrefix(legID, "sha256:")) {
			t.Fatalf("resource %q", resource)
		}
	})
}

// TestCDNProvisionErrors: every bad cdn block is refused at provision,
// and no error shows key material.
func TestCDNProvisionErrors(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good, smallFile, p384File := cdnWriteKey(t, rk), cdnWriteKey(t, small), cdnWriteKey(t, p384)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	os.WriteFile(garbage, []byte("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"), 0o600)
	goodPEM, _ := os.ReadFile(good)
	t.Setenv("SYNCULAR_TEST_CF_EMPTY", "")
	os.Unsetenv("SYNCULAR_TEST_CF_MISSING")

	f := false
	mk := func(mod func(h *Handler, c *CloudFrontConfig)) Handler {
		h := Handler{
			Keys:     []string{strongKey},
			Audience: &AudienceConfig{Kind: "template", Template: "aud:{partition}"},
			Store: &StoreConfig{Backend: "s3", S3: &S3Config{
				Bucket: "segs", Region: "us-east-1", Endpoint: "http://127.0.0.1:1", AccessKeyID: "AK", SecretAccessKey: "SK",
			}},
			Delivery:           DeliveryRedirect,
			VerifyStoreOnStart: &f, // no bucket here: only a warning
			StoreTimeout:       caddy.Duration(100 * time.Millisecond),
			DisableMetrics:     true,
			CDN: &CDNConfig{CloudFront: &CloudFrontConfig{
				Domain: "d111111abcdef8.cloudfront.net", KeyPairID: cdnTestKeyID, PrivateKey: "{file." + good + "}",
			}},
		}
		if mod != nil {
			mod(&h, h.CDN.CloudFront)
		}
		return h
	}
	cases := []struct {
		name string
		mod  func(h *Handler, c *CloudFrontConfig)
		want string
	}{
		{"ok", nil, ""},
		{"ok with origin path", func(h *Handler, c *CloudFrontConfig) { c.OriginPath = "/segments" }, ""},
		{"no provider", func(h *Handler, c *CloudFrontConfig) { h.CDN.CloudFront = nil }, "cdn needs a provider"},
		{"delivery proxy", func(h *Handler, c *CloudFrontConfig) { h.Delivery = DeliveryProxy }, "cdn applies to delivery redirect only (delivery is proxy)"},
		{"delivery serve", func(h *Handler, c *CloudFrontConfig) { h.Delivery = DeliveryServe }, "cdn applies to delivery redirect only (delivery is serve)"},
		{"sqlite store", func(h *Handler, c *CloudFrontConfig) {
			h.Delivery = DeliveryServe
			h.Store = &StoreConfig{Backend: "sqlite", Path: "/nonexistent.db"}
			h.VerifyStoreOnStart = nil // an s3-only setting, refused with sqlite
		}, "cdn needs an s3 store"},
		{"no key", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "" }, "private_key is required"},
		{"literal key", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = string(goodPEM) }, "write private_key as {file./path/to/key.pem} or {env.NAME}"},
		{"placeholder plus text", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "x{env.HOME}" }, "write private_key as"},
		{"missing file", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "{file./nonexistent/cf.pem}" }, "file /nonexistent/cf.pem is missing"},
		{"empty env", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "{env.SYNCULAR_TEST_CF_EMPTY}" }, "SYNCULAR_TEST_CF_EMPTY is unset or empty"},
		{"unset env", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "{env.SYNCULAR_TEST_CF_MISSING}" }, "SYNCULAR_TEST_CF_MISSING is unset or empty"},
		{"unparsable key", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "{file." + garbage + "}" }, "private_key does not parse"},
		{"rsa 1024", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "{file." + smallFile + "}" }, "1024-bit RSA key"},
		{"ecdsa p384", func(h *Handler, c *CloudFrontConfig) { c.PrivateKey = "{file." + p384File + "}" }, "P-256 only"},
		{"no domain", func(h *Handler, c *CloudFrontConfig) { c.Domain = "" }, "domain is required"},
		{"domain with scheme", func(h *Handler, c *CloudFrontConfig) { c.Domain = "https://d111111abcdef8.cloudfront.net" }, "without a scheme"},
		{"domain with path", func(h *Handler, c *CloudFrontConfig) { c.Domain = "d111111abcdef8.cloudfront.net/segs" }, "without a path"},
		{"no key pair id", func(h *Handler, c *CloudFrontConfig) { c.KeyPairID = "" }, "key_pair_id is required"},
		{"bad origin path", func(h *Handler, c *CloudFrontConfig) { c.OriginPath = "segments/" }, "origin_path must start with"},
		{"unsafe store prefix", func(h *Handler, c *CloudFrontConfig) { h.Store.S3.Prefix = "my segs/" }, "object keys (its prefix)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := mk(c.mod)
			err := provision(t, &h)
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if h.cdn == nil {
					t.Fatal("no CloudFront signer built")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), "BEGIN") || strings.Contains(err.Error(), "MII") || strings.Contains(err.Error(), "bm90IGEga2V5") {
				t.Fatalf("error shows key material: %v", err)
			}
		})
	}
}
