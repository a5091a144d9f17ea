package caddymodule

import (
	"errors"
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/syncular/caddy-syncular/token"
)

// AudienceConfig selects how the audience of a partition is derived: the
// value a token's aud claim must equal for the partition of a publication
// to grant it.
type AudienceConfig struct {
	// The rule: "template" (the audience is text with the partition id in
	// it) or "hmac_sha256" (the audience is a keyed hash of the partition
	// id). Required.
	Kind string `json:"kind,omitempty"`

	// For "template": the text, in which "{partition}" is replaced by the
	// partition id with plain string replacement (no other placeholder is
	// expanded). It must contain {partition}. Required with "template".
	Template string `json:"template,omitempty"`

	// For "hmac_sha256": the HMAC key, with the same rules as keys (an
	// {env.*} or {file.*} placeholder expanded once when the config loads;
	// hex:/base64: for raw bytes; at least 16 bytes, not all zero).
	// Required with "hmac_sha256".
	Key string `json:"key,omitempty"`

	// For "hmac_sha256": how the hash is written, "hex" or "base64url".
	// Default: "hex".
	Encoding string `json:"encoding,omitempty"`
}

// buildAuth decodes the keys and the audience rule.
func (h *Handler) buildAuth(repl *caddy.Replacer) error {
	if len(h.Keys) == 0 {
		return errors.New("at least one key is required")
	}
	keys := make([][]byte, 0, len(h.Keys))
	for i, k := range h.Keys {
		kb, err := secret(repl, k, fmt.Sprintf("key %d", i+1), h.weakKeysOK)
		if err != nil {
			return err
		}
		keys = append(keys, kb)
	}
	h.verifier = token.NewVerifier(keys, h.skew, h.MaxTokenLength)
	if err := h.buildObserve(repl, keys[0]); err != nil {
		return err
	}
	if h.TenantKey != "" {
		if err := refuseSharedTenantKey(keys, h.obs.tenantKey); err != nil { // secrets.go
			return err
		}
	}
	aud, err := h.Audience.build(repl, h.weakKeysOK)
	if err != nil {
		return err
	}
	if h.Audience.Kind == "hmac_sha256" {
		// Decoded again (build checked it): compared with the token keys.
		audKey, err := secret(repl, h.Audience.Key, "audience hmac_sha256 key", h.weakKeysOK)
		if err != nil {
			return err
		}
		if err := refuseSharedAudienceKey(keys, audKey); err != nil { // guardrails.go
			return err
		}
	}
	h.audience = aud
	return nil
}

// MinKeyBytes is the least key material a configured HMAC key (token or
// audience) may have.
const MinKeyBytes = 16

// secret expands global placeholders ({env.*}, {file.*}) in a configured
// secret, decodes it and refuses weak key material (unless weakOK, tests
// only). Errors name the setting, never the value.
func secret(repl *caddy.Replacer, raw, what string, weakOK bool) ([]byte, error) {
	v, err := expandSecret(repl, raw, what)
	if err != nil {
		return nil, err
	}
	if v == "" {
		return nil, fmt.Errorf("%s is empty (check the placeholder or environment variable it names)", what)
	}
	b, err := token.ParseKey(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%s is empty", what)
	}
	if weakOK {
		return b, nil
	}
	if err := checkKeyStrength(b); err != nil {
		return nil, fmt.Errorf("%s %w", what, err)
	}
	return b, nil
}

// expandSecret replaces every placeholder of raw, and refuses one that
// does not resolve to a non-empty value: `{env.MISSING}x` would otherwise
// become the key "x". An unknown placeholder is not named (it may be part
// of a literal secret).
func expandSecret(repl *caddy.Replacer, raw, what string) (string, error) {
	var bad error
	v, err := repl.ReplaceFunc(raw, func(name string, val any) (any, error) {
		if caddy.ToString(val) != "" {
			return val, nil
		}
		switch {
		case strings.HasPrefix(name, "env."):
			bad = fmt.Errorf("%s: environment variable %s is unset or empty", what, strings.TrimPrefix(name, "env."))
		case strings.HasPrefix(name, "file."):
			bad = fmt.Errorf("%s: file %s is missing, unreadable or empty", what, strings.TrimPrefix(name, "file."))
		default:
			bad = fmt.Errorf("%s has a placeholder that is not known at provision (only {env.*} and {file.*} are expanded; write a literal brace as \\{)", what)
		}
		return nil, bad
	})
	if bad != nil {
		return "", bad
	}
	if err != nil {
		return "", fmt.Errorf("%s: malformed placeholder", what)
	}
	return v, nil
}

// checkKeyStrength refuses key material an attacker could guess: under
// MinKeyBytes bytes, or all zero bytes (hex:00 is the empty HMAC key in
// disguise: HMAC pads keys with zeros). The error never shows the key.
func checkKeyStrength(b []byte) error {
	const how = "use 32 random bytes, e.g. `openssl rand -hex 32`, written hex:<64 hex digits>"
	if len(b) < MinKeyBytes {
		return fmt.Errorf("is too short: at least %d bytes of key material are required (%s)", MinKeyBytes, how)
	}
	zero := true
	for _, c := range b {
		if c != 0 {
			zero = false
			break
		}
	}
	if zero {
		return fmt.Errorf("is all zero bytes (%s)", how)
	}
	return nil
}

func (a *AudienceConfig) build(repl *caddy.Replacer, weakOK bool) (token.Audience, error) {
	if a == nil {
		return nil, errors.New("an audience rule is required (audience template <text> or audience hmac_sha256 <key>)")
	}
	switch a.Kind {
	case "template":
		if a.Template == "" {
			return nil, errors.New("audience template is empty")
		}
		if !strings.Contains(a.Template, "{partition}") {
			return nil, errors.New("audience template must contain {partition}")
		}
		return token.TemplateAudience(a.Template), nil
	case "hmac_sha256":
		key, err := secret(repl, a.Key, "audience hmac_sha256 key", weakOK)
		if err != nil {
			return nil, err
		}
		aud, err := token.HMACAudience(key, a.Encoding)
		if err != nil {
			return nil, fmt.Errorf("audience hmac_sha256: %w", err)
		}
		return aud, nil
	default:
		return nil, fmt.Errorf("unknown audience kind %q (want template or hmac_sha256)", a.Kind)
	}
}
