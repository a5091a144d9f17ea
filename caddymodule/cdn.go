package caddymodule

import (
	"errors"
	"fmt"
	"github.com/syncular/caddy-syncular/store/s3"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/presign"
)

// CDNConfig sends redirect delivery to a CDN in front of the bucket
// instead of a presigned bucket URL. Exactly one provider is set.
type CDNConfig struct {
	// Signed URLs (canned policy) of a CloudFront distribution whose origin
	// is the store's bucket.
	CloudFront *CloudFrontConfig `json:"cloudfront,omitempty"`
}

// CloudFrontConfig configures CloudFront signed URLs: a granted request
// is answered 302 to
// https://<domain><origin_path>/<object key>?Expires=…&Signature=…&Key-Pair-Id=…,
// Expires at most presign_ttl away and strictly before the grant ends.
// Every field may hold {env.*} or {file.*} placeholders, expanded once
// when the config loads.
type CloudFrontConfig struct {
	// Domain of the distribution, e.g. "d111111abcdef8.cloudfront.net" or
	// an alternate domain name: a host name only, no scheme, port or path.
	// Required.
	Domain string `json:"domain,omitempty"`

	// Id of the public key in the distribution's trusted key group, e.g.
	// "K2JCJMDEHXQW5F". Required.
	KeyPairID string `json:"key_pair_id,omitempty"`

	// PEM of the private key of that public key: RSA 2048 (PKCS #1 or
	// PKCS #8) or ECDSA P-256 (SEC 1 or PKCS #8), unencrypted. Must be a
	// {file./path} or {env.NAME} placeholder, never the PEM itself.
	// Errors name this setting, never its value. Required.
	PrivateKey string `json:"private_key,omitempty"`

	// Path put before the object key in the URL, e.g. "/segments"
	// (starts with "/", no trailing "/"), when the distribution reaches
	// the bucket under a path of its own. Default: none, the URL path is
	// the object key.
	OriginPath string `json:"origin_path,omitempty"`
}

// checkCDN is the I/O-free check of the cdn block: a provider, redirect
// delivery, an s3 store, and the required fields present.
func (h *Handler) checkCDN() error {
	if h.CDN == nil {
		return nil
	}
	c := h.CDN.CloudFront
	if c == nil {
		return errors.New("cdn needs a provider (cloudfront)")
	}
	if h.Store == nil || h.Store.Backend != backendS3 {
		return errors.New("cdn needs an s3 store (the distribution's origin is its bucket)")
	}
	if h.Delivery != DeliveryRedirect {
		return fmt.Errorf("cdn applies to delivery redirect only (delivery is %s)", h.Delivery)
	}
	for _, f := range []struct{ v, name string }{
		{c.Domain, "domain"}, {c.KeyPairID, "key_pair_id"}, {c.PrivateKey, "private_key"},
	} {
		if f.v == "" {
			return fmt.Errorf("cdn cloudfront: %s is required", f.name)
		}
	}
	if !isPlaceholder(c.PrivateKey) {
		return errors.New("cdn cloudfront: write private_key as {file./path/to/key.pem} or {env.NAME}, never the key itself")
	}
	return nil
}

// isPlaceholder: s is one {env.*} or {file.*} placeholder.
func isPlaceholder(s string) bool {
	if !strings.HasSuffix(s, "}") || strings.Count(s, "{") != 1 {
		return false
	}
	return strings.HasPrefix(s, "{env.") || strings.HasPrefix(s, "{file.")
}

// provisionCDN expands the cdn block and builds the signer on the S3
// store's object layout. Run after provisionS3 built the store.
func (h *Handler) provisionCDN(repl *caddy.Replacer, s *s3.Store) error {
	c := h.CDN.CloudFront
	keyPEM, err := expandSecret(repl, c.PrivateKey, "cdn cloudfront private_key")
	if err != nil {
		return err
	}
	if keyPEM == "" {
		return errors.New("cdn cloudfront private_key is empty (check the file or environment variable it names)")
	}
	opts := presign.CloudFrontOptions{
		Domain:        repl.ReplaceKnown(c.Domain, ""),
		KeyPairID:     repl.ReplaceKnown(c.KeyPairID, ""),
		OriginPath:    repl.ReplaceKnown(c.OriginPath, ""),
		PrivateKeyPEM: []byte(keyPEM),
		TTL:           time.Duration(h.PresignTTL),
	}
	signer, err := presign.NewCloudFrontSigner(s.ObjectKey, opts)
	if err != nil {
		return fmt.Errorf("cdn cloudfront: %s", strings.TrimPrefix(err.Error(), "presign: cloudfront: "))
	}
	h.cdn = signer
	h.logger.Info("redirects go to CloudFront signed URLs",
		zap.String("domain", opts.Domain), zap.String("key_pair_id", opts.KeyPairID),
		zap.String("key_type", signer.KeyType()), zap.Duration("ttl", signer.TTL()), zap.Duration("window", signer.Window()))
	return nil
}
