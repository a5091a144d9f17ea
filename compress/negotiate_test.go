package compress

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestNegotiate(t *testing.T) {
	gz := []Coding{Gzip, Zstd}
	cases := []struct {
		header string
		prefs  []Coding
		want   Coding
	}{
		// What the reference clients send (protocol §6).
		{"gzip", nil, Gzip},                    // Rust client: decodes only gzip
		{"gzip, deflate, br, zstd", nil, Zstd}, // browsers, Bun
		{"", nil, Identity},                    // TS client, bare fetch
		{"gzip, deflate", nil, Gzip},           // Node fetch
		{"gzip, deflate, br, zstd", gz, Gzip},  // operator prefers gzip
		{"gzip, deflate, br, zstd", []Coding{Gzip}, Gzip},
		{"zstd", []Coding{Gzip}, Identity}, // zstd not offered by the operator
		{"gzip", []Coding{}, Identity},     // compression turned off
		{"gzip, zstd", []Coding{Identity, Gzip}, Gzip},
		{"gzip, zstd", []Coding{Coding(9), Gzip}, Gzip},

		// Unknown codings are ignored.
		{"br", nil, Identity},
		{"deflate, br, compress", nil, Identity},
		{"identity", nil, Identity},

		// q-values.
		{"gzip;q=0", nil, Identity},
		{"gzip;q=0.0", nil, Identity},
		{"gzip;q=0.000", nil, Identity},
		{"gzip;q=0.001", nil, Gzip},
		{"gzip;q=1", nil, Gzip},
		{"gzip;q=1.000", nil, Gzip},
		{"gzip;q=1.", nil, Gzip},
		{"gzip;q=0.", nil, Identity},
		{"zstd;q=0, gzip", nil, Gzip},
		{"zstd;q=0.1, gzip;q=1", nil, Zstd}, // server order among acceptable
		{"gzip;q=0.5, zstd;q=0.5", gz, Gzip},
		{"gzip;Q=0", nil, Identity},
		{"gzip ; q=0", nil, Identity},
		{"gzip;\tq=0.5", nil, Gzip},
		{"gzip;q=0.5 ", nil, Gzip},

		// Garbage weights refuse the coding they are attached to.
		{"gzip;q=abc", nil, Identity},
		{"gzip;q=2", nil, Identity},
		{"gzip;q=1.5", nil, Identity},
		{"gzip;q=1.001", nil, Identity},
		{"gzip;q=0.0001", nil, Identity},
		{"gzip;q=-1", nil, Identity},
		{"gzip;q=", nil, Identity},
		{"gzip;q", nil, Identity},
		{"gzip;q = 1", nil, Identity},
		{"gzip;level=9", nil, Identity},
		{"gzip;q=1;level=9", nil, Identity},
		{"gzip;", nil, Identity},
		{"gzip;q=abc, zstd", nil, Zstd},
		{"*, gzip;q=abc", gz, Zstd},

		// A coding listed twice gets its lower weight.
		{"gzip, gzip;q=0", nil, Identity},
		{"gzip;q=0, gzip", nil, Identity},
		{"gzip;q=0.2, gzip;q=0.9", nil, Gzip},

		// "*".
		{"*", nil, Zstd},
		{"*", gz, Gzip},
		{"*;q=0", nil, Identity},
		{"*;q=0.5", nil, Zstd},
		{"*, zstd;q=0", nil, Gzip},
		{"*;q=0, gzip", nil, Gzip},
		{"*;q=0, gzip;q=0.1", nil, Gzip},
		{"zstd;q=0, *", nil, Gzip},
		{"*, *;q=0", nil, Identity},

		// identity refused and nothing acceptable: still Identity.
		{"identity;q=0", nil, Identity},
		{"*;q=0", nil, Identity},
		{"identity;q=0, br", nil, Identity},
		{"identity;q=0, gzip", nil, Gzip},
		{"identity;q=0, *", nil, Zstd},

		// Case, whitespace, empty elements, aliases.
		{"GZIP", nil, Gzip},
		{"Gzip, ZSTD", nil, Zstd},
		{"x-gzip", nil, Gzip},
		{"X-GZIP;q=0.3", nil, Gzip},
		{"  gzip  ", nil, Gzip},
		{"\tgzip,\tzstd\t", nil, Zstd},
		{",,gzip,,", nil, Gzip},
		{" , ", nil, Identity},
		{"g zip", nil, Identity},
		{"gzi", nil, Identity},
		{"gzipp", nil, Identity},
		{"zſtd", nil, Identity}, // no Unicode case folding
		{"zstd\x00", nil, Identity},
		{";q=1", nil, Identity},
		{"\"gzip\"", nil, Identity},
		{"gzip\r\n", nil, Identity},
	}
	for _, tc := range cases {
		name := strconv.Quote(tc.header)
		if tc.prefs != nil {
			name += "/" + codings(tc.prefs)
		}
		t.Run(name, func(t *testing.T) {
			if got := Negotiate(tc.header, tc.prefs); got != tc.want {
				t.Errorf("Negotiate(%q, %v) = %v, want %v", tc.header, tc.prefs, got, tc.want)
			}
			// The reference reader agrees on every case.
			if got := referenceNegotiate(tc.header, tc.prefs); got != tc.want {
				t.Errorf("referenceNegotiate(%q, %v) = %v, want %v", tc.header, tc.prefs, got, tc.want)
			}
		})
	}
}

