package presign

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/cloudfront/sign"

	"github.com/syncular/caddy-syncular/segid"
)

// ErrCloudFrontGrantEnded is returned for a notAfter that is not after
// now. It wraps ErrGrantEnded.
var ErrCloudFrontGrantEnded = fmt.Errorf("presign: cloudfront: %w", ErrGrantEnded)

// ErrCloudFrontGrantTooShort is returned when no whole-second Expires is
// both after now and before the grant's end: the caller serves the bytes
// itself. It wraps ErrGrantTooShort.
var ErrCloudFrontGrantTooShort = fmt.Errorf("presign: cloudfront: %w", ErrGrantTooShort)

// MinCloudFrontRSABits is the smallest RSA key accepted (CloudFront's key
// groups take RSA 2048-bit keys).
const MinCloudFrontRSABits = 2048

// CloudFrontOptions configures a CloudFrontSigner.
type CloudFrontOptions struct {
	// Domain of the distribution (d111111abcdef8.cloudfront.net or an
	// alternate domain name): a host name only, no scheme, port or path.
	Domain string
	// OriginPath is put before the object key in the URL's path: empty, or
	// "/" and segments of unreserved characters, without a trailing "/".
	OriginPath string
	// KeyPairID is the id of the public key in the distribution's trusted
	// key group (the Key-Pair-Id parameter).
	KeyPairID string
	// PrivateKeyPEM is the PEM of the matching private key: RSA (PKCS #1
	// or PKCS #8, at least 2048 bits) or ECDSA P-256 (SEC 1 or PKCS #8).
	// Encrypted PEM is refused.
	PrivateKeyPEM []byte
	// TTL, Window and MaxEntries are as in S3Options (the same
	// defaults and limits).
	TTL        time.Duration
	Window     time.Duration
	MaxEntries int
}

// CloudFrontSigner hands out CloudFront signed URLs (canned policy) of
// segment objects, signed with aws-sdk-go-v2's feature/cloudfront/sign:
//
//	https://<domain><origin path>/<object key>?Expires=<unix s>&Signature=…&Key-Pair-Id=…
//
// on the signing windows of the S3 presigner (windowCache): every request
// for a segment within a window gets the identical URL, and so does every
// edge with the same configuration, since the URL depends only on the
// configuration, the segment and the window (RSA PKCS #1 v1.5 signatures
// are deterministic; ECDSA ones are made so with RFC 6979). Expires is the
// window's start plus the TTL, or the last whole second before the grant
// ends when that is sooner. It is safe for concurrent use.
type CloudFrontSigner struct {
	base      string // https://<domain><origin path>/
	objectKey func(segid.ID) string
	signer    *sign.URLSigner
	cache     *windowCache
	keyType   string
}

