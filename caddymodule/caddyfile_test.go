package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite golden adapt files")

func TestUnmarshalCaddyfile(t *testing.T) {
	good := []struct {
		name, in string
		check    func(*Handler) bool
	}{
		{"full sqlite", `syncular_segments {
			key {env.K1} hex:00ff
			audience template aud:{partition}
			skew 90s
			store sqlite /var/lib/sync.db
			untokened reject
			store_timeout 2s
			max_token_length 2048
		}`, func(h *Handler) bool {
			return len(h.Keys) == 2 && h.Keys[0] == "{env.K1}" && h.Audience.Kind == "template" &&
				h.Audience.Template == "aud:{partition}" && h.Skew != nil && *h.Skew == caddy.Duration(90e9) &&
				h.Store.Backend == "sqlite" && h.Store.Path == "/var/lib/sync.db" && h.Untokened == "reject" &&
				h.StoreTimeout == caddy.Duration(2e9) && h.MaxTokenLength == 2048
		}},
		{"hmac audience base64url", `syncular_segments {
			key k
			audience hmac_sha256 {env.AUD} base64url
			store sqlite db
		}`, func(h *Handler) bool {
			return h.Audience.Kind == "hmac_sha256" && h.Audience.Key == "{env.AUD}" && h.Audience.Encoding == "base64url"
		}},
		{"s3", `syncular_segments {
			key k
			audience hmac_sha256 a
			store s3 {
				bucket segs
				region auto
				endpoint http://127.0.0.1:9000
				prefix syncular/
				access_key_id {env.AK}
				secret_access_key {env.SK}
				session_token {env.ST}
				path_style false
			}
			delivery proxy
			presign_ttl 30s
		}`, func(h *Handler) bool {
			s := h.Store.S3
			return h.Store.Backend == "s3" && s.Bucket == "segs" && s.Region == "auto" && s.Endpoint == "http://127.0.0.1:9000" &&
				s.Prefix == "syncular/" && s.AccessKeyID == "{env.AK}" && s.SecretAccessKey == "{env.SK}" &&
				s.SessionToken == "{env.ST}" && s.PathStyle != nil && !*s.PathStyle && h.Delivery == "proxy" &&
				h.PresignTTL == caddy.Duration(30e9)
		}},
		{"legacy_headers redirect", `syncular_segments {
			key k
			delivery redirect
			legacy_headers redirect
		}`, func(h *Handler) bool { return h.LegacyHeaders == "redirect" }},
		{"legacy_headers stream", `syncular_segments {
			key k
			legacy_headers stream
		}`, func(h *Handler) bool { return h.LegacyHeaders == "stream" }},
		{"legacy_headers unset", `syncular_segments {
			key k
		}`, func(h *Handler) bool { return h.LegacyHeaders == "" }},
		{"cache_status on", `syncular_segments {
			key k
			cache_status on
		}`, func(h *Handler) bool { return h.CacheStatus && h.CacheStatusName == "" }},
		{"cache_status named", `syncular_segments {
			key k
			cache_status on edge-fra1
			tenant_key {env.TENANT_KEY}
		}`, func(h *Handler) bool {
			return h.CacheStatus && h.CacheStatusName == "edge-fra1" && h.TenantKey == "{env.TENANT_KEY}"
		}},
		{"cache_status off", `syncular_segments {
			key k
			cache_status off
		}`, func(h *Handler) bool { return !h.CacheStatus }},
	}
	for _, c := range good {
		t.Run(c.name, func(t *testing.T) {
			h := new(Handler)
			if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.in)); err != nil {
				t.Fatal(err)
			}
			if !c.check(h) {
				b, _ := json.Marshal(h)
				t.Fatalf("parsed wrong: %s", b)
			}
		})
	}
	bad := []struct{ name, in, want string }{
		{"argument on directive", `syncular_segments extra { key k }`, "wrong argument count"},
		{"unknown subdirective", "syncular_segments {\n key k\n colour blue\n}", "unknown subdirective \"colour\""},
		{"repeated", "syncular_segments {\n key a\n key b\n}", "key specified more than once"},
		{"key without value", "syncular_segments {\n key\n}", "wrong argument count"},
		{"bad duration", "syncular_segments {\n skew soon\n}", "bad duration"},
		{"negative duration", "syncular_segments {\n skew -5s\n}", "must not be negative"},
		{"untokened value", "syncular_segments {\n untokened maybe\n}", "untokened must be next or reject"},
		{"audience rule", "syncular_segments {\n audience reverse x\n}", "unknown audience rule"},
		{"audience encoding", "syncular_segments {\n audience hmac_sha256 k b32\n}", "encoding must be hex or base64url"},
		{"template extra", "syncular_segments {\n audience template a b\n}", "wrong argument count"},
		{"store backend", "syncular_segments {\n store redis x\n}", "unknown store backend"},
		{"sqlite without path", "syncular_segments {\n store sqlite\n}", "wrong argument count"},
		{"s3 unknown", "syncular_segments {\n store s3 {\n colour x\n }\n}", "store s3: unknown subdirective"},
		{"delivery value", "syncular_segments {\n delivery teleport\n}", "delivery must be serve, redirect or proxy"},
		{"max token", "syncular_segments {\n max_token_length -1\n}", "max_token_length must be a positive"},
		{"legacy_headers value", "syncular_segments {\n legacy_headers proxy\n}", "legacy_headers must be stream or redirect"},
		{"legacy_headers missing", "syncular_segments {\n legacy_headers\n}", "wrong argument count"},
		{"legacy_headers extra", "syncular_segments {\n legacy_headers stream redirect\n}", "wrong argument count"},
		{"cache_status value", "syncular_segments {\n cache_status yes\n}", "cache_status must be on or off"},
		{"cache_status missing", "syncular_segments {\n cache_status\n}", "wrong argument count"},
		{"cache_status bad name", "syncular_segments {\n cache_status on \"two words\"\n}", "is not a token"},
		{"cache_status off named", "syncular_segments {\n cache_status off x\n}", "takes no name"},
		{"tenant_key missing", "syncular_segments {\n tenant_key\n}", "wrong argument count"},
		{"legacy_headers repeated", "syncular_segments {\n legacy_headers stream\n legacy_headers redirect\n}", "legacy_headers specified more than once"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("error lacks file:line: %v", err)
			}
		})
	}
}

