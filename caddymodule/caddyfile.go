package caddymodule

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("syncular_segments", parseCaddyfile)
	// Before respond and reverse_proxy: a signed request is answered
	// here, an unsigned one continues to the proxy behind.
	httpcaddyfile.RegisterDirectiveOrder("syncular_segments", httpcaddyfile.Before, "respond")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	syncular_segments [<matcher>] {
//	    key              <secret> [<secret>...]        # current key first; hex:/base64: for raw bytes
//	    audience         template <text>               # {partition} replaced by the partition id; no Caddy placeholder
//	    audience         hmac_sha256 <secret> [hex|base64url]   # default hex
//	    skew             <duration>                    # default 60s; 0s is zero skew
//	    store            sqlite <path>
//	    store            s3 {
//	        bucket            <name>
//	        region            <region>                 # "auto" for R2
//	        endpoint          <url>                    # omit for AWS
//	        prefix            <key prefix>
//	        access_key_id     <id>                     # omit both for the SDK default chain
//	        secret_access_key <secret>
//	        session_token     <token>
//	        path_style        [true|false]             # default true
//	    }
//	    untokened        next|reject                   # default next
//	    delivery         serve|redirect|proxy          # default redirect for s3, serve for sqlite
//	    legacy_headers   stream|redirect               # redirect delivery, objects with a record header; default stream
//	    presign_ttl      <duration>                    # default 60s; must be positive
//	    store_timeout    <duration>                    # default 5s; must be positive
//	    max_token_length <bytes>                       # default 4096
//	    disable_metrics                                # no caddy_syncular_* metrics
//	    verify_store_on_start true|false               # default true: unreachable s3 bucket fails the config
//	    cache {                                        # in-memory cache; every line optional
//	        max_bytes   <size>                         # default 64MiB; 0 disables the bytes cache
//	        max_entry   <size>                         # default 8MiB: larger segments stream uncached
//	        record_ttl  <duration>                     # default 2s; 0 disables the record cache
//	        max_records <n>                            # default 10000
//	    }
//	}
//
// Secrets may be {env.NAME} or {file.PATH} placeholders, expanded once at
// provision time. Each subdirective may appear once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		sub := d.Val()
		if seen[sub] {
			return d.Errf("%s specified more than once", sub)
		}
		seen[sub] = true
		switch sub {
		case "key":
			h.Keys = d.RemainingArgs()
			if len(h.Keys) == 0 {
				return d.ArgErr()
			}
		case "audience":
			args := d.RemainingArgs()
			if len(args) < 2 {
				return d.ArgErr()
			}
			switch args[0] {
			case "template":
				if len(args) != 2 {
					return d.ArgErr()
				}
				if long, short, ok := rewrittenPlaceholder(args[1]); ok {
					return d.Errf("audience template: %s cannot be carried through a Caddyfile as written: "+
						"Caddy rewrites the shorthand %s into %s before this directive sees the template, so "+
						"the edge cannot tell which of the two you wrote. Keep a Caddyfile template's braces to "+
						"{partition} and literal text that is no Caddy placeholder, or write the template in "+
						"JSON config, which carries it byte for byte", long, short, long)
				}
				h.Audience = &AudienceConfig{Kind: "template", Template: args[1]}
			case "hmac_sha256":
				if len(args) > 3 {
					return d.ArgErr()
				}
				h.Audience = &AudienceConfig{Kind: "hmac_sha256", Key: args[1]}
				if len(args) == 3 {
					if args[2] != "hex" && args[2] != "base64url" {
						return d.Errf("audience hmac_sha256 encoding must be hex or base64url, not %q", args[2])
					}
					h.Audience.Encoding = args[2]
				}
			default:
				return d.Errf("unknown audience rule %q (want template or hmac_sha256)", args[0])
			}
		case "skew", "presign_ttl", "store_timeout":
			dur, err := parseDuration(d)
			if err != nil {
				return err
			}
			if dur == 0 && sub != "skew" {
				// 0 would mean "unset" in JSON; here it is a mistake.
				return d.Errf("%s must be positive (omit it for the default)", sub)
			}
			switch sub {
			case "skew":
				h.Skew = &dur // explicit: 0 is zero skew, not the default
			case "presign_ttl":
				h.PresignTTL = dur
			default:
				h.StoreTimeout = dur
			}
		case "max_token_length":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n <= 0 {
				return d.Errf("max_token_length must be a positive number of bytes, not %q", d.Val())
			}
			h.MaxTokenLength = n
			if d.NextArg() {
				return d.ArgErr()
			}
		case "untokened":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if v := d.Val(); v != "next" && v != "reject" {
				return d.Errf("untokened must be next or reject, not %q", v)
			}
			h.Untokened = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "delivery":
			if !d.NextArg() {
				return d.ArgErr()
			}
			switch v := d.Val(); v {
			case DeliveryServe, DeliveryRedirect, DeliveryProxy:
				h.Delivery = v
			default:
				return d.Errf("delivery must be serve, redirect or proxy, not %q", v)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "legacy_headers":
			if !d.NextArg() {
				return d.ArgErr()
			}
			switch v := d.Val(); v {
			case legacyHeadersStream, legacyHeadersRedirect:
				h.LegacyHeaders = v
			default:
				return d.Errf("legacy_headers must be stream or redirect, not %q", v)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "disable_metrics":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.DisableMetrics = true
		case "verify_store_on_start":
			if !d.NextArg() {
				return d.ArgErr()
			}
			v, err := strconv.ParseBool(d.Val())
			if err != nil {
				return d.Errf("verify_store_on_start must be true or false, not %q", d.Val())
			}
			h.VerifyStoreOnStart = &v
			if d.NextArg() {
				return d.ArgErr()
			}
		case "compress":
			if err := parseCompress(h, d); err != nil {
				return err
			}
		case "cache":
			if err := h.unmarshalCache(d); err != nil {
				return err
			}
		case "store":
			if err := h.unmarshalStore(d); err != nil {
				return err
			}
		default:
			return d.Errf("unknown subdirective %q", sub)
		}
	}
	return nil
}

func (h *Handler) unmarshalStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	switch d.Val() {
	case "sqlite":
		if !d.NextArg() {
			return d.ArgErr()
		}
		h.Store = &StoreConfig{Backend: "sqlite", Path: d.Val()}
		if d.NextArg() {
			return d.ArgErr()
		}
		return nil
	case "s3":
		if d.NextArg() {
			return d.ArgErr()
		}
		cfg := &S3Config{}
		h.Store = &StoreConfig{Backend: "s3", S3: cfg}
		seen := map[string]bool{}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			sub := d.Val()
			if seen[sub] {
				return d.Errf("store s3: %s specified more than once", sub)
			}
			seen[sub] = true
			if sub == "path_style" {
				v := true
				if d.NextArg() {
					b, err := strconv.ParseBool(d.Val())
					if err != nil {
						return d.Errf("store s3: path_style must be true or false, not %q", d.Val())
					}
					v = b
				}
				cfg.PathStyle = &v
				if d.NextArg() {
					return d.ArgErr()
				}
				continue
			}
			var dst *string
			switch sub {
			case "bucket":
				dst = &cfg.Bucket
			case "region":
				dst = &cfg.Region
			case "endpoint":
				dst = &cfg.Endpoint
			case "prefix":
				dst = &cfg.Prefix
			case "access_key_id":
				dst = &cfg.AccessKeyID
			case "secret_access_key":
				dst = &cfg.SecretAccessKey
			case "session_token":
				dst = &cfg.SessionToken
			default:
				return d.Errf("store s3: unknown subdirective %q", sub)
			}
			if !d.NextArg() {
				return d.ArgErr()
			}
			*dst = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		}
		return nil
	default:
		return d.Errf("unknown store backend %q (want sqlite or s3)", d.Val())
	}
}

// Caddy's Caddyfile adapter rewrites placeholder shorthands ({host},
// {query.x}, ...) into their long forms ({http.request.host}, ...) in every
// token, quoted or not, before a directive sees it. An audience template
// is literal text (only {partition} means anything, replaced with plain
// string operations, PROTOCOL.md §4), and the two forms arrive identical,
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

func parseDuration(d *caddyfile.Dispenser) (caddy.Duration, error) {
	sub := d.Val()
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil {
		return 0, d.Errf("%s: bad duration %q: %v", sub, d.Val(), err)
	}
	if dur < 0 {
		return 0, d.Errf("%s must not be negative", sub)
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return caddy.Duration(dur), nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
