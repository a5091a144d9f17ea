// Package compress holds the edge's content codings for segment bytes:
// which coding a request accepts (AcceptedValues), how a variant is made
// once per (segment, coding) and checked before it is kept
// (EncodeBounded, Verify, Variant), when a variant is not worth keeping
// (Worthwhile), and the ETags that tell the variants apart (ETag,
// MatchIfNoneMatch). It knows nothing of Caddy or the segment store, so
// it tests without a server.
//
// A variant is an optimisation, never a different answer: decoding it
// yields exactly the identity bytes, whose SHA-256 is the segment id
// (protocol §6). Every variant is verified against that id before it
// may be stored or served.
package compress

import "strings"

// Coding is a content coding the edge can send.
type Coding uint8

// The codings. Identity is the zero value: "no content coding".
const (
	Identity Coding = iota
	Gzip
	Zstd

	numCodings
)

// DefaultPrefs is the order Negotiate uses when prefs is nil: zstd (the
// smaller and faster to decode), then gzip (what the Rust client and
// everything else decodes). It returns a new slice each call.
func DefaultPrefs() []Coding { return []Coding{Zstd, Gzip} }

var defaultPrefs = [...]Coding{Zstd, Gzip}

// String is the coding's HTTP token: "identity", "gzip" or "zstd" (the
// Content-Encoding value, except that identity is sent as no header).
func (c Coding) String() string {
	switch c {
	case Identity:
		return "identity"
	case Gzip:
		return "gzip"
	case Zstd:
		return "zstd"
	}
	return "invalid"
}

// ParseCoding maps an HTTP content-coding token (case-insensitive) to a
// Coding. "x-gzip" is gzip (RFC 9110 §8.4.1.3). ok is false for any other
// token, "*" included.
func ParseCoding(token string) (c Coding, ok bool) {
	switch {
	case equalFold(token, "gzip"), equalFold(token, "x-gzip"):
		return Gzip, true
	case equalFold(token, "zstd"):
		return Zstd, true
	case equalFold(token, "identity"):
		return Identity, true
	}
	return Identity, false
}

func (c Coding) valid() bool { return c < numCodings }

// AcceptedValues is every coding of prefs (nil: DefaultPrefs) that the
// request's Accept-Encoding field lines (r.Header.Values
// ("Accept-Encoding"), read as one comma-joined list without joining
// them) accept, in prefs' order: the first is the answer's coding, the
// others the ones a response may fall back to. nil when none is: the
// answer is then Identity. It reads the field per RFC 9110 §12.5.3 and
// is deliberately conservative: a coding is sent only when the request
// plainly accepts it, since a client that cannot decode the answer
// treats it as a failed download.
//
//   - Codings are matched case-insensitively; "x-gzip" counts as gzip;
//     unknown codings (br, deflate, compress, ...) are ignored. Spaces and
//     tabs around elements, around ";" and empty list elements are allowed.
//   - A coding is acceptable when its weight is above zero: its own q, or
//     else the q of "*" when "*" is listed. Unlisted codings are not
//     acceptable. "gzip;q=0" and "*;q=0" refuse.
//   - The weight must be exactly ";q=" followed by a valid qvalue ("0" to
//     "1" with at most three decimals). An element with any other
//     parameter or a malformed qvalue ("gzip;q=abc", "gzip;q=2",
//     "gzip;level=9") counts as q=0 for that coding: garbage never makes
//     a coding acceptable.
//   - A coding listed more than once gets the lowest of its weights.
//   - Among acceptable codings the first in prefs wins, whatever their
//     relative q: both decode to the same bytes, and the server's order
//     (smaller, cheaper) is the better tie-breaker (RFC 9110 lets the
//     server choose). Identity and unknown values in prefs are skipped.
//   - Otherwise (nil) the answer is Identity: for a missing or empty header, and
//     also when identity itself is refused ("identity;q=0", or "*;q=0"
//     without identity) and no coding in prefs is acceptable. The handler
//     should then send identity anyway rather than 406 (RFC 9110 §12.5.3
//     permits either; every client decodes identity, and a 406 would read
//     as a failed descriptor and a re-pull).
//
// It is a sub-slice of prefs when the accepted codings are adjacent in it
// (always for prefs of at most two codings), so it does not allocate
// then; the caller must not modify it.
func AcceptedValues(values []string, prefs []Coding) []Coding {
	if prefs == nil {
		prefs = defaultPrefs[:]
	}
	var a acceptance
	a.reset()
	for _, v := range values {
		a.parse(v)
	}
	first, last, n := -1, -1, 0
	for i, c := range prefs {
		if c != Identity && c.valid() && a.acceptable(c) {
			if first < 0 {
				first = i
			}
			last = i
			n++
		}
	}
	switch {
	case n == 0:
		return nil
	case last-first+1 == n:
		return prefs[first : last+1 : last+1]
	}
	out := make([]Coding, 0, n)
	for _, c := range prefs[first : last+1] {
		if c != Identity && c.valid() && a.acceptable(c) {
			out = append(out, c)
		}
	}
	return out
}

