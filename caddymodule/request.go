package caddymodule

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/syncular/caddy-syncular/segid"
)

// stParams returns the values of every st parameter in a raw query, and
// whether any was present. A value that cannot be unescaped is returned
// as an empty token, which verification refuses.
func stParams(rawQuery string) (tokens []string, present bool) {
	tokens = appendStParams(nil, rawQuery)
	return tokens, len(tokens) > 0
}

// appendStParams appends the values of every st parameter in a raw query
// to dst, as stParams returns them. The handler passes a one-element array
// of its own, so the usual single token costs no allocation.
func appendStParams(dst []string, rawQuery string) []string {
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != "st" {
			if !strings.Contains(k, "%") {
				continue
			}
			uk, err := url.QueryUnescape(k)
			if err != nil || uk != "st" {
				continue
			}
		}
		tok := v // a token is base64url: nothing to unescape, usually
		if strings.IndexByte(v, '%') >= 0 || strings.IndexByte(v, '+') >= 0 {
			var err error
			if tok, err = url.QueryUnescape(v); err != nil {
				tok = ""
			}
		}
		dst = append(dst, tok)
	}
	return dst
}

// hashHidesToken reports a raw '#' in the request target together with an
// st parameter before or after it. Go's server keeps such a '#' in the
// path or query, while URL parsers (log filters among them) end the URL
// there: the token would be read here but missed by the filter that keeps
// it out of the access log. Both the target as received and as parsed
// are checked, so a rewrite cannot hide the '#'.
func hashHidesToken(r *http.Request) bool {
	if strings.IndexByte(r.RequestURI, '#') < 0 && strings.IndexByte(r.URL.RawQuery, '#') < 0 &&
		strings.IndexByte(r.URL.RawPath, '#') < 0 {
		return false // the common case, without building strings
	}
	for _, target := range [2]string{r.RequestURI, r.URL.RawPath + "?" + r.URL.RawQuery} {
		if hashHidesTokenIn(target) {
			return true
		}
	}
	return false
}

// reasonHashInURL is the refusal of a request hashHidesToken reports.
const reasonHashInURL = "segment token rejected: '#' in a signed URL"

// hashHidesTokenIn reports a raw '#' in a request target (path and query,
// or an absolute URI) together with an st parameter before or after it:
// hashHidesToken's rule for one target, which `caddy syncular-token
// inspect` applies to the URL it is given.
func hashHidesTokenIn(target string) bool {
	i := strings.IndexAny(target, "?#")
	if i < 0 || strings.IndexByte(target[i:], '#') < 0 {
		return false
	}
	_, present := stParams(strings.NewReplacer("#", "&", "?", "&").Replace(target[i+1:]))
	return present
}

// segmentFromPath parses the last element of the request path,
// percent-decoded, as a segment id: the one place a request's id is
// checked; every layer below takes the parsed segid.ID.
//
// When the URL has no RawPath, its escaped form is the default encoding
// of Path, which escapes no '/' and maps each decoded byte back one to
// one: the last element of Path is then the decoded last element itself,
// and is read without escaping the path and unescaping it again.
func segmentFromPath(u *url.URL) (segid.ID, bool) {
	if u.RawPath == "" {
		id, err := segid.ParseID(u.Path[strings.LastIndexByte(u.Path, '/')+1:])
		return id, err == nil
	}
	return segmentFromEscapedPath(u)
}

// segmentFromEscapedPath is segmentFromPath by the definition: the last
// element of the escaped path, unescaped.
func segmentFromEscapedPath(u *url.URL) (segid.ID, bool) {
	p := u.EscapedPath()
	last := p[strings.LastIndexByte(p, '/')+1:]
	if len(last) > segid.MaxEscapedLen {
		return segid.ID{}, false
	}
	s, err := url.PathUnescape(last)
	if err != nil {
		return segid.ID{}, false
	}
	id, err := segid.ParseID(s)
	return id, err == nil
}
