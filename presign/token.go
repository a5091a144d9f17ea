// Package presign signs and verifies Syncular native segment tokens (the
// `st` query parameter of a signed segment URL, PROTOCOL.md §3), derives
// partition audiences and computes scope digests.
//
// Verification reproduces the reference verifySegmentToken
// (packages/server/src/signed-url.ts) bit for bit, including the
// permissive parts a strict reimplementation would get wrong: atob-style
// base64 decoding, a MAC over the received payload bytes, a non-fatal
// UTF-8 decode and JSON.parse semantics. The cross-implementation vectors
// in shared/vectors/tokens.json pin every one of those behaviours.
//
// The package knows nothing about Caddy or HTTP; every rejection is an
// *Error, which the caller maps to 403 sync.forbidden.
package presign

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"hash"
	"strings"
	"time"
)

// Rejection reasons, exactly as the reference verifier words them after
// "segment token rejected: ". They are listed in check order; the first
// failing check decides the reason.
const (
	ReasonMalformed   = "malformed token"
	ReasonBadMAC      = "bad MAC"
	ReasonUnparseable = "unparseable claims"
	ReasonVersion     = "unsupported token version"
	ReasonExpired     = "token expired"
	ReasonSegment     = "segment mismatch"
	ReasonScope       = "scope-digest mismatch"
	ReasonAudience    = "audience mismatch"
)

// Error is a token rejection. Every rejection maps to HTTP 403
// sync.forbidden; Reason is one of the Reason* constants.
type Error struct{ Reason string }

// Error returns the reference message, "segment token rejected: <reason>".
func (e *Error) Error() string { return "segment token rejected: " + e.Reason }

const (
	// DefaultMaxTokenLen caps the token length (in bytes) that is looked
	// at at all; longer tokens are rejected as malformed before any
	// decoding or crypto. Tokens the reference signer issues are a few
	// hundred bytes long.
	DefaultMaxTokenLen = 4096
	// DefaultSkew is the reference clock-skew allowance: a token is still
	// accepted at exactly exp + 60 s.
	DefaultSkew = 60 * time.Second
	// DefaultTTLSeconds is the reference token lifetime used by IssueURL
	// when no positive TTL is given.
	DefaultTTLSeconds = 900
)

// Claims is the parsed payload of a verified token.
//
// Strings come from JSON.parse semantics: invalid UTF-8 in the payload has
// become U+FFFD, and an unpaired UTF-16 surrogate written as a \u escape
// is kept in its 3-byte generalized UTF-8 (WTF-8) form, so it never
// compares equal to a well-formed string (Go's encoding/json would turn it
// into U+FFFD and could make it equal one).
type Claims struct {
	// Seg, SD and Aud are the "seg", "sd" and "aud" claims. A claim that is
	// missing or not a JSON string never gets this far: Verify rejects it.
	Seg, SD, Aud string
	// Exp is the "exp" claim: unix seconds as a real number (it may be
	// fractional, or +Inf for an overflowing literal such as 1e400).
	Exp float64
	// Raw is the whole parsed payload object, extra members included.
	// Numbers are float64, arrays []any, objects map[string]any.
	Raw map[string]any
}

// Verifier checks tokens against a fixed set of keys. It is immutable
// after construction and safe for concurrent use.
type Verifier struct {
	keys   [][]byte
	macs   []hash.Hash // per key, keyed HMAC state to clone (nil: not clonable)
	skew   time.Duration
	maxLen int
}

