package caddymodule

import (
	"strconv"

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
//	    presign_ttl      <duration>                    # default 60s; must be positive; redirect delivery only
//	    cdn cloudfront {                               # redirect to CloudFront signed URLs (redirect delivery, s3 store)
//	        domain      <host>                         # e.g. d111111abcdef8.cloudfront.net; no scheme or path
//	        key_pair_id <id>                           # public key id in the distribution's trusted key group
//	        private_key {file./path}|{env.NAME}        # PEM: RSA 2048 or ECDSA P-256; never literal
//	        origin_path <path>                         # optional, e.g. /segments: put before the object key
//	    }
//	    store_timeout    <duration>                    # default 5s; must be positive
//	    store_concurrency <n>                          # default 16: most distinct store reads at once (the limit below it follows the store's latency); 0: no cap
//	    store_queue      <n>                           # default 1024: store reads waiting for a slot; 0: none wait
//	    store_queue_wait <duration>                    # default 2s: longest wait for a slot, then 503 edge.overloaded
//	    grace            <duration>                    # default 5m: records keep deciding grants while the store cannot be read; 0 turns it off
//	    max_token_length <bytes>                       # default 4096
//	    disable_metrics                                # no caddy_syncular_* metrics
//	    verify_store_on_start true|false               # default true: unreachable s3 bucket fails the config; s3 only
//	    compress         zstd gzip|gzip|zstd|off       # default zstd gzip (preference order); off: identity only
//	    cache_status     on [<name>]|off               # RFC 9211 Cache-Status on granted answers; default off, name caddy-syncular
//	    tenant_key       <secret>                      # key of {http.syncular.tenant}; default derived from the first key
//	    cache {                                        # in-memory cache; every line optional
//	        max_bytes   <size>                         # default 64MiB; 0 disables the bytes cache
//	        max_entry   <size>                         # default 8MiB: larger segments stream uncached
//	        record_ttl  <duration>                     # default 2s; 0 disables the record cache
//	        max_records <n>                            # default 10000
//	        disk           <dir>|off                   # default <Caddy data dir>/syncular/segments
//	        disk_max_bytes <size>                      # default 4GiB; 0 disables the disk tier
//	        disk_best_effort                           # an unusable disk dir warns instead of failing the config
//	    }
//	}
//
// Secrets may be {env.NAME} or {file.PATH} placeholders, expanded once at
// provision time; a secret written literally (or as {$NAME}, which the
// Caddyfile expands when adapted) is in the JSON config, and provision
// warns about it. Sizes are bytes or humanized ("64MiB", "512KiB"; "MB"
// means 10^6). Each subdirective may appear once.
func (h *Handler) UnmarshalCaddyfile(disp *caddyfile.Dispenser) error {
	disp.Next() // consume directive name
	if disp.NextArg() {
		return disp.ArgErr()
	}
	return parseBlock(disp, 0, "", func(sub string) error {
		parse, ok := subdirectives[sub]
		if !ok {
			return disp.Errf("unknown subdirective %q%s", sub, didYouMean(sub, keysOf(subdirectives)))
		}
		return parse(h, disp)
	})
}

// subdirectives parse one line (or block) of the syncular_segments block
// each, from the subdirective's name on.
var subdirectives = map[string]func(h *Handler, disp *caddyfile.Dispenser) error{
	"key": func(h *Handler, disp *caddyfile.Dispenser) error {
		h.Keys = disp.RemainingArgs()
		if len(h.Keys) == 0 {
			return disp.ArgErr()
		}
		return nil
	},
	"audience": parseAudience,
	"skew": func(h *Handler, disp *caddyfile.Dispenser) error {
		dur, err := parseDuration(disp, false)
		if err != nil {
			return err
		}
		h.Skew = &dur // explicit: 0 is zero skew, not the default
		return nil
	},
	"presign_ttl": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.PresignTTL, err = parseDuration(disp, true)
		return err
	},
	"grace": func(h *Handler, disp *caddyfile.Dispenser) error {
		dur, err := parseDuration(disp, false)
		if err != nil {
			return err
		}
		h.Grace = &dur // explicit: 0 turns it off, not the default
		return nil
	},
	"store_timeout": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.StoreTimeout, err = parseDuration(disp, true)
		return err
	},
	"store_concurrency": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.StoreConcurrency, err = parseCount(disp, "store_concurrency")
		return err
	},
	"store_queue": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.StoreQueue, err = parseCount(disp, "store_queue")
		return err
	},
	"store_queue_wait": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.StoreQueueWait, err = parseDuration(disp, true)
		return err
	},
	"max_token_length": func(h *Handler, disp *caddyfile.Dispenser) error {
		v, err := oneArg(disp)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return disp.Errf("max_token_length must be a positive number of bytes, not %q", v)
		}
		h.MaxTokenLength = n
		return nil
	},
	"untokened": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.Untokened, err = oneOf(disp, "untokened must be next or reject", untokenedNext, untokenedReject)
		return err
	},
	"delivery": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.Delivery, err = oneOf(disp, "delivery must be serve, redirect or proxy", DeliveryServe, DeliveryRedirect, DeliveryProxy)
		return err
	},
	"legacy_headers": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.LegacyHeaders, err = oneOf(disp, "legacy_headers must be stream or redirect", legacyHeadersStream, legacyHeadersRedirect)
		return err
	},
	"disable_metrics": func(h *Handler, disp *caddyfile.Dispenser) error {
		if disp.NextArg() {
			return disp.ArgErr()
		}
		h.DisableMetrics = true
		return nil
	},
	"verify_store_on_start": func(h *Handler, disp *caddyfile.Dispenser) error {
		v, err := oneArg(disp)
		if err != nil {
			return err
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return disp.Errf("verify_store_on_start must be true or false, not %q", v)
		}
		h.VerifyStoreOnStart = &b
		return nil
	},
	"store":        parseStore,
	"cache":        parseCache,
	"compress":     parseCompress,
	"cdn":          parseCDN,
	"cache_status": parseCacheStatus,
	"tenant_key": func(h *Handler, disp *caddyfile.Dispenser) (err error) {
		h.TenantKey, err = oneArg(disp)
		return err
	},
}