func TestNegotiateValues(t *testing.T) {
	cases := []struct {
		values []string
		want   Coding
	}{
		{nil, Identity},
		{[]string{"br", "gzip"}, Gzip},
		{[]string{"gzip", "zstd"}, Zstd},
		{[]string{"gzip, zstd", "zstd;q=0"}, Gzip},
		{[]string{"*;q=0", "gzip"}, Gzip},
		{[]string{"", ""}, Identity},
	}
	for _, tc := range cases {
		if got := NegotiateValues(tc.values, nil); got != tc.want {
			t.Errorf("NegotiateValues(%q) = %v, want %v", tc.values, got, tc.want)
		}
		if got := Negotiate(strings.Join(tc.values, ","), nil); got != tc.want {
			t.Errorf("Negotiate(joined %q) = %v, want %v", tc.values, got, tc.want)
		}
	}
}

func TestNegotiateAllocations(t *testing.T) {
	for _, h := range benchHeaders {
		if n := testing.AllocsPerRun(100, func() { Negotiate(h.header, nil) }); n != 0 {
			t.Errorf("Negotiate(%q) allocates %v times", h.header, n)
		}
	}
	vals := []string{"gzip", "zstd;q=0.5"}
	if n := testing.AllocsPerRun(100, func() { NegotiateValues(vals, nil) }); n != 0 {
		t.Errorf("NegotiateValues allocates %v times", n)
	}
}

func TestCodingStrings(t *testing.T) {
	for _, c := range []Coding{Identity, Gzip, Zstd} {
		got, ok := ParseCoding(strings.ToUpper(c.String()))
		if !ok || got != c {
			t.Errorf("ParseCoding(%q) = %v, %v", strings.ToUpper(c.String()), got, ok)
		}
	}
	if _, ok := ParseCoding("*"); ok {
		t.Error(`ParseCoding("*") is ok`)
	}
	if s := Coding(7).String(); s != "invalid" {
		t.Errorf("Coding(7) = %q", s)
	}
	d := DefaultPrefs()
	d[0] = Identity // the caller's copy, not the package's
	if got := Negotiate("zstd, gzip", nil); got != Zstd {
		t.Errorf("after changing a DefaultPrefs copy, nil prefs chose %v", got)
	}
}