// NewVerifier returns a Verifier for keys, raw key bytes in slot order
// (slot 0 is the current key; further slots are older keys still accepted
// during a rotation). The keys are copied. With no keys every token is
// rejected as ReasonBadMAC.
//
// skew is the clock-skew allowance (pass DefaultSkew for the reference
// behaviour; 0 means none). A negative skew is treated as 0: a token is
// never rejected before its own exp. maxLen <= 0 selects
// DefaultMaxTokenLen.
func NewVerifier(keys [][]byte, skew time.Duration, maxLen int) *Verifier {
	v := &Verifier{
		keys:   make([][]byte, len(keys)),
		skew:   max(skew, 0),
		maxLen: maxLen,
	}
	for i, k := range keys {
		v.keys[i] = append([]byte(nil), k...)
	}
	// Keyed HMAC states, computed once: a verification clones one instead
	// of hashing the padded key again. Never written after this.
	v.macs = make([]hash.Hash, len(v.keys))
	for i, k := range v.keys {
		h := hmac.New(sha256.New, k)
		h.Reset()
		if _, ok := h.(hash.Cloner); ok {
			v.macs[i] = h
		}
	}
	if v.maxLen <= 0 {
		v.maxLen = DefaultMaxTokenLen
	}
	return v
}

// Verify runs the reference checks up to and including the segment check:
// length cap, split at the first '.', atob-style base64 decoding of both
// parts, the MAC (against every key, in constant time), a non-fatal UTF-8
// decode with BOM strip, JSON.parse, v === 1, exp, and seg === segmentID.
// The expiry check is the reference's real-number comparison
// exp < nowMs/1000 - skew, with now taken at millisecond resolution like
// Date.now(); nothing is floored to seconds.
//
// Verify does not compare sd and aud: the caller matches them against the
// segment's publications. It does reject a token whose sd or aud is
// missing or not a string (ReasonScope, then ReasonAudience), because such
// a claim can never equal a published digest or audience in the
// reference, while its zero Go value "" could.
//
// On success it returns the claims and the slot of the key that signed
// the token. On failure it returns an *Error; slot is still the matching
// key's index when the MAC verified, and -1 otherwise.
func (v *Verifier) Verify(token, segmentID string, now time.Time) (c *Claims, slot int, err error) {
	c, slot, rej := v.verify(token, segmentID, now)
	if rej == nil {
		if _, ok := c.Raw["sd"].(string); !ok {
			rej = &Error{ReasonScope}
		} else if _, ok := c.Raw["aud"].(string); !ok {
			rej = &Error{ReasonAudience}
		}
	}
	if rej != nil {
		return nil, slot, rej
	}
	return c, slot, nil
}

// VerifyFull is Verify followed by the reference's last two checks,
// sd === scopeDigest and then aud === audience. It reproduces
// verifySegmentToken exactly and is meant for tests and tooling; the edge
// uses Verify and matches publications itself.
func (v *Verifier) VerifyFull(token, segmentID, scopeDigest, audience string, now time.Time) (*Claims, int, error) {
	c, slot, rej := v.verify(token, segmentID, now)
	if rej == nil {
		if sd, ok := c.Raw["sd"].(string); !ok || sd != scopeDigest {
			rej = &Error{ReasonScope}
		} else if aud, ok := c.Raw["aud"].(string); !ok || aud != audience {
			rej = &Error{ReasonAudience}
		}
	}
	if rej != nil {
		return nil, slot, rej
	}
	return c, slot, nil
}

// verify implements the checks shared by Verify and VerifyFull. Its
// *Error result is nil exactly when the token passed.
func (v *Verifier) verify(token, segmentID string, now time.Time) (*Claims, int, *Error) {
	if len(token) > v.maxLen {
		return nil, -1, &Error{ReasonMalformed}
	}
	payloadPart, macPart, found := strings.Cut(token, ".")
	if !found {
		return nil, -1, &Error{ReasonMalformed}
	}
	// The reference lets atob's DOMException escape for undecodable
	// parts; any such exception is a malformed token here.
	payload, err := decodeBase64Loose(payloadPart)
	if err != nil {
		return nil, -1, &Error{ReasonMalformed}
	}
	mac, err := decodeBase64Loose(macPart)
	if err != nil {
		return nil, -1, &Error{ReasonMalformed}
	}
	slot := v.matchKey(payload, mac)
	if slot < 0 {
		return nil, -1, &Error{ReasonBadMAC}
	}

	parsed, ok := parseJSON(strings.TrimPrefix(decodeUTF8Lossy(payload), "\uFEFF"))
	if !ok {
		return nil, slot, &Error{ReasonUnparseable}
	}
	if parsed == nil {
		// JSON null: the reference's claims.v throws a TypeError.
		return nil, slot, &Error{ReasonMalformed}
	}
	// Any other non-object (array, string, number, boolean) has no own
	// "v", so the reference sees undefined !== 1.
	raw, _ := parsed.(map[string]any)
	if ver, ok := raw["v"].(float64); !ok || ver != 1 {
		return nil, slot, &Error{ReasonVersion}
	}
	exp, ok := raw["exp"].(float64)
	if !ok || exp < float64(now.UnixMilli())/1000-v.skew.Seconds() {
		return nil, slot, &Error{ReasonExpired}
	}
	seg, ok := raw["seg"].(string)
	if !ok || seg != segmentID {
		return nil, slot, &Error{ReasonSegment}
	}
	sd, _ := raw["sd"].(string)
	aud, _ := raw["aud"].(string)
	return &Claims{Seg: seg, SD: sd, Aud: aud, Exp: exp, Raw: raw}, slot, nil
}