// parseBlock runs each for every subdirective of the block at nesting,
// refusing a repeated one. prefix names the block in errors ("store s3: ").
func parseBlock(disp *caddyfile.Dispenser, nesting int, prefix string, each func(sub string) error) error {
	seen := map[string]bool{}
	for disp.NextBlock(nesting) {
		sub := disp.Val()
		if seen[sub] {
			return disp.Errf("%s%s specified more than once", prefix, sub)
		}
		seen[sub] = true
		if err := each(sub); err != nil {
			return err
		}
	}
	return nil
}

func parseAudience(h *Handler, disp *caddyfile.Dispenser) error {
	args := disp.RemainingArgs()
	if len(args) < 2 {
		return disp.ArgErr()
	}
	switch args[0] {
	case "template":
		if len(args) != 2 {
			return disp.ArgErr()
		}
		if long, short, ok := rewrittenPlaceholder(args[1]); ok {
			return disp.Errf("audience template: %s cannot be carried through a Caddyfile as written: "+
				"Caddy rewrites the shorthand %s into %s before this directive sees the template, so "+
				"the edge cannot tell which of the two you wrote. Keep a Caddyfile template's braces to "+
				"{partition} and literal text that is no Caddy placeholder, or write the template in "+
				"JSON config, which carries it byte for byte", long, short, long)
		}
		h.Audience = &AudienceConfig{Kind: "template", Template: args[1]}
	case "hmac_sha256":
		if len(args) > 3 {
			return disp.ArgErr()
		}
		h.Audience = &AudienceConfig{Kind: "hmac_sha256", Key: args[1]}
		if len(args) == 3 {
			if args[2] != "hex" && args[2] != "base64url" {
				return disp.Errf("audience hmac_sha256 encoding must be hex or base64url, not %q", args[2])
			}
			h.Audience.Encoding = args[2]
		}
	default:
		return disp.Errf("unknown audience rule %q (want template or hmac_sha256)%s", args[0], didYouMean(args[0], []string{"template", "hmac_sha256"}))
	}
	return nil
}

func parseStore(h *Handler, disp *caddyfile.Dispenser) error {
	if !disp.NextArg() {
		return disp.ArgErr()
	}
	switch disp.Val() {
	case backendSQLite:
		var path string
		if !disp.AllArgs(&path) {
			return disp.ArgErr()
		}
		h.Store = &StoreConfig{Backend: backendSQLite, Path: path}
		return nil
	case backendS3:
		if disp.NextArg() {
			return disp.ArgErr()
		}
		c := &S3Config{}
		h.Store = &StoreConfig{Backend: backendS3, S3: c}
		text := map[string]*string{
			"bucket": &c.Bucket, "region": &c.Region, "endpoint": &c.Endpoint, "prefix": &c.Prefix,
			"access_key_id": &c.AccessKeyID, "secret_access_key": &c.SecretAccessKey, "session_token": &c.SessionToken,
		}
		return parseBlock(disp, disp.Nesting(), "store s3: ", func(sub string) error {
			if sub == "path_style" {
				v := true // a bare path_style turns it on
				if disp.NextArg() {
					b, err := strconv.ParseBool(disp.Val())
					if err != nil {
						return disp.Errf("store s3: path_style must be true or false, not %q", disp.Val())
					}
					v = b
				}
				c.PathStyle = &v
				if disp.NextArg() {
					return disp.ArgErr()
				}
				return nil
			}
			dst, ok := text[sub]
			if !ok {
				return disp.Errf("store s3: unknown subdirective %q%s", sub, didYouMean(sub, append(keysOf(text), "path_style")))
			}
			if !disp.AllArgs(dst) {
				return disp.ArgErr()
			}
			return nil
		})
	default:
		return disp.Errf("unknown store backend %q (want sqlite or s3)%s", disp.Val(), didYouMean(disp.Val(), []string{backendSQLite, backendS3}))
	}
}

