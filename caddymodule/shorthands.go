package caddymodule

import (
	"regexp"
	"strings"
)

// Caddy's Caddyfile adapter rewrites placeholder shorthands ({host},
// {query.x}, ...) into their long forms ({http.request.host}, ...) in every
// token, quoted or not, before a directive sees it. An audience template
// is literal text (only {partition} means anything, replaced with plain
// string operations, protocol §4), and the two forms arrive identical,
// so a template holding any text the rewrite produces cannot be carried
// as written: the directive refuses it (rewrittenPlaceholder). The lists
// mirror caddyconfig/httpcaddyfile/shorthands.go of Caddy v2.11; a test
// adapts every shorthand and long form. JSON config carries a template
// byte for byte.
var (
	shorthandLong = [][2]string{ // long form, shorthand
		{"{http.request.host}", "{host}"},
		{"{http.request.hostport}", "{hostport}"},
		{"{http.request.port}", "{port}"},
		{"{http.request.orig_method}", "{orig_method}"},
		{"{http.request.orig_uri}", "{orig_uri}"},
		{"{http.request.orig_uri.path}", "{orig_path}"},
		{"{http.request.orig_uri.path.dir}", "{orig_dir}"},
		{"{http.request.orig_uri.path.file}", "{orig_file}"},
		{"{http.request.orig_uri.query}", "{orig_query}"},
		{"{http.request.orig_uri.prefixed_query}", "{orig_?query}"},
		{"{http.request.method}", "{method}"},
		{"{http.request.uri}", "{uri}"},
		{"{http.request.uri_escaped}", "{%uri}"},
		{"{http.request.uri.path}", "{path}"},
		{"{http.request.uri.path_escaped}", "{%path}"},
		{"{http.request.uri.path.dir}", "{dir}"},
		{"{http.request.uri.path.file}", "{file}"},
		{"{http.request.uri.query}", "{query}"},
		{"{http.request.uri.query_escaped}", "{%query}"},
		{"{http.request.uri.prefixed_query}", "{?query}"},
		{"{http.request.remote}", "{remote}"},
		{"{http.request.remote.host}", "{remote_host}"},
		{"{http.request.remote.port}", "{remote_port}"},
		{"{http.request.scheme}", "{scheme}"},
		{"{http.request.uuid}", "{uuid}"},
		{"{http.request.tls.cipher_suite}", "{tls_cipher}"},
		{"{http.request.tls.version}", "{tls_version}"},
		{"{http.request.tls.client.fingerprint}", "{tls_client_fingerprint}"},
		{"{http.request.tls.client.issuer}", "{tls_client_issuer}"},
		{"{http.request.tls.client.serial}", "{tls_client_serial}"},
		{"{http.request.tls.client.subject}", "{tls_client_subject}"},
		{"{http.request.tls.client.certificate_pem}", "{tls_client_certificate_pem}"},
		{"{http.request.tls.client.certificate_der_base64}", "{tls_client_certificate_der_base64}"},
		{"{http.reverse_proxy.upstream.hostport}", "{upstream_hostport}"},
		{"{http.vars.client_ip}", "{client_ip}"},
	}
	shorthandLongRe = []struct {
		long  *regexp.Regexp
		short string
	}{
		{regexp.MustCompile(`\{http\.request\.header\.([\w-]*)\}`), "{header.$1}"},
		{regexp.MustCompile(`\{http\.request\.cookie\.([\w-]*)\}`), "{cookie.$1}"},
		{regexp.MustCompile(`\{http\.request\.host\.labels\.([\w-]*)\}`), "{labels.$1}"},
		{regexp.MustCompile(`\{http\.request\.uri\.path\.file\.([\w-]*)\}`), "{file.$1}"},
		{regexp.MustCompile(`\{http\.request\.uri\.path\.([\w-]*)\}`), "{path.$1}"},
		{regexp.MustCompile(`\{http\.request\.uri\.query\.([\w-]*)\}`), "{query.$1}"},
		{regexp.MustCompile(`\{http\.regexp\.([\w-\.]*)\}`), "{re.$1}"},
		{regexp.MustCompile(`\{http\.vars\.([\w-]*)\}`), "{vars.$1}"},
		{regexp.MustCompile(`\{http\.reverse_proxy\.([\w-\.]*)\}`), "{rp.$1}"},
		{regexp.MustCompile(`\{http\.intercept\.([\w-\.]*)\}`), "{resp.$1}"},
		{regexp.MustCompile(`\{http\.error\.([\w-\.]*)\}`), "{err.$1}"},
		{regexp.MustCompile(`\{http\.matchers\.file\.([\w-]*)\}`), "{file_match.$1}"},
	}
)

// rewrittenPlaceholder reports the first text in s that Caddy's shorthand
// rewrite can produce (long), with a shorthand that becomes it (short).
func rewrittenPlaceholder(s string) (long, short string, ok bool) {
	if !strings.Contains(s, "{http.") {
		return "", "", false
	}
	for _, p := range shorthandLong {
		if strings.Contains(s, p[0]) {
			return p[0], p[1], true
		}
	}
	for _, r := range shorthandLongRe {
		if m := r.long.FindStringSubmatchIndex(s); m != nil {
			long = s[m[0]:m[1]]
			return long, string(r.long.ExpandString(nil, r.short, s, m)), true
		}
	}
	return "", "", false
}