// matchKey returns the slot of the first key whose HMAC of payload equals
// mac, or -1. Every key is tried and the comparison and slot selection are
// constant time, so the timing does not reveal which slot matched.
func (v *Verifier) matchKey(payload, mac []byte) int {
	slot := -1
	var sum [sha256.Size]byte
	for i, key := range v.keys {
		h := v.mac(i, key)
		h.Write(payload)
		eq := subtle.ConstantTimeCompare(h.Sum(sum[:0]), mac)
		first := subtle.ConstantTimeEq(int32(slot), -1)
		slot = subtle.ConstantTimeSelect(eq&first, i, slot)
	}
	return slot
}

// mac returns a fresh HMAC-SHA256 of key (slot i).
func (v *Verifier) mac(i int, key []byte) hash.Hash {
	if p := v.macs[i]; p != nil {
		if h, err := p.(hash.Cloner).Clone(); err == nil {
			return h
		}
	}
	return hmac.New(sha256.New, key)
}

// decodeBase64Loose decodes s the way the reference does:
// atob(s.replaceAll('-', '+').replaceAll('_', '/')). That is the WHATWG
// forgiving-base64 decode: ASCII whitespace (TAB, LF, FF, CR, SPACE) is
// removed anywhere; when the length is then a multiple of 4, one or two
// trailing '=' are dropped; a length of 1 mod 4, or any character outside
// the standard alphabet (including a remaining '='), is an error; non-zero
// trailing bits in the last character are ignored.
func decodeBase64Loose(s string) ([]byte, error) {
	if base64URLOnly(s) {
		// Only base64url characters (the form every signer emits): the
		// translation is the identity on the URL alphabet, nothing to
		// strip, so the unpadded URL decoder gives the same answer.
		out := make([]byte, base64.RawURLEncoding.DecodedLen(len(s)))
		n, err := base64.RawURLEncoding.Decode(out, []byte(s))
		return out[:n], err
	}
	return decodeBase64Forgiving(s)
}

// decodeBase64Forgiving is decodeBase64Loose without the fast path.
func decodeBase64Forgiving(s string) ([]byte, error) {
	buf := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\t', '\n', '\f', '\r', ' ':
		case '-':
			buf = append(buf, '+')
		case '_':
			buf = append(buf, '/')
		default:
			buf = append(buf, c)
		}
	}
	if len(buf)%4 == 0 {
		for range 2 {
			if n := len(buf); n > 0 && buf[n-1] == '=' {
				buf = buf[:n-1]
			}
		}
	}
	// The unpadded decoder rejects '=', other non-alphabet bytes and a
	// length of 1 mod 4, and (not being Strict) ignores trailing bits.
	out := make([]byte, base64.RawStdEncoding.DecodedLen(len(buf)))
	n, err := base64.RawStdEncoding.Decode(out, buf)
	return out[:n], err
}

