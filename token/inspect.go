package token

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Verdicts of an inspection.
const (
	VerdictAccept    = "accept"    // the edge would accept the token (for the checks it was given)
	VerdictRefuse    = "refuse"    // the edge would refuse it: Reason says why
	VerdictUnchecked = "unchecked" // no key given: the MAC, and so the verdict, is unknown
)

// InspectOptions is what Inspect checks a token against. Every field is
// optional: what is not given is not checked (and the report says so).
type InspectOptions struct {
	// Keys verify the MAC, in slot order like the edge's configured keys
	// (slot 0 first). None: the claims are decoded but the MAC is not
	// checked and the verdict is VerdictUnchecked.
	Keys [][]byte
	// SegmentID is the segment the token is presented for (the last
	// element of the URL's path). "": the token's own seg claim.
	SegmentID string
	// ScopeDigest and Audience are the publication's digest and the
	// audience derived from its partition. "": not compared (the edge
	// compares them against the publications in its store).
	ScopeDigest, Audience string
	// Now is the time of the check. Zero: time.Now().
	Now time.Time
	// Skew is the clock-skew allowance on exp (the edge's skew setting;
	// pass DefaultSkew for the default). Negative counts as 0.
	Skew time.Duration
	// MaxLen is the edge's max_token_length. <= 0: DefaultMaxTokenLen.
	MaxLen int
}

// Report is the result of Inspect. It never contains a key; it does
// contain the token's claims (including aud), which is the point.
type Report struct {
	// Verdict is VerdictAccept, VerdictRefuse or VerdictUnchecked.
	Verdict string
	// Reason is the edge's rejection reason (a Reason* constant) when
	// Verdict is VerdictRefuse. With VerdictUnchecked it is the first
	// check that would fail even with a valid MAC ("" if none).
	Reason string
	// Detail explains Reason in words: by how much a token expired,
	// which values differ.
	Detail string
	// Slot is the 0-based index of the key whose MAC matched, -1 if none
	// matched or no key was given. The MAC can match even when a later
	// check refuses the token.
	Slot int
	// MACChecked is true when keys were given.
	MACChecked bool

	// Decoded is true when the payload part decoded (base64) and parsed
	// as a JSON object; Payload is its text and Claims the parsed object.
	Decoded bool
	Payload string
	Claims  map[string]any
	// Seg, SD, Aud are the string claims ("" when missing or not a
	// string); Exp is the exp claim when it is a number (HasExp).
	Seg, SD, Aud string
	Exp          float64
	HasExp       bool
	// AcceptedUntil is exp + skew: the last instant the edge accepts the
	// token. Remaining is AcceptedUntil - Now (negative: expired).
	AcceptedUntil time.Time
	Remaining     time.Duration

	// What was checked (copies of the options that were given).
	SegmentID, ScopeDigest, Audience string
	Now                              time.Time
	Skew                             time.Duration

	keysTried int
}

// Inspect decodes a token and says whether the edge would accept it under
// opts, and if not, why: the reason is the one Verify/VerifyFull give
// (the first failing check, in the reference order), with the detail an
// operator needs (expired by how much, which claim differs). Without keys
// it decodes the claims and reports the MAC as unchecked.
func Inspect(token string, opts InspectOptions) *Report {
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	opts.Skew = max(opts.Skew, 0)
	r := &Report{
		Slot: -1, MACChecked: len(opts.Keys) > 0,
		SegmentID: opts.SegmentID, ScopeDigest: opts.ScopeDigest, Audience: opts.Audience,
		Now: opts.Now, Skew: opts.Skew, keysTried: len(opts.Keys),
	}
	r.decode(token)
	seg := opts.SegmentID
	if seg == "" {
		seg = r.Seg
	}

	if r.MACChecked {
		v := NewVerifier(opts.Keys, opts.Skew, opts.MaxLen)
		var err error
		if opts.ScopeDigest != "" && opts.Audience != "" {
			_, r.Slot, err = v.VerifyFull(token, seg, opts.ScopeDigest, opts.Audience, opts.Now)
		} else {
			var c *Claims
			c, r.Slot, err = v.Verify(token, seg, opts.Now)
			if err == nil {
				err = compareOptional(c.SD, c.Aud, opts)
			}
		}
		r.Verdict = VerdictAccept
		var e *Error
		if errors.As(err, &e) {
			r.Verdict, r.Reason = VerdictRefuse, e.Reason
		}
	} else {
		r.Verdict = VerdictUnchecked
		r.Reason = r.claimReason(token, seg, opts)
	}
	r.Detail = r.explain(seg)
	return r
}

