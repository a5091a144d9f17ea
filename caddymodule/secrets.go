package caddymodule

import (
	"bytes"
	"fmt"

	"github.com/caddyserver/caddy/v2"
)

// The secrets a configuration can hold, in one list: the guardrails of
// every secret (written in the config, a key file others can read) run
// over it, and TestSecretSettingsListed walks the module's config structs
// and fails when a field whose name marks a secret is missing here, so a
// new secret setting cannot go without them.

// namedSecret is one configured secret: what names it in messages (never
// its value), raw is the value as written, placeholders unexpanded.
type namedSecret struct {
	what, raw string
}

// secretSetting is one setting of the handler that holds secrets.
type secretSetting struct {
	// path is the setting's JSON path from the handler, dot-separated
	// ("store.s3.secret_access_key").
	path string
	// values are the secrets the setting holds in h; none when unset.
	values func(h *Handler) []namedSecret
}

// secretSettings is every secret-bearing setting of the handler.
var secretSettings = []secretSetting{
	{"keys", func(h *Handler) []namedSecret {
		s := make([]namedSecret, 0, len(h.Keys))
		for i, k := range h.Keys {
			s = append(s, namedSecret{fmt.Sprintf("key %d", i+1), k})
		}
		return s
	}},
	{"audience.key", func(h *Handler) []namedSecret {
		if a := h.Audience; a != nil && a.Key != "" {
			return []namedSecret{{"audience hmac_sha256 key", a.Key}}
		}
		return nil
	}},
	{"tenant_key", func(h *Handler) []namedSecret {
		if h.TenantKey != "" {
			return []namedSecret{{"tenant_key", h.TenantKey}}
		}
		return nil
	}},
	{"store.s3.secret_access_key", func(h *Handler) []namedSecret {
		if s := h.Store; s != nil && s.S3 != nil && s.S3.SecretAccessKey != "" {
			return []namedSecret{{"store s3 secret_access_key", s.S3.SecretAccessKey}}
		}
		return nil
	}},
	{"store.s3.session_token", func(h *Handler) []namedSecret {
		if s := h.Store; s != nil && s.S3 != nil && s.S3.SessionToken != "" {
			return []namedSecret{{"store s3 session_token", s.S3.SessionToken}}
		}
		return nil
	}},
	{"cdn.cloudfront.private_key", func(h *Handler) []namedSecret {
		// Refused unless a placeholder (checkCDN), so only the file
		// check can warn here.
		if c := h.CDN; c != nil && c.CloudFront != nil && c.CloudFront.PrivateKey != "" {
			return []namedSecret{{"cdn cloudfront private_key", c.CloudFront.PrivateKey}}
		}
		return nil
	}},
}

// secretConfigWarnings are the warnings about every configured secret
// (secretWarnings, guardrails.go), in the order of secretSettings.
func (h *Handler) secretConfigWarnings(repl *caddy.Replacer) []string {
	var w []string
	for _, s := range secretSettings {
		for _, v := range s.values(h) {
			w = append(w, secretWarnings(repl, v.what, v.raw)...)
		}
	}
	return w
}

// refuseSharedTenantKey refuses a tenant_key equal to a token key.
// {http.syncular.tenant} is then HMAC(token key, audience), truncated,
// written into access logs and metrics labels: MACs made with a token key
// over text the edge does not choose, and one key serving two purposes,
// so rotating one rotates the other. (An audience key equal to a token
// key is refused for the same reason, refuseSharedAudienceKey.)
func refuseSharedTenantKey(keys [][]byte, tenantKey []byte) error {
	for i, k := range keys {
		if bytes.Equal(k, tenantKey) {
			return fmt.Errorf("tenant_key is the same as key %d: every {http.syncular.tenant} would then be a MAC made with a token key; "+
				"give tenant_key a separate random key (32 random bytes, e.g. `openssl rand -hex 32`, written hex:<64 hex digits>), or remove it "+
				"to derive one from the first key", i+1)
		}
	}
	return nil
}
