package integration

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/s3test"
)

// cdnSite redirects to CloudFront signed URLs of the bucket's objects.
// {{CF_KEY}} is the private_key placeholder; the access log carries the
// shipped filter.
const cdnSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log default {
		output stderr
		format filter {
			request>uri regexp "(?i)([?&#;])(s|%73)(t|%74)(=|%3d)[^&]*" "$1"
			resp_headers>Location delete
		}
	}
}

http://127.0.0.1:{{PORT}} {
	log {
		output file {{DIR}}/access.log
		format filter {
			request>uri regexp "(?i)([?&#;])(s|%73)(t|%74)(=|%3d)[^&]*" "$1"
			resp_headers>Location delete
		}
	}
	syncular_segments /c/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery redirect
		presign_ttl 30s
		store_timeout 3s
		cdn cloudfront {
			domain d111111abcdef8.cloudfront.net
			key_pair_id K2JCJMDEHXQW5F
			private_key {{CF_KEY}}
			origin_path /cdn
		}
	}
	respond 404
}
`

// cdnKeyPEM generates an RSA 2048 key, its PKCS #8 PEM, and writes the
// PEM to a temp file.
func cdnKeyPEM(t *testing.T) (*rsa.PrivateKey, string, string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	f := filepath.Join(t.TempDir(), "cloudfront.pem")
	if err := os.WriteFile(f, []byte(p), 0o600); err != nil {
		t.Fatal(err)
	}
	return k, p, f
}

// cfURL is a CloudFront signed URL checked as CloudFront checks a canned
// policy, independently of the SDK the edge signs with.
type cfURL struct {
	raw, resource, signature string
	expires                  time.Time
}

// checkCloudFrontURL: loc is https://d111111abcdef8.cloudfront.net/cdn/<key>
// with exactly Expires, Signature and Key-Pair-Id, and the signature
// (CloudFront's base64: + → -, = → _, / → ~) verifies with pub, RSA
// PKCS #1 v1.5 over SHA-1 of
// {"Statement":[{"Resource":"<url>","Condition":{"DateLessThan":{"AWS:EpochTime":<exp>}}}]}.
func checkCloudFrontURL(t *testing.T, loc string, pub *rsa.PublicKey, key string) cfURL {
	t.Helper()
	resource, query, _ := strings.Cut(loc, "?")
	if want := "https://d111111abcdef8.cloudfront.net/cdn/" + key; resource != want {
		t.Fatalf("Location %q: resource is not %s", loc, want)
	}
	parts := strings.Split(query, "&")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "Expires=") || !strings.HasPrefix(parts[1], "Signature=") ||
		parts[2] != "Key-Pair-Id=K2JCJMDEHXQW5F" {
		t.Fatalf("Location %q is not a canned-policy signed URL", loc)
	}
	exp, err := strconv.ParseInt(strings.TrimPrefix(parts[0], "Expires="), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	sigText := strings.TrimPrefix(parts[1], "Signature=")
	sig, err := base64.StdEncoding.DecodeString(strings.NewReplacer("-", "+", "_", "=", "~", "/").Replace(sigText))
	if err != nil {
		t.Fatal(err)
	}
	digest := sha1.Sum([]byte(`{"Statement":[{"Resource":"` + resource + `","Condition":{"DateLessThan":{"AWS:EpochTime":` + strconv.FormatInt(exp, 10) + `}}}]}`))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA1, digest[:], sig); err != nil {
		t.Fatalf("Location %q: the signature does not verify with the public key: %v", loc, err)
	}
	return cfURL{raw: loc, resource: resource, signature: sigText, expires: time.Unix(exp, 0)}
}

// TestCDNCloudFront runs two edges (the real binary, the same config, the
// key from a file on one and from the environment on the other) on a
// versitygw bucket: a granted request gets a 302 to a CloudFront signed
// URL of the segment's object that verifies with the public key, expires
// within presign_ttl and strictly before the grant ends, and is the same
// on both edges within a signing window; the grant's last second and
// legacy-header objects are streamed; no log holds the signature or the
// URL.
func TestCDNCloudFront(t *testing.T) {
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	cl := srv.Client()
	now := time.Now()
	dA := strings.Repeat("a", 64)
	seg := randomBytes(t, 50_000)
	segID := s3test.SegmentID(seg)
	putCurrent(t, cl, seg, record(segID, len(seg), "p1", dA, now.Add(time.Hour)))
	objKey := "seg/sha256/" + strings.TrimPrefix(segID, "sha256:")
	legacy := randomBytes(t, 3000)
	legacyID := s3test.SegmentID(legacy)
	s3test.PutSegment(t, cl, "segments", "", legacy,
		base64.RawURLEncoding.EncodeToString([]byte(record(legacyID, len(legacy), "p1", dA, now.Add(time.Hour)))))

	key, keyPEM, keyFile := cdnKeyPEM(t)
	env := []string{"SEG_KEY=" + s3Key, "S3_ENDPOINT=" + srv.Endpoint, "S3_ACCESS_KEY=" + srv.AccessKey, "S3_SECRET_KEY=" + srv.SecretKey}
	a := startCaddy(t, strings.ReplaceAll(cdnSite, "{{CF_KEY}}", "{file."+keyFile+"}"), env...)
	b := startCaddy(t, strings.ReplaceAll(cdnSite, "{{CF_KEY}}", "{env.CF_PRIVATE_KEY}"), append(env, "CF_PRIVATE_KEY="+keyPEM)...)

	exp := now.Add(10 * time.Minute)
	tok := mint(segID, dA, "p1", exp)
	get := func(c *caddyProc, id, tok string) response {
		return do(t, "GET", c.Base+"/c/segments/"+id+"?st="+tok, nil)
	}
	redirected := func(r response) cfURL {
		t.Helper()
		if r.Status != 302 || len(r.Body) != 0 || r.Header.Get("ETag") != "" {
			t.Fatalf("status %d, ETag %q: %s; want a bare 302", r.Status, r.Header.Get("ETag"), r.Body)
		}
		u := checkCloudFrontURL(t, r.Header.Get("Location"), &key.PublicKey, objKey)
		var maxAge int64
		if _, err := fmt.Sscanf(r.Header.Get("Cache-Control"), "private, max-age=%d", &maxAge); err != nil || maxAge > 30 {
			t.Fatalf("Cache-Control %q", r.Header.Get("Cache-Control"))
		}
		for k, vs := range r.Header {
			if k != "Location" && strings.Contains(strings.Join(vs, " "), "p1") {
				t.Fatalf("header %s carries the partition id", k)
			}
		}
		return u
	}
	var signature string

	t.Run("signed URL of the object, the same on every edge within a window", func(t *testing.T) {
		before := time.Now()
		u1 := redirected(get(a, segID, tok))
		after := time.Now()
		if !u1.expires.After(after) || u1.expires.After(before.Add(30*time.Second)) {
			t.Fatalf("Expires %v not within presign_ttl of the request (%v..%v)", u1.expires, before, after)
		}
		// The path after origin_path is the object's key in the bucket.
		obj, err := cl.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("segments"), Key: aws.String(objKey)})
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(obj.Body)
		obj.Body.Close()
		if !bytes.Equal(body, seg) {
			t.Fatal("the URL's key does not hold the segment")
		}
		// Two requests can straddle a window's edge (Expires differs) on a
		// slow machine: then the next pair must agree.
		u2, u3 := redirected(get(a, segID, tok)), redirected(get(b, segID, tok))
		for try := 0; try < 3 && (u1.raw != u2.raw || u2.raw != u3.raw) && (u1.expires != u2.expires || u2.expires != u3.expires); try++ {
			u1, u2, u3 = u3, redirected(get(a, segID, tok)), redirected(get(b, segID, tok))
		}
		if u1.raw != u2.raw || u2.raw != u3.raw {
			t.Fatalf("one window, different URLs:\n%s\n%s\n%s", u1.raw, u2.raw, u3.raw)
		}
		signature = u1.signature
	})

	t.Run("never outlives the grant", func(t *testing.T) {
		// A token accepted inside the 60 s skew with about 2.x s left.
		startOfSecond(t)
		tokExp := time.Now().Add(-57 * time.Second)
		u := redirected(get(a, segID, mint(segID, dA, "p1", tokExp)))
		if grantEnd := time.Unix(tokExp.Unix()+60, 0); !u.expires.Before(grantEnd) || !u.expires.After(time.Now()) {
			t.Fatalf("Expires %v, grant ends %v", u.expires, grantEnd)
		}
	})

	t.Run("the grant's last second is streamed", func(t *testing.T) {
		startOfSecond(t)
		r := get(b, segID, mint(segID, dA, "p1", time.Now().Add(-59*time.Second)))
		if r.Status != 200 || r.Header.Get("Location") != "" || !bytes.Equal(r.Body, seg) {
			t.Fatalf("status %d, Location %q, %d bytes; want the segment streamed", r.Status, r.Header.Get("Location"), len(r.Body))
		}
	})

	t.Run("legacy record header is streamed", func(t *testing.T) {
		r := get(a, legacyID, mint(legacyID, dA, "p1", exp))
		if r.Status != 200 || r.Header.Get("Location") != "" || !bytes.Equal(r.Body, legacy) {
			t.Fatalf("status %d, Location %q; want the bytes", r.Status, r.Header.Get("Location"))
		}
		noAmz(t, r)
	})

	if signature == "" {
		t.Fatal("no signed URL was seen: the log check would prove nothing")
	}
	for _, c := range []*caddyProc{a, b} {
		logs := processLogs(t, c)
		mustShow(t, logs, "access.log", `"status":302`, "the redirect")
		for name, text := range logs {
			for _, s := range []string{"Signature=", "Key-Pair-Id", "cloudfront.net/cdn", `"Location":`, "BEGIN", "PRIVATE KEY-----"} {
				if strings.Contains(text, s) {
					t.Errorf("%s holds %q", name, s)
				}
			}
		}
		noneHolds(t, logs, tok, signature, s3Key, srv.SecretKey, `"p1"`)
	}
}

// TestCDNConfigRefused: the real binary refuses bad cdn blocks at
// `caddy validate` (provision), naming the problem and never the key.
func TestCDNConfigRefused(t *testing.T) {
	bin := caddyBinary(t)
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	_, keyPEM, keyFile := cdnKeyPEM(t)
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	weakFile := filepath.Join(t.TempDir(), "weak.pem")
	os.WriteFile(weakFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(weak)}), 0o600)
	dir := t.TempDir()
	site := func(delivery, cdn string) string {
		return strings.NewReplacer("{{DELIVERY}}", delivery, "{{CDN}}", cdn, "{{S3_SEGMENTS}}", s3SegmentsStore).Replace(`{
	admin off
}
:0 {
	syncular_segments {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery {{DELIVERY}}
		{{CDN}}
	}
}
`)
	}
	cf := func(domain, privateKey string) string {
		return "cdn cloudfront {\n\t\t\tdomain " + domain + "\n\t\t\tkey_pair_id K2JCJMDEHXQW5F\n\t\t\tprivate_key " + privateKey + "\n\t\t}"
	}
	good := "{file." + keyFile + "}"
	for _, tc := range []struct {
		name, delivery, cdn, want string
	}{
		{"valid", "redirect", cf("d111111abcdef8.cloudfront.net", good), ""},
		{"proxy delivery", "proxy", cf("d111111abcdef8.cloudfront.net", good), "cdn applies to delivery redirect only"},
		{"domain with scheme", "redirect", cf("https://d111111abcdef8.cloudfront.net", good), "without a scheme"},
		{"domain with path", "redirect", cf("d111111abcdef8.cloudfront.net/x", good), "without a path"},
		{"missing key file", "redirect", cf("d111111abcdef8.cloudfront.net", "{file."+dir+"/none.pem}"), "is missing, unreadable or empty"},
		{"unset key variable", "redirect", cf("d111111abcdef8.cloudfront.net", "{env.CF_UNSET_KEY}"), "CF_UNSET_KEY is unset or empty"},
		{"not a key", "redirect", cf("d111111abcdef8.cloudfront.net", "{env.SEG_KEY}"), "private_key is not PEM"},
		{"1024-bit key", "redirect", cf("d111111abcdef8.cloudfront.net", "{file."+weakFile+"}"), "1024-bit RSA key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".Caddyfile")
			if err := os.WriteFile(cfg, []byte(site(tc.delivery, tc.cdn)), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "validate", "--config", cfg, "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir+"/config", "XDG_DATA_HOME="+dir+"/data",
				"SEG_KEY="+s3Key, "S3_ENDPOINT="+srv.Endpoint, "S3_ACCESS_KEY="+srv.AccessKey, "S3_SECRET_KEY="+srv.SecretKey)
			out, err := cmd.CombinedOutput()
			if tc.want == "" {
				if err != nil || !bytes.Contains(out, []byte("Valid configuration")) {
					t.Fatalf("caddy validate: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !bytes.Contains(out, []byte(tc.want)) {
				t.Fatalf("caddy validate: %v, want an error saying %q:\n%s", err, tc.want, out)
			}
			if bytes.Contains(out, []byte(strings.Split(keyPEM, "\n")[1])) {
				t.Fatal("the output shows the key")
			}
		})
	}
}

var caddyRegion = regexp.MustCompile(`(?m)^(\s*region)\s+\S+\s*$`)