// parseCDN parses `cdn cloudfront { domain …; key_pair_id …; private_key …;
// origin_path … }` (syntax on UnmarshalCaddyfile).
func parseCDN(h *Handler, disp *caddyfile.Dispenser) error {
	if !disp.NextArg() {
		return disp.ArgErr()
	}
	if disp.Val() != "cloudfront" {
		return disp.Errf("unknown cdn %q (want cloudfront)", disp.Val())
	}
	if disp.NextArg() {
		return disp.ArgErr()
	}
	c := &CloudFrontConfig{}
	h.CDN = &CDNConfig{CloudFront: c}
	text := map[string]*string{
		"domain": &c.Domain, "key_pair_id": &c.KeyPairID, "private_key": &c.PrivateKey, "origin_path": &c.OriginPath,
	}
	return parseBlock(disp, disp.Nesting(), "cdn cloudfront: ", func(sub string) error {
		dst, ok := text[sub]
		if !ok {
			return disp.Errf("cdn cloudfront: unknown subdirective %q%s", sub, didYouMean(sub, keysOf(text)))
		}
		if !disp.AllArgs(dst) {
			return disp.ArgErr()
		}
		return nil
	})
}

// parseCompress parses `compress zstd gzip` (preference order) or
// `compress off`.
func parseCompress(h *Handler, disp *caddyfile.Dispenser) error {
	args := disp.RemainingArgs()
	if len(args) == 0 {
		return disp.ArgErr()
	}
	if _, err := compressPrefs(args); err != nil {
		return disp.Err(err.Error())
	}
	h.Compress = args
	return nil
}

// parseCacheStatus parses `cache_status on|off [<name>]`.
func parseCacheStatus(h *Handler, disp *caddyfile.Dispenser) error {
	args := disp.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return disp.ArgErr()
	}
	switch args[0] {
	case "on":
		h.CacheStatus = true
	case "off":
		if len(args) == 2 {
			return disp.Errf("cache_status off takes no name")
		}
		h.CacheStatus = false
	default:
		return disp.Errf("cache_status must be on or off, not %q", args[0])
	}
	if len(args) == 2 {
		if !cacheStatusNameRe.MatchString(args[1]) {
			return disp.Errf("cache_status: name %q is not a token (letters, digits and -._:/ etc., starting with a letter, at most 64)", args[1])
		}
		h.CacheStatusName = args[1]
	}
	return nil
}

// oneArg returns the subdirective's single argument.
func oneArg(disp *caddyfile.Dispenser) (string, error) {
	var v string
	if !disp.AllArgs(&v) {
		return "", disp.ArgErr()
	}
	return v, nil
}

// oneOf returns the subdirective's single argument, one of allowed; msg
// starts the error for any other value.
func oneOf(disp *caddyfile.Dispenser, msg string, allowed ...string) (string, error) {
	v, err := oneArg(disp)
	if err != nil {
		return "", err
	}
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	return "", disp.Errf("%s, not %q%s", msg, v, didYouMean(v, allowed))
}

// parseDuration parses the subdirective's single duration argument,
// never negative. positive: 0 is refused too (where 0 in JSON means
// "unset", an explicit 0 is a mistake).
func parseDuration(disp *caddyfile.Dispenser, positive bool) (caddy.Duration, error) {
	sub := disp.Val()
	v, err := oneArg(disp)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, disp.Errf("%s: bad duration %q: %v", sub, v, err)
	}
	if dur < 0 {
		return 0, disp.Errf("%s must not be negative", sub)
	}
	if dur == 0 && positive {
		return 0, disp.Errf("%s must be positive (omit it for the default)", sub)
	}
	return caddy.Duration(dur), nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)

// parseCount parses one non-negative integer argument of sub (explicit:
// 0 is a value, not the default).
func parseCount(disp *caddyfile.Dispenser, sub string) (*int, error) {
	v, err := oneArg(disp)
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return nil, disp.Errf("%s must be a number, 0 or more, not %q", sub, v)
	}
	return &n, nil
}