// NewCloudFrontSigner checks opts and builds a signer; objectKey maps a
// segment id to its object key (the store's layout), which must need no
// escaping in a URL path. Errors never quote the key.
func NewCloudFrontSigner(objectKey func(segid.ID) string, opts CloudFrontOptions) (*CloudFrontSigner, error) {
	if objectKey == nil {
		return nil, errors.New("presign: cloudfront: object key layout is required")
	}
	domain, err := cloudFrontDomain(opts.Domain)
	if err != nil {
		return nil, err
	}
	if err := cloudFrontOriginPath(opts.OriginPath); err != nil {
		return nil, err
	}
	if !cloudFrontKeyPairID(opts.KeyPairID) {
		return nil, errors.New("presign: cloudfront: key_pair_id must be the public key's id (letters and digits)")
	}
	key, keyType, err := parseCloudFrontKey(opts.PrivateKeyPEM)
	if err != nil {
		return nil, err
	}
	probe := objectKey(segid.Digest{}.ID())
	if !urlPathSafe(probe) || strings.HasPrefix(probe, "/") || strings.Contains(probe, "//") ||
		strings.HasPrefix(probe, "./") || strings.HasPrefix(probe, "../") || strings.Contains(probe, "/./") || strings.Contains(probe, "/../") {
		return nil, errors.New("presign: cloudfront: the store's object keys (its prefix) must be letters, digits and - . _ ~ / only, without empty, . or .. segments, to be signed as a URL path")
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	cache, err := newWindowCache("presign: cloudfront", ttl, opts.Window, opts.MaxEntries)
	if err != nil {
		return nil, err
	}
	return &CloudFrontSigner{
		base:      "https://" + domain + opts.OriginPath + "/",
		objectKey: objectKey,
		signer:    sign.NewURLSigner(opts.KeyPairID, deterministicSigner{key}),
		cache:     cache,
		keyType:   keyType,
	}, nil
}

// TTL is the configured longest URL life.
func (p *CloudFrontSigner) TTL() time.Duration { return time.Duration(p.cache.ttl) * time.Second }

// Window is the configured signing window.
func (p *CloudFrontSigner) Window() time.Duration { return time.Duration(p.cache.window) * time.Second }

// KeyType is "rsa" or "ecdsa-p256".
func (p *CloudFrontSigner) KeyType() string { return p.keyType }

// Len is the number of cached URLs.
func (p *CloudFrontSigner) Len() int { return p.cache.len() }

// URL returns the signed URL of id's object for a request at now,
// with Expires strictly before notAfter and no later than now+TTL (the
// rule of windowCache). notAfter not after now is ErrCloudFrontGrantEnded;
// a grant too close to its end is ErrCloudFrontGrantTooShort. expires is
// the URL's Expires.
func (p *CloudFrontSigner) URL(id segid.ID, now, notAfter time.Time) (url string, expires time.Time, err error) {
	if id.IsZero() {
		return "", time.Time{}, errors.New("presign: cloudfront: the zero segment id")
	}
	u, exp, err := p.cache.get(id.String(), now, notAfter, func(k windowKey) (string, int64, error) {
		at := k.start + k.expires
		u, err := p.signer.Sign(p.base+p.objectKey(id), time.Unix(at, 0))
		if err != nil {
			// The SDK's errors name the URL (no secret) or the key type.
			return "", 0, errors.New("presign: cloudfront: " + err.Error())
		}
		return u, at * 1e9, nil
	})
	switch err {
	case nil:
		return u, exp, nil
	case ErrGrantEnded:
		return "", time.Time{}, ErrCloudFrontGrantEnded
	case ErrGrantTooShort:
		return "", time.Time{}, ErrCloudFrontGrantTooShort
	}
	return "", time.Time{}, err
}

// CachedURL is URL answered from the cache only: ok is false when the URL
// for this request is not cached yet (call URL then).
func (p *CloudFrontSigner) CachedURL(id segid.ID, now, notAfter time.Time) (url string, expires time.Time, ok bool) {
	if id.IsZero() {
		return "", time.Time{}, false
	}
	return p.cache.getCached(id.String(), now, notAfter)
}

// deterministicSigner hands the SDK's signer a key that signs without the
// random source it is given: RSA PKCS #1 v1.5 needs none, and ECDSA then
// signs deterministically (RFC 6979), so every edge with the same key
// produces the same URL for the same segment and window.
type deterministicSigner struct{ crypto.Signer }

func (s deterministicSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.Signer.Sign(nil, digest, opts)
}

// parseCloudFrontKey parses the PEM of a CloudFront signing key: RSA of
// at least MinCloudFrontRSABits (PKCS #1 "RSA PRIVATE KEY" or PKCS #8
// "PRIVATE KEY") or ECDSA P-256 (SEC 1 "EC PRIVATE KEY" or PKCS #8), the
// two key types a CloudFront key group takes. keyType is "rsa" or
// "ecdsa-p256". Errors describe the key, never quote it.
func parseCloudFrontKey(pemBytes []byte) (key crypto.Signer, keyType string, err error) {
	block, rest := pem.Decode(pemBytes)
	if block == nil {
		return nil, "", errors.New("presign: cloudfront: private_key is not PEM")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, "", errors.New("presign: cloudfront: private_key holds more than one PEM block")
	}
	if _, encrypted := block.Headers["DEK-Info"]; encrypted || block.Type == "ENCRYPTED PRIVATE KEY" {
		return nil, "", errors.New("presign: cloudfront: private_key is encrypted; give the decrypted key (from a file only the server reads)")
	}
	var parsed any
	switch block.Type {
	case "RSA PRIVATE KEY":
		parsed, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		parsed, err = x509.ParseECPrivateKey(block.Bytes)
	case "PRIVATE KEY":
		parsed, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "PUBLIC KEY", "RSA PUBLIC KEY", "CERTIFICATE":
		return nil, "", fmt.Errorf("presign: cloudfront: private_key is a %s, not a private key (the public key goes to CloudFront, the private key here)", strings.ToLower(block.Type))
	default:
		return nil, "", fmt.Errorf("presign: cloudfront: private_key: unsupported PEM block %q (want RSA PRIVATE KEY, EC PRIVATE KEY or PRIVATE KEY)", block.Type)
	}
	if err != nil {
		return nil, "", errors.New("presign: cloudfront: private_key does not parse as a " + strings.ToLower(block.Type))
	}
	switch k := parsed.(type) {
	case *rsa.PrivateKey:
		if k.N.BitLen() < MinCloudFrontRSABits {
			return nil, "", fmt.Errorf("presign: cloudfront: private_key is a %d-bit RSA key; CloudFront needs %d bits", k.N.BitLen(), MinCloudFrontRSABits)
		}
		return k, "rsa", nil
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, "", fmt.Errorf("presign: cloudfront: private_key is an ECDSA %s key; CloudFront takes P-256 only", k.Curve.Params().Name)
		}
		return k, "ecdsa-p256", nil
	default:
		return nil, "", fmt.Errorf("presign: cloudfront: private_key is a %T; CloudFront takes RSA 2048 or ECDSA P-256 keys", parsed)
	}
}