// compareOptional is VerifyFull's last two checks for the values given.
func compareOptional(sd, aud string, opts InspectOptions) error {
	if opts.ScopeDigest != "" && sd != opts.ScopeDigest {
		return &Error{ReasonScope}
	}
	if opts.Audience != "" && aud != opts.Audience {
		return &Error{ReasonAudience}
	}
	return nil
}

// decode fills the claim fields, as far as the token decodes.
func (r *Report) decode(token string) {
	payloadPart, _, found := strings.Cut(token, ".")
	if !found {
		return
	}
	payload, err := decodeBase64Loose(payloadPart)
	if err != nil {
		return
	}
	r.Payload = strings.TrimPrefix(decodeUTF8Lossy(payload), "\uFEFF")
	parsed, ok := parseJSON(r.Payload)
	if !ok {
		return
	}
	raw, ok := parsed.(map[string]any)
	if !ok {
		return
	}
	r.Decoded, r.Claims = true, raw
	r.Seg, _ = raw["seg"].(string)
	r.SD, _ = raw["sd"].(string)
	r.Aud, _ = raw["aud"].(string)
	if exp, ok := raw["exp"].(float64); ok {
		r.Exp, r.HasExp = exp, true
		r.AcceptedUntil = expTime(exp + r.Skew.Seconds())
		r.Remaining = r.AcceptedUntil.Sub(r.Now)
	}
}

// claimReason runs the checks after the MAC on the decoded claims (no key
// given): the reason the edge would give even if the MAC were valid.
func (r *Report) claimReason(token, seg string, opts InspectOptions) string {
	maxLen := opts.MaxLen
	if maxLen <= 0 {
		maxLen = DefaultMaxTokenLen
	}
	p, m, found := strings.Cut(token, ".")
	if len(token) > maxLen || !found {
		return ReasonMalformed
	}
	if _, err := decodeBase64Loose(p); err != nil {
		return ReasonMalformed
	}
	if _, err := decodeBase64Loose(m); err != nil {
		return ReasonMalformed
	}
	parsed, ok := parseJSON(r.Payload)
	switch {
	case !ok:
		return ReasonUnparseable
	case parsed == nil:
		return ReasonMalformed
	}
	if ver, ok := r.Claims["v"].(float64); !ok || ver != 1 {
		return ReasonVersion
	}
	if !r.HasExp || r.Exp < float64(opts.Now.UnixMilli())/1000-r.Skew.Seconds() {
		return ReasonExpired
	}
	if s, ok := r.Claims["seg"].(string); !ok || s != seg {
		return ReasonSegment
	}
	if _, ok := r.Claims["sd"].(string); !ok {
		return ReasonScope
	}
	if _, ok := r.Claims["aud"].(string); !ok {
		return ReasonAudience
	}
	if err := compareOptional(r.SD, r.Aud, opts); err != nil {
		return err.(*Error).Reason
	}
	return ""
}

// explain words the reason.
func (r *Report) explain(seg string) string {
	switch r.Reason {
	case "":
		if r.Verdict == VerdictAccept {
			return fmt.Sprintf("valid for %s more: exp %s + skew %s", roundDur(r.Remaining), fmtExp(r.Exp), r.Skew)
		}
		return ""
	case ReasonMalformed:
		return "the token is not <base64url payload>.<base64url mac> (or is longer than max_token_length, or its payload is JSON null)"
	case ReasonBadMAC:
		return fmt.Sprintf("no given key (%d tried) signed this payload: the signer uses a key the edge does not list", r.keysTried)
	case ReasonUnparseable:
		return "the payload is not JSON"
	case ReasonVersion:
		return fmt.Sprintf("claim v is %s, want 1", fmtClaim(r.Claims["v"]))
	case ReasonExpired:
		if !r.HasExp {
			return fmt.Sprintf("claim exp is %s, want a number (unix seconds)", fmtClaim(r.Claims["exp"]))
		}
		return fmt.Sprintf("expired %s ago: exp %s + skew %s = %s is before now %s",
			roundDur(-r.Remaining), fmtExp(r.Exp), r.Skew, r.AcceptedUntil.UTC().Format(time.RFC3339Nano), r.Now.UTC().Format(time.RFC3339Nano))
	case ReasonSegment:
		return fmt.Sprintf("the token is for segment %s, the URL asks for %s", fmtClaim(r.Claims["seg"]), escField(seg))
	case ReasonScope:
		if r.ScopeDigest == "" {
			return fmt.Sprintf("claim sd is %s, want a string", fmtClaim(r.Claims["sd"]))
		}
		return fmt.Sprintf("claim sd %s differs from the scope digest %q", fmtClaim(r.Claims["sd"]), r.ScopeDigest)
	case ReasonAudience:
		if r.Audience == "" {
			return fmt.Sprintf("claim aud is %s, want a string", fmtClaim(r.Claims["aud"]))
		}
		return fmt.Sprintf("claim aud %s differs from the audience %q", fmtClaim(r.Claims["aud"]), r.Audience)
	}
	return ""
}