// base64URLOnly reports whether s holds only A–Z, a–z, 0–9, '-' and '_'.
func base64URLOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Sign returns the token the reference signSegmentToken produces for the
// claims {v:1, seg, sd, aud, exp}: base64url (unpadded) of the
// JSON.stringify payload, ".", base64url of its HMAC-SHA256 under key.
// exp is unix seconds. Strings that are not valid UTF-8 are signed as the
// JavaScript string they stand for (invalid bytes become U+FFFD).
func Sign(key []byte, seg, sd, aud string, exp int64) string {
	return signPayload(key, claimsJSON(1, seg, sd, aud, float64(exp)))
}

// claimsJSON is JSON.stringify({v, seg, sd, aud, exp}): that member order,
// no whitespace, JS string escaping and JS number formatting. v and exp
// must be finite.
func claimsJSON(v float64, seg, sd, aud string, exp float64) []byte {
	b := make([]byte, 0, 64+len(seg)+len(sd)+len(aud))
	b = append(b, `{"v":`...)
	b = appendJSNumber(b, v)
	b = append(b, `,"seg":`...)
	b = appendJSString(b, seg)
	b = append(b, `,"sd":`...)
	b = appendJSString(b, sd)
	b = append(b, `,"aud":`...)
	b = appendJSString(b, aud)
	b = append(b, `,"exp":`...)
	b = appendJSNumber(b, exp)
	return append(b, '}')
}

// signPayload returns base64url(payload) "." base64url(HMAC-SHA256(key,
// payload)), both unpadded.
func signPayload(key, payload []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write(payload)
	enc := base64.RawURLEncoding
	return enc.EncodeToString(payload) + "." + enc.EncodeToString(h.Sum(nil))
}

// IssueURL mirrors the reference issueSegmentUrl for the native token:
// exp = floor(nowMs/1000) + ttlSeconds, the URL is
// baseURL + "/" + seg + "?st=" + token (plain concatenation: the ':' of the
// segment id is not percent-encoded and a trailing '/' on baseURL is kept,
// giving "//"), and urlExpiresAtMs = exp*1000. ttlSeconds <= 0 selects
// DefaultTTLSeconds.
func IssueURL(key []byte, baseURL, seg, sd, aud string, ttlSeconds int64, nowMs int64) (url string, urlExpiresAtMs int64) {
	if ttlSeconds <= 0 {
		ttlSeconds = DefaultTTLSeconds
	}
	nowSec := nowMs / 1000
	if nowMs%1000 < 0 {
		nowSec-- // Math.floor, not truncation, for times before 1970
	}
	exp := nowSec + ttlSeconds
	return baseURL + "/" + seg + "?st=" + Sign(key, seg, sd, aud, exp), exp * 1000
}

// ParseKey turns a configured secret into HMAC key bytes:
//
//	hex:<hex digits>         the decoded bytes (either case)
//	base64:<base64>          the decoded bytes; standard or URL alphabet,
//	                         padded or not
//	anything else            the UTF-8 bytes of the string itself
//
// An empty key is an error (an unset environment variable is the usual
// cause, and an empty key would let anyone sign). Error messages never
// contain the secret or any part of it.
func ParseKey(s string) ([]byte, error) {
	var key []byte
	switch {
	case strings.HasPrefix(s, "hex:"):
		k, err := hex.DecodeString(s[len("hex:"):])
		if err != nil {
			return nil, errors.New(`presign: key with "hex:" prefix is not valid hex`)
		}
		key = k
	case strings.HasPrefix(s, "base64:"):
		b64 := strings.NewReplacer("-", "+", "_", "/").Replace(s[len("base64:"):])
		enc := base64.RawStdEncoding
		if strings.HasSuffix(b64, "=") {
			enc = base64.StdEncoding
		}
		k, err := enc.Strict().DecodeString(b64)
		if err != nil {
			return nil, errors.New(`presign: key with "base64:" prefix is not valid base64`)
		}
		key = k
	default:
		key = []byte(s)
	}
	if len(key) == 0 {
		return nil, errors.New("presign: key is empty")
	}
	return key, nil
}
