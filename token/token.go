// Package token signs and verifies Syncular native segment tokens (the
// `st` query parameter of a signed segment URL, protocol §3), derives
// partition audiences and computes scope digests.
//
// Verification reproduces the reference verifySegmentToken
// (packages/server/src/signed-url.ts) bit for bit, including the
// permissive parts a strict reimplementation would get wrong: atob-style
// base64 decoding, a MAC over the received payload bytes, a non-fatal
// UTF-8 decode and JSON.parse semantics. The cross-implementation vectors
// in testdata/vectors/tokens.json pin every one of those behaviours.
//
// The package knows nothing about Caddy or HTTP; every rejection is an
// *Error, which the caller maps to 403 sync.forbidden.
package token

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"hash"
	"strings"
	"sync"
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

	payload string // the decoded payload text the claims were read from
}

// Verifier checks tokens against a fixed set of keys. Its configuration
// is immutable after construction (only its pool of scratch state
// changes) and it is safe for concurrent use.
type Verifier struct {
	keys    [][]byte
	skew    time.Duration
	maxLen  int
	scratch sync.Pool // *verifyScratch
}

// verifyScratch is the reusable state of one verification: a keyed
// HMAC-SHA256 per key and the buffers the token decodes into. A
// verification takes one from Verifier.scratch and returns it; nothing
// that escapes verify (the claims) points into it.
type verifyScratch struct {
	macs []hash.Hash // macs[i] is keyed with Verifier.keys[i]
	sum  [sha256.Size]byte
	buf  []byte // decoded payload, then decoded MAC
}

// maxScratchBuf bounds the decode buffer a scratch keeps between uses, so
// that a few huge tokens under a raised length cap do not pin memory.
const maxScratchBuf = 8 << 10

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
	if v.maxLen <= 0 {
		v.maxLen = DefaultMaxTokenLen
	}
	v.scratch.New = func() any {
		s := &verifyScratch{macs: make([]hash.Hash, len(v.keys))}
		for i, k := range v.keys {
			s.macs[i] = hmac.New(sha256.New, k)
		}
		return s
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
	var cl Claims
	if slot, err = v.VerifyInto(&cl, token, segmentID, now); err != nil {
		return nil, slot, err
	}
	c = new(Claims) // only for an accepted token
	*c = cl
	return c, slot, nil
}

// VerifyInto is Verify writing the claims of an accepted token to *c
// (left unchanged on a rejection), so a caller that keeps them on its
// stack allocates no Claims.
func (v *Verifier) VerifyInto(c *Claims, token, segmentID string, now time.Time) (slot int, err error) {
	f, payload, slot, rej := v.verify(token, segmentID, now)
	if rej == nil {
		if f.has&hasSD == 0 {
			rej = &Error{ReasonScope}
		} else if f.has&hasAud == 0 {
			rej = &Error{ReasonAudience}
		}
	}
	if rej != nil {
		return slot, rej
	}
	*c = Claims{Seg: f.seg, SD: f.sd, Aud: f.aud, Exp: f.exp, payload: payload}
	return slot, nil
}

// VerifyFull is Verify followed by the reference's last two checks,
// sd === scopeDigest and then aud === audience. It reproduces
// verifySegmentToken exactly and is meant for tests and tooling; the edge
// uses Verify and matches publications itself.
func (v *Verifier) VerifyFull(token, segmentID, scopeDigest, audience string, now time.Time) (*Claims, int, error) {
	f, payload, slot, rej := v.verify(token, segmentID, now)
	if rej == nil {
		if f.has&hasSD == 0 || f.sd != scopeDigest {
			rej = &Error{ReasonScope}
		} else if f.has&hasAud == 0 || f.aud != audience {
			rej = &Error{ReasonAudience}
		}
	}
	if rej != nil {
		return nil, slot, rej
	}
	return &Claims{Seg: f.seg, SD: f.sd, Aud: f.aud, Exp: f.exp, payload: payload}, slot, nil
}