// TestCaddyfileAdapt compares Caddyfile → JSON adaptation with golden
// files (input, a line of dashes, expected JSON, or "ERROR: <text the
// adapt error must contain>"). -update rewrites the JSON ones.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "caddyfile_adapt", "*.caddyfiletest"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in, want, ok := strings.Cut(string(raw), "\n----------\n")
			if !ok {
				t.Fatalf("%s: no ---------- separator", f)
			}
			out, warnings, err := adapter.Adapt([]byte(in), nil)
			if wantErr, ok := strings.CutPrefix(want, "ERROR: "); ok {
				// A refusal: the error must contain the rest of the line.
				wantErr = strings.TrimSpace(wantErr)
				if err == nil || !strings.Contains(err.Error(), wantErr) {
					t.Fatalf("adapt error %v, want it to contain %q", err, wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			if len(warnings) > 0 {
				t.Fatalf("adapt warnings: %v", warnings)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, out, "", "\t"); err != nil {
				t.Fatal(err)
			}
			got := pretty.String() + "\n"
			if *update {
				if err := os.WriteFile(f, []byte(in+"\n----------\n"+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != want {
				t.Fatalf("adapted JSON differs from %s:\n%s", f, got)
			}
		})
	}
}

// adaptTemplate adapts a Caddyfile whose handler has audience template
// tmpl through Caddy's real Caddyfile adapter, and returns the template
// the handler's JSON carries.
func adaptTemplate(t *testing.T, tmpl string) (string, error) {
	t.Helper()
	in := ":8080 {\n\tsyncular_segments {\n\t\tkey k\n\t\taudience template " + tmpl + "\n\t\tstore sqlite db\n\t}\n}\n"
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(in), nil)
	if err != nil {
		return "", err
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []struct {
							Handler  string `json:"handler"`
							Audience *AudienceConfig
						} `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, s := range cfg.Apps.HTTP.Servers {
		for _, r := range s.Routes {
			for _, hd := range r.Handle {
				if hd.Handler == "syncular_segments" && hd.Audience != nil {
					return hd.Audience.Template, nil
				}
			}
		}
	}
	t.Fatalf("no syncular_segments handler with an audience in:\n%s", out)
	return "", nil
}

// TestTemplateSurvivesAdapt: a template whose braces are {partition} and
// text that is no Caddy shorthand reaches the handler exactly as written,
// quoted or not; {env.*} is not expanded either (only {$VAR} is, by Caddy
// at parse time, as everywhere in a Caddyfile).
func TestTemplateSurvivesAdapt(t *testing.T) {
	for _, c := range []struct{ written, want string }{
		{"aud:{partition}", "aud:{partition}"},
		{"{partition}", "{partition}"},
		{"tenant/{partition}/v1", "tenant/{partition}/v1"},
		{"{partition}-{tenant}", "{partition}-{tenant}"},
		{"{partition}/{env.HOME}", "{partition}/{env.HOME}"},
		{"{partition}/{http.custom}", "{partition}/{http.custom}"},
		{"{partition}/{host.x}", "{partition}/{host.x}"},
		{"{partition}/{header.a.b}", "{partition}/{header.a.b}"},
		{`"aud: {partition}"`, "aud: {partition}"},
		{"`aud:{partition}`", "aud:{partition}"},
	} {
		got, err := adaptTemplate(t, c.written)
		if err != nil {
			t.Fatalf("%s: %v", c.written, err)
		}
		if got != c.want {
			t.Errorf("template %s arrived as %q, want %q", c.written, got, c.want)
		}
	}
}

// TestTemplateRewrittenFormsRefused: Caddy rewrites every placeholder
// shorthand into its long form in every token (quoted too) before the
// directive runs, so {host} and {http.request.host} arrive identical. Each
// shorthand of Caddy v2.11 and each long form is refused at adapt time,
// at file:line, with a message naming both forms and the way out.
func TestTemplateRewrittenFormsRefused(t *testing.T) {
	pairs := [][2]string{} // written, the long form the error must name
	for _, p := range shorthandLong {
		pairs = append(pairs, [2]string{p[1], p[0]}, [2]string{p[0], p[0]})
	}
	for _, p := range [][2]string{
		{"{header.X-Y}", "{http.request.header.X-Y}"}, {"{cookie.b}", "{http.request.cookie.b}"},
		{"{labels.0}", "{http.request.host.labels.0}"}, {"{path.x}", "{http.request.uri.path.x}"},
		{"{path.dir}", "{http.request.uri.path.dir}"}, {"{file.y}", "{http.request.uri.path.file.y}"},
		{"{query.z}", "{http.request.uri.query.z}"}, {"{re.n.1}", "{http.regexp.n.1}"},
		{"{vars.v}", "{http.vars.v}"}, {"{rp.a.b}", "{http.reverse_proxy.a.b}"},
		{"{resp.c}", "{http.intercept.c}"}, {"{err.d}", "{http.error.d}"},
		{"{file_match.e}", "{http.matchers.file.e}"},
	} {
		pairs = append(pairs, p, [2]string{p[1], p[1]})
	}
	// The table is Caddy's own rewrite: each shorthand becomes its long
	// form, and a long form stays as it is.
	rw := httpcaddyfile.NewShorthandReplacer()
	for _, p := range pairs {
		seg := caddyfile.Segment{{Text: p[0]}}
		rw.ApplyToSegment(&seg)
		if seg[0].Text != p[1] {
			t.Errorf("Caddy rewrites %s to %s, the table says %s", p[0], seg[0].Text, p[1])
		}
	}
	for _, p := range pairs {
		for _, tmpl := range []string{"aud:" + p[0] + ":{partition}", "`{partition}" + p[0] + "`", `"{partition} ` + p[0] + `"`} {
			got, err := adaptTemplate(t, tmpl)
			if err == nil {
				t.Errorf("template %s adapted (as %q); want it refused", tmpl, got)
				continue
			}
			msg := err.Error()
			if !strings.Contains(msg, "audience template: "+p[1]+" cannot be carried through a Caddyfile") ||
				!strings.Contains(msg, "JSON config") || !strings.Contains(msg, "Caddyfile:4") {
				t.Errorf("template %s: error %q", tmpl, msg)
			}
		}
	}
}