// FuzzNegotiate checks that Negotiate never panics, answers a coding from
// prefs or Identity, and agrees with the plain reference reader below
// (so a chosen coding is always one the header accepts).
func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{"", "gzip", "gzip, deflate, br, zstd", "*;q=0", "identity;q=0, gzip;q=0.5",
		"GZIP;Q=1.000", "x-gzip", "zstd;q=0, *", "gzip;q=abc", ",,,", "gzip;level=1;q=1"} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(5))
	}
	f.Fuzz(func(t *testing.T, header string, sel uint8) {
		prefs := [][]Coding{nil, {Zstd, Gzip}, {Gzip, Zstd}, {Gzip}, {Zstd}, {}, {Identity, Gzip}}[int(sel)%7]
		got := Negotiate(header, prefs)
		want := referenceNegotiate(header, prefs)
		if got != want {
			t.Fatalf("Negotiate(%q, %v) = %v, reference says %v", header, prefs, got, want)
		}
		if got == Identity {
			return
		}
		p := prefs
		if p == nil {
			p = DefaultPrefs()
		}
		found := false
		for _, c := range p {
			found = found || c == got
		}
		if !found {
			t.Fatalf("Negotiate(%q, %v) = %v, not in prefs", header, prefs, got)
		}
		if !referenceAccepts(header, got) {
			t.Fatalf("Negotiate(%q, %v) = %v, which the header does not accept", header, prefs, got)
		}
	})
}

// referenceNegotiate is a deliberately plain second reading of the rules
// Negotiate documents, built on the strings package and float parsing.
func referenceNegotiate(header string, prefs []Coding) Coding {
	if prefs == nil {
		prefs = DefaultPrefs()
	}
	for _, c := range prefs {
		if (c == Gzip || c == Zstd) && referenceAccepts(header, c) {
			return c
		}
	}
	return Identity
}

func referenceAccepts(header string, c Coding) bool {
	names := map[Coding][]string{Gzip: {"gzip", "x-gzip"}, Zstd: {"zstd"}}[c]
	own, star := -1.0, -1.0
	for _, elem := range strings.Split(header, ",") {
		name, params, hasParams := strings.Cut(elem, ";")
		name = strings.Trim(name, " \t")
		if name == "" {
			continue
		}
		q := 1.0
		if hasParams {
			q = referenceQ(strings.Trim(params, " \t"))
		}
		low := func(old float64) float64 {
			if old < 0 || q < old {
				return q
			}
			return old
		}
		if name == "*" {
			star = low(star)
		}
		for _, n := range names {
			if asciiLower(name) == n {
				own = low(own)
			}
		}
	}
	if own >= 0 {
		return own > 0
	}
	return star > 0
}

func referenceQ(p string) float64 {
	if !strings.HasPrefix(p, "q=") && !strings.HasPrefix(p, "Q=") {
		return 0
	}
	v := p[2:]
	digits := strings.TrimLeft(v, "01")
	if len(v) == 0 || len(v)-len(digits) != 1 {
		return 0 // must start with exactly one 0 or 1
	}
	if digits != "" {
		frac, ok := strings.CutPrefix(digits, ".")
		if !ok || len(frac) > 3 || strings.Trim(frac, "0123456789") != "" {
			return 0
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f > 1 {
		return 0
	}
	return f
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func codings(cs []Coding) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// AcceptedValues lists every accepted coding in the operator's order, its
// first Negotiate's answer, without allocating for two codings.
func TestAcceptedValues(t *testing.T) {
	zg, gz := []Coding{Zstd, Gzip}, []Coding{Gzip, Zstd}
	for _, tc := range []struct {
		header string
		prefs  []Coding
		want   []Coding
	}{
		{"gzip, zstd", zg, []Coding{Zstd, Gzip}},
		{"gzip, zstd", gz, []Coding{Gzip, Zstd}},
		{"gzip", zg, []Coding{Gzip}},
		{"zstd;q=0.1", zg, []Coding{Zstd}},
		{"*", nil, []Coding{Zstd, Gzip}},
		{"*, zstd;q=0", zg, []Coding{Gzip}},
		{"identity", zg, nil},
		{"", zg, nil},
		{"gzip, zstd", []Coding{Gzip}, []Coding{Gzip}},
		{"gzip", []Coding{}, nil},
	} {
		got := AcceptedValues([]string{tc.header}, tc.prefs)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q %v: %v, want %v", tc.header, tc.prefs, got, tc.want)
		}
		if neg := Negotiate(tc.header, tc.prefs); (len(got) == 0 && neg != Identity) || (len(got) > 0 && got[0] != neg) {
			t.Errorf("%q %v: first %v, Negotiate %v", tc.header, tc.prefs, got, neg)
		}
	}
	vals := []string{"gzip, zstd"}
	if n := testing.AllocsPerRun(100, func() { AcceptedValues(vals, zg) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