// verify implements the checks shared by Verify and VerifyFull. Its
// *Error result is nil exactly when the token passed; the claims' strings
// alias the returned payload text.
func (v *Verifier) verify(token, segmentID string, now time.Time) (claimFields, string, int, *Error) {
	if len(token) > v.maxLen {
		return claimFields{}, "", -1, &Error{ReasonMalformed}
	}
	payloadPart, macPart, found := strings.Cut(token, ".")
	if !found {
		return claimFields{}, "", -1, &Error{ReasonMalformed}
	}
	text, slot, rej := v.authenticate(payloadPart, macPart)
	if rej != nil {
		return claimFields{}, "", slot, rej
	}

	f, status := decodeClaims(text)
	switch status {
	case claimsUnparseable:
		return claimFields{}, "", slot, &Error{ReasonUnparseable}
	case claimsNull:
		// JSON null: the reference's claims.v throws a TypeError.
		return claimFields{}, "", slot, &Error{ReasonMalformed}
	}
	// Any other non-object (array, string, number, boolean) has no own
	// "v", so the reference sees undefined !== 1.
	if f.has&hasV == 0 || f.v != 1 {
		return claimFields{}, "", slot, &Error{ReasonVersion}
	}
	if f.has&hasExp == 0 || f.exp < float64(now.UnixMilli())/1000-v.skew.Seconds() {
		return claimFields{}, "", slot, &Error{ReasonExpired}
	}
	if f.has&hasSeg == 0 || f.seg != segmentID {
		return claimFields{}, "", slot, &Error{ReasonSegment}
	}
	return f, text, slot, nil
}

// authenticate decodes both parts of a token, checks the MAC and returns
// the payload as text (UTF-8 decoded without BOM), or a rejection. The
// text is a fresh string: nothing of the scratch buffers leaks into it.
func (v *Verifier) authenticate(payloadPart, macPart string) (string, int, *Error) {
	s := v.scratch.Get().(*verifyScratch)
	defer v.scratch.Put(s)
	if need := len(payloadPart) + len(macPart); cap(s.buf) < need {
		s.buf = make([]byte, 0, need)
	}
	// The reference lets atob's DOMException escape for undecodable
	// parts; any such exception is a malformed token here.
	buf, ok := appendBase64Loose(s.buf[:0], payloadPart)
	n := len(buf)
	if ok {
		buf, ok = appendBase64Loose(buf, macPart)
	}
	if cap(buf) <= maxScratchBuf {
		s.buf = buf[:0]
	} else {
		s.buf = nil
	}
	if !ok {
		return "", -1, &Error{ReasonMalformed}
	}
	payload, mac := buf[:n], buf[n:]
	slot := v.matchKey(s, payload, mac)
	if slot < 0 {
		return "", -1, &Error{ReasonBadMAC}
	}
	return strings.TrimPrefix(decodeUTF8Lossy(payload), "\uFEFF"), slot, nil
}

// matchKey returns the slot of the first key whose HMAC of payload equals
// mac, or -1. Every key is tried and the comparison and slot selection are
// constant time, so the timing does not reveal which slot matched.
func (v *Verifier) matchKey(s *verifyScratch, payload, mac []byte) int {
	slot := -1
	for i, h := range s.macs {
		h.Reset()
		h.Write(payload)
		eq := subtle.ConstantTimeCompare(h.Sum(s.sum[:0]), mac)
		first := subtle.ConstantTimeEq(int32(slot), -1)
		slot = subtle.ConstantTimeSelect(eq&first, i, slot)
	}
	return slot
}

// decodeBase64Loose decodes s the way the reference does:
// atob(s.replaceAll('-', '+').replaceAll('_', '/')). See appendBase64Loose.
func decodeBase64Loose(s string) ([]byte, error) {
	b, ok := appendBase64Loose(make([]byte, 0, len(s)*3/4+2), s)
	if !ok {
		return nil, errBase64
	}
	return b, nil
}

var errBase64 = errors.New("token: invalid base64")

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
			return nil, errors.New(`token: key with "hex:" prefix is not valid hex`)
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
			return nil, errors.New(`token: key with "base64:" prefix is not valid base64`)
		}
		key = k
	default:
		key = []byte(s)
	}
	if len(key) == 0 {
		return nil, errors.New("token: key is empty")
	}
	return key, nil
}