// cloudFrontDomain checks a host name (no scheme, port, path, user info)
// and returns it in lower case.
func cloudFrontDomain(d string) (string, error) {
	if d == "" {
		return "", errors.New("presign: cloudfront: domain is required")
	}
	if strings.Contains(d, "://") {
		return "", fmt.Errorf("presign: cloudfront: domain %q must be a host name without a scheme", d)
	}
	if strings.ContainsAny(d, "/?#") {
		return "", fmt.Errorf("presign: cloudfront: domain %q must be a host name without a path (origin_path sets one)", d)
	}
	if len(d) > 253 {
		return "", errors.New("presign: cloudfront: domain is longer than 253 characters")
	}
	d = strings.ToLower(strings.TrimSuffix(d, "."))
	for _, label := range strings.Split(d, ".") {
		ok := len(label) > 0 && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for i := 0; ok && i < len(label); i++ {
			c := label[i]
			ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
		}
		if !ok {
			return "", fmt.Errorf("presign: cloudfront: domain %q is not a host name (letters, digits, hyphens and dots; no port)", d)
		}
	}
	return d, nil
}

// cloudFrontOriginPath checks origin_path: empty, or "/seg[/seg...]" of
// unreserved characters, no "." or ".." segment, no trailing "/".
func cloudFrontOriginPath(p string) error {
	if p == "" {
		return nil
	}
	bad := errors.New(`presign: cloudfront: origin_path must start with "/", not end with "/", and hold only letters, digits and - . _ ~ between the slashes (e.g. /segments)`)
	if p[0] != '/' {
		return bad
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." || !urlPathSafe(seg) {
			return bad
		}
	}
	return nil
}

// cloudFrontKeyPairID: CloudFront public key ids (K2JCJMDEHXQW5F) and
// legacy key pair ids (APKA…) are upper-case letters and digits.
func cloudFrontKeyPairID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// urlPathSafe: only unreserved characters (RFC 3986) and "/", so the
// string is its own escaped form and CloudFront compares the signed
// resource with exactly what the client sends.
func urlPathSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
			return false
		}
	}
	return true
}