// qNone marks a coding the header does not mention; weights are in
// thousandths (q=0.5 is 500).
const qNone = -1

type acceptance struct {
	q    [numCodings]int16
	star int16
}

func (a *acceptance) reset() {
	for i := range a.q {
		a.q[i] = qNone
	}
	a.star = qNone
}

func (a *acceptance) parse(s string) {
	for len(s) > 0 {
		elem := s
		if i := strings.IndexByte(s, ','); i >= 0 {
			elem, s = s[:i], s[i+1:]
		} else {
			s = ""
		}
		name, q := elem, int16(1000)
		if i := strings.IndexByte(elem, ';'); i >= 0 {
			name, q = elem[:i], weight(elem[i+1:])
		}
		name = trimOWS(name)
		if name == "" {
			continue // empty list element, or ";q=1" with no coding
		}
		if name == "*" {
			a.star = lower(a.star, q)
			continue
		}
		if c, ok := ParseCoding(name); ok {
			a.q[c] = lower(a.q[c], q)
		}
	}
}

func (a *acceptance) acceptable(c Coding) bool {
	if q := a.q[c]; q != qNone {
		return q > 0
	}
	return a.star > 0
}

func (a *acceptance) choose(prefs []Coding) Coding {
	if prefs == nil {
		prefs = defaultPrefs[:]
	}
	for _, c := range prefs {
		if c != Identity && c.valid() && a.acceptable(c) {
			return c
		}
	}
	return Identity
}

// lower combines two mentions of one coding: the lower weight wins.
func lower(old, q int16) int16 {
	if old == qNone || q < old {
		return q
	}
	return old
}

// weight reads the parameters after a coding's first ";": exactly
// `OWS "q=" qvalue OWS` is that qvalue; anything else is 0.
func weight(params string) int16 {
	p := trimOWS(params)
	if len(p) < 2 || (p[0] != 'q' && p[0] != 'Q') || p[1] != '=' {
		return 0
	}
	q, ok := parseQ(p[2:])
	if !ok {
		return 0
	}
	return q
}

// parseQ parses an RFC 9110 §12.4.2 qvalue into thousandths:
// "0" [ "." 0*3DIGIT ] / "1" [ "." 0*3("0") ].
func parseQ(s string) (int16, bool) {
	if len(s) == 0 || len(s) > 5 || (s[0] != '0' && s[0] != '1') {
		return 0, false
	}
	q := int16(s[0]-'0') * 1000
	if len(s) == 1 {
		return q, true
	}
	if s[1] != '.' {
		return 0, false
	}
	scale := int16(100)
	for i := 2; i < len(s); i++ {
		d := s[i]
		if d < '0' || d > '9' || (s[0] == '1' && d != '0') {
			return 0, false
		}
		q += int16(d-'0') * scale
		scale /= 10
	}
	return q, true
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// equalFold compares s with a lowercase ASCII token, ignoring ASCII case
// only (strings.EqualFold would also fold "ſ" to "s" and "K" to "k").
func equalFold(s, lowerToken string) bool {
	if len(s) != len(lowerToken) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lowerToken[i] {
			return false
		}
	}
	return true
}
