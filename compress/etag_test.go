package compress

import "testing"

func TestETag(t *testing.T) {
	id := segmentID([]byte("SSG2 etag"))
	cases := []struct {
		c    Coding
		want string
	}{
		{Identity, `"` + id + `"`},
		{Gzip, `"` + id + `+gzip"`},
		{Zstd, `"` + id + `+zstd"`},
		{Coding(9), `"` + id + `"`},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		got := ETag(id, tc.c)
		if got != tc.want {
			t.Errorf("ETag(%v) = %s, want %s", tc.c, got, tc.want)
		}
		if tc.c.valid() {
			if seen[got] {
				t.Errorf("ETag(%v) = %s is not distinct", tc.c, got)
			}
			seen[got] = true
		}
		if !MatchIfNoneMatch(id, got) {
			t.Errorf("ETag(%v) does not match itself", tc.c)
		}
	}
}

func TestMatchIfNoneMatch(t *testing.T) {
	id := segmentID([]byte("SSG2 one"))
	other := segmentID([]byte("SSG2 two"))
	cases := []struct {
		name   string
		values []string
		want   bool
	}{
		{"none", nil, false},
		{"empty", []string{""}, false},
		{"identity", []string{`"` + id + `"`}, true},
		{"gzip", []string{`"` + id + `+gzip"`}, true},
		{"zstd", []string{`"` + id + `+zstd"`}, true},
		{"weak", []string{`W/"` + id + `"`}, true},
		{"weak gzip", []string{`W/"` + id + `+gzip"`}, true},
		{"star", []string{"*"}, true},
		{"star spaced", []string{"  * "}, true},
		{"other segment", []string{`"` + other + `"`}, false},
		{"other segment gzip", []string{`"` + other + `+gzip"`}, false},
		{"unknown coding", []string{`"` + id + `+br"`}, false},
		{"suffix junk", []string{`"` + id + `x"`}, false},
		{"prefix only", []string{`"` + id[:20] + `"`}, false},
		{"unquoted", []string{id}, false},
		{"lowercase w", []string{`w/"` + id + `"`}, false},
		{"list, match last", []string{`"` + other + `", W/"` + id + `+zstd"`}, true},
		{"list, match first", []string{`"` + id + `","` + other + `"`}, true},
		{"list with empty elements", []string{` , ,"` + id + `" ,`}, true},
		{"second header line", []string{`"` + other + `"`, `"` + id + `"`}, true},
		{"garbage before match", []string{`garbage, "` + id + `"`}, false},
		{"match before garbage", []string{`"` + id + `", garbage`}, true},
		{"unterminated", []string{`"` + id}, false},
		{"space inside", []string{`"` + id + ` "`}, false},
		{"quoted star", []string{`"*"`}, false},
		{"empty tag", []string{`""`}, false},
		{"id inside a longer tag", []string{`"x` + id + `"`}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := MatchIfNoneMatch(id, tc.values...); got != tc.want {
				t.Errorf("MatchIfNoneMatch(%q) = %v, want %v", tc.values, got, tc.want)
			}
		})
	}
	if MatchIfNoneMatch("", `""`, "*") {
		t.Error("an empty segment id matched")
	}
}

func TestMatchIfNoneMatchAllocations(t *testing.T) {
	id := segmentID([]byte("SSG2 alloc"))
	h := `W/"` + segmentID(nil) + `", ` + ETag(id, Gzip)
	if n := testing.AllocsPerRun(100, func() { MatchIfNoneMatch(id, h) }); n != 0 {
		t.Errorf("MatchIfNoneMatch allocates %v times", n)
	}
}