// String renders the report for people, one fact per line. Every string
// from the token or the URL is escaped for the terminal (escape.go):
// the claims as JSON with \u escapes, other values Go-quoted when they
// hold anything but printable text.
func (r *Report) String() string {
	var b strings.Builder
	if r.Decoded {
		fmt.Fprintf(&b, "claims:    %s\n", escJSON(r.Payload))
		if r.HasExp {
			fmt.Fprintf(&b, "exp:       %s (%s); accepted until %s with skew %s\n",
				fmtExp(r.Exp), expTime(r.Exp).UTC().Format(time.RFC3339), r.AcceptedUntil.UTC().Format(time.RFC3339Nano), r.Skew)
		}
	} else {
		b.WriteString("claims:    (payload does not decode to a JSON object)\n")
	}
	fmt.Fprintf(&b, "now:       %s\n", r.Now.UTC().Format(time.RFC3339Nano))
	seg := r.SegmentID
	if seg == "" {
		seg = "(not given: the token's own seg claim)"
	}
	if r.SegmentID != "" {
		seg = escField(seg)
	}
	fmt.Fprintf(&b, "segment:   %s\n", seg)
	for _, c := range []struct{ name, v string }{{"scope:", r.ScopeDigest}, {"audience:", r.Audience}} {
		if c.v == "" {
			fmt.Fprintf(&b, "%-10s (not given: not compared; the edge compares it with the store's publications)\n", c.name)
		} else {
			fmt.Fprintf(&b, "%-10s %s\n", c.name, escField(c.v))
		}
	}
	switch {
	case !r.MACChecked:
		b.WriteString("mac:       unchecked (no --key given)\n")
	case r.Slot >= 0:
		fmt.Fprintf(&b, "mac:       verified by key %d\n", r.Slot+1)
	default:
		b.WriteString("mac:       no key matched\n")
	}
	switch r.Verdict {
	case VerdictAccept:
		fmt.Fprintf(&b, "verdict:   accept, %s\n", r.Detail)
	case VerdictRefuse:
		fmt.Fprintf(&b, "verdict:   refuse: segment token rejected: %s\n", r.Reason)
		fmt.Fprintf(&b, "why:       %s\n", r.Detail)
	default:
		if r.Reason != "" {
			fmt.Fprintf(&b, "verdict:   unchecked (MAC not verified); even with a valid MAC: segment token rejected: %s\n", r.Reason)
			fmt.Fprintf(&b, "why:       %s\n", r.Detail)
		} else {
			b.WriteString("verdict:   unchecked (MAC not verified); the claims pass every other check given\n")
		}
	}
	return b.String()
}

// TokenFromURL accepts a token or a signed segment URL and returns the
// token and, for a URL, the segment id in its last path element
// (percent-decoded). More than one st parameter is an error, as at the
// edge.
func TokenFromURL(s string) (token, segmentID string, err error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "?") && !strings.Contains(s, "/") {
		return s, "", nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", "", fmt.Errorf("not a token or URL: %w", err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return "", "", fmt.Errorf("URL query: %w", err)
	}
	switch sts := q["st"]; len(sts) {
	case 0:
		return "", "", errors.New("URL has no st parameter")
	case 1:
		token = sts[0]
	default:
		return "", "", errors.New("URL has more than one st parameter (the edge refuses it)")
	}
	p := u.EscapedPath()
	if seg, err := url.PathUnescape(p[strings.LastIndexByte(p, '/')+1:]); err == nil {
		segmentID = seg
	}
	return token, segmentID, nil
}

// ParseTime reads an RFC 3339 time or unix milliseconds.
func ParseTime(s string) (time.Time, error) {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q: want RFC 3339 or unix milliseconds", s)
	}
	return t, nil
}

func expTime(sec float64) time.Time {
	if math.IsInf(sec, 0) || math.IsNaN(sec) || math.Abs(sec) > 1e11 {
		if sec < 0 {
			return time.Unix(-1e11, 0)
		}
		return time.Unix(1e11, 0)
	}
	whole := math.Floor(sec)
	return time.Unix(int64(whole), int64((sec-whole)*1e9))
}

func fmtExp(exp float64) string { return strconv.FormatFloat(exp, 'f', -1, 64) }

func fmtClaim(v any) string {
	switch x := v.(type) {
	case nil:
		return "missing or null"
	case string:
		return strconv.Quote(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	default: // an object or array: its keys and strings escaped too
		return escText(fmt.Sprintf("%v (%T)", x, x))
	}
}

func roundDur(d time.Duration) time.Duration {
	if d < time.Second && d > -time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
