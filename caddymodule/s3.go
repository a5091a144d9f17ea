package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store/s3"
)

// S3Config addresses an S3-compatible bucket (AWS S3, Cloudflare R2,
// MinIO, ...) the sync server writes segments to. Every field may hold
// {env.*} or {file.*} placeholders, expanded once when the config loads.
type S3Config struct {
	// Name of the bucket. Required.
	Bucket string `json:"bucket,omitempty"`

	// Region of the bucket, e.g. "us-east-1"; "auto" for R2. Default: the
	// SDK's (the AWS_REGION environment variable or shared config), which
	// must then name one.
	Region string `json:"region,omitempty"`

	// Endpoint URL of an S3-compatible service, e.g.
	// "https://<account>.r2.cloudflarestorage.com". Default: none, the AWS
	// S3 endpoint of the region.
	Endpoint string `json:"endpoint,omitempty"`

	// Key prefix the sync server writes under, e.g. "syncular/". Default:
	// none.
	Prefix string `json:"prefix,omitempty"`

	// Access key id of static credentials. Default: none; omit it and
	// secret_access_key to use the SDK's default credential chain
	// (environment, shared config, instance role).
	AccessKeyID string `json:"access_key_id,omitempty"`

	// Secret access key of static credentials; write it as an {env.*} or
	// {file.*} placeholder, never literally. Errors name this setting,
	// never its value. Default: none (see access_key_id).
	SecretAccessKey string `json:"secret_access_key,omitempty"`

	// Session token of temporary static credentials. Default: none.
	SessionToken string `json:"session_token,omitempty"`

	// Path-style addressing (https://endpoint/bucket/key) instead of
	// virtual-hosted style (https://bucket.endpoint/key). Default: true,
	// the layout the reference sync server uses.
	PathStyle *bool `json:"path_style,omitempty"`
}

// provisionS3 builds the S3 store (no network I/O: credentials from the
// SDK chain are fetched on first use), probes the bucket and, for
// redirect delivery, builds the presigner.
func (h *Handler) provisionS3(ctx caddy.Context, repl *caddy.Replacer) error {
	c := h.Store.S3
	cfg := s3.Options{
		Bucket:    repl.ReplaceKnown(c.Bucket, ""),
		Region:    repl.ReplaceKnown(c.Region, ""),
		Endpoint:  repl.ReplaceKnown(c.Endpoint, ""),
		Prefix:    repl.ReplaceKnown(c.Prefix, ""),
		PathStyle: h.pathStyle,
		Timeout:   time.Duration(h.StoreTimeout),
	}
	// Credentials: expanded once; errors name the setting, never the value.
	for _, f := range []struct {
		raw, what string
		dst       *string
	}{
		{c.AccessKeyID, "access_key_id", &cfg.AccessKeyID},
		{c.SecretAccessKey, "secret_access_key", &cfg.SecretAccessKey},
		{c.SessionToken, "session_token", &cfg.SessionToken},
	} {
		if f.raw == "" {
			continue
		}
		v := repl.ReplaceKnown(f.raw, "")
		if v == "" {
			return fmt.Errorf("store s3 %s is empty (check the placeholder or environment variable it names)", f.what)
		}
		*f.dst = v
	}
	s, err := s3.New(ctx, cfg)
	if err != nil {
		return err
	}
	h.backend = s
	if err := h.checkS3(ctx, s, cfg.Endpoint, cfg.Region); err != nil {
		return err
	}
	if h.Delivery == DeliveryRedirect {
		p, err := presign.NewS3Signer(s.Client(), s.Bucket(), s.ObjectKey, presign.S3Options{TTL: time.Duration(h.PresignTTL)})
		if err != nil {
			return fmt.Errorf("presign: %w", err)
		}
		h.presigner = p
		h.streamLegacy = h.LegacyHeaders == legacyHeadersStream
		if h.CDN != nil {
			return h.provisionCDN(repl, s) // cdn.go
		}
	}
	return nil
}

// checkS3 probes the bucket once at provision (s3.(*Store).Check: one
// ranged GET of a key that is never written, bounded by store_timeout).
// With verify_store_on_start (the default) an unreachable or misconfigured
// bucket fails the config, so `caddy validate` reports it and a reload
// never replaces a working config with a broken one; with
// verify_store_on_start false it is only a warning and the edge starts
// (requests then answer 503 until the bucket is back). The message says
// which failure it was (s3Failure) and names the endpoint dialled, its
// placeholders expanded.
func (h *Handler) checkS3(ctx caddy.Context, s *s3.Store, endpoint, region string) error {
	err := s.Check(ctx)
	if err == nil {
		h.notePrefix(ctx, s) // provisionnotes.go
		return nil
	}
	if endpoint == "" {
		endpoint = "the AWS S3 endpoint of region " + region
		if region == "" {
			endpoint = "the AWS S3 endpoint of the SDK's region"
		}
	}
	what := s3Failure(err)
	if !h.verifyStore {
		h.logger.Warn("s3 store "+what+" at start; serving anyway (verify_store_on_start false)",
			zap.String("bucket", s.Bucket()), zap.String("endpoint", endpoint), zap.Error(err))
		return nil
	}
	return fmt.Errorf("store s3: bucket %q at %s: %s at start (checked with a %v timeout; set verify_store_on_start false to start anyway): %w",
		s.Bucket(), endpoint, what, time.Duration(h.StoreTimeout), err)
}

// s3Failure tells the start-up check's failures apart, so that an
// operator fixes the right thing: no answer at all (network, DNS, TLS:
// "unreachable"), an answer refusing the credentials or their rights, a
// bucket that does not exist, or another answer.
func s3Failure(err error) string {
	var se *s3.Error
	if !errors.As(err, &se) {
		return "check failed"
	}
	switch {
	case se.StatusCode == 0 && se.Reason == "no usable credentials":
		return "no usable credentials (set access_key_id and secret_access_key, or the SDK's environment)"
	case se.StatusCode == 0:
		return "unreachable"
	case se.Code == "NoSuchBucket":
		return "bucket not found (check bucket, endpoint and region)"
	case se.StatusCode == http.StatusForbidden || se.StatusCode == http.StatusUnauthorized || credentialCodes[se.Code]:
		return "credentials refused (the endpoint answered; check access_key_id, secret_access_key and their rights to the bucket)"
	}
	return "answered the check with an error"
}

// credentialCodes are S3 error codes that refuse the request's
// credentials or signature.
var credentialCodes = map[string]bool{
	"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"InvalidToken": true, "ExpiredToken": true, "InvalidSecurity": true, "AuthorizationHeaderMalformed": true,
}
