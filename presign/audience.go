package presign

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Audience derives the opaque audience string a token carries from a
// partition id (PROTOCOL.md §3). The host chooses the function; the edge
// must be configured with the same one. Implementations are safe for
// concurrent use.
type Audience interface {
	Derive(partition string) string
}

// TemplateAudience returns the audience rule that replaces every
// "{partition}" in tmpl with the partition id, e.g. "aud:{partition}" (the
// reference conformance harness). Nothing else in tmpl is interpreted: it
// is not a Caddy placeholder and must not pass through a replacer.
func TemplateAudience(tmpl string) Audience { return templateAudience(tmpl) }

type templateAudience string

func (t templateAudience) Derive(partition string) string {
	return strings.ReplaceAll(string(t), "{partition}", partition)
}

// HMACAudience returns the keyed audience rule
// HMAC-SHA256(key, UTF-8 partition id), rendered per encoding: "hex"
// (lowercase; also the default for "") or "base64url" (unpadded). Any
// other encoding, or an empty key, is an error. The key is copied.
func HMACAudience(key []byte, encoding string) (Audience, error) {
	if len(key) == 0 {
		return nil, errors.New("presign: audience key is empty")
	}
	a := hmacAudience{key: append([]byte(nil), key...)}
	switch encoding {
	case "", "hex":
		a.encode = hex.EncodeToString
	case "base64url":
		a.encode = base64.RawURLEncoding.EncodeToString
	default:
		return nil, fmt.Errorf("presign: unknown audience encoding %q (want hex or base64url)", encoding)
	}
	return a, nil
}

type hmacAudience struct {
	key    []byte
	encode func([]byte) string
}

func (a hmacAudience) Derive(partition string) string {
	h := hmac.New(sha256.New, a.key)
	h.Write([]byte(partition))
	return a.encode(h.Sum(nil))
}
