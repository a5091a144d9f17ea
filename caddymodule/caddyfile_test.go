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
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
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
// files (input, a line of dashes, expected JSON). -update rewrites them.
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

// TestTemplateSurvivesAdapt: the audience template reaches the handler
// unchanged; Caddyfile shorthands ({host}, {query.x}) are not applied.
func TestTemplateSurvivesAdapt(t *testing.T) {
	templates := []string{"aud:{partition}", "{partition}@{host}", "t/{query.x}/{partition}", "{partition}{header.X-Y}{labels.1}"}
	// Every shorthand Caddy v2.11 rewrites must come back unchanged.
	for _, sh := range []string{"{host}", "{hostport}", "{port}", "{orig_method}", "{orig_uri}", "{orig_path}", "{orig_dir}",
		"{orig_file}", "{orig_query}", "{orig_?query}", "{method}", "{uri}", "{%uri}", "{path}", "{%path}", "{dir}", "{file}",
		"{query}", "{%query}", "{?query}", "{remote}", "{remote_host}", "{remote_port}", "{scheme}", "{uuid}", "{tls_cipher}",
		"{tls_version}", "{tls_client_fingerprint}", "{tls_client_issuer}", "{tls_client_serial}", "{tls_client_subject}",
		"{tls_client_certificate_pem}", "{tls_client_certificate_der_base64}", "{upstream_hostport}", "{client_ip}",
		"{header.a}", "{cookie.b}", "{labels.0}", "{path.x}", "{file.y}", "{query.z}", "{re.n.1}", "{vars.v}", "{rp.a.b}",
		"{resp.c}", "{err.d}", "{file_match.e}", "{env.HOME}"} {
		templates = append(templates, "{partition}/"+sh)
	}
	for _, tmpl := range templates {
		in := ":8080 {\n\tsyncular_segments {\n\t\tkey k\n\t\taudience template " + tmpl + "\n\t\tstore sqlite db\n\t}\n}\n"
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(in), nil)
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Apps struct {
				HTTP struct {
					Servers map[string]struct {
						Routes []struct {
							Handle []struct {
								Handler  string `json:"handler"`
								Audience *AudienceConfig
								Routes   []struct {
									Handle []json.RawMessage `json:"handle"`
								} `json:"routes"`
							} `json:"handle"`
						} `json:"routes"`
					} `json:"servers"`
				} `json:"http"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatal(err)
		}
		found := ""
		for _, s := range cfg.Apps.HTTP.Servers {
			for _, r := range s.Routes {
				for _, hd := range r.Handle {
					if hd.Handler == "syncular_segments" && hd.Audience != nil {
						found = hd.Audience.Template
					}
				}
			}
		}
		if found != tmpl {
			t.Fatalf("template %q arrived as %q:\n%s", tmpl, found, out)
		}
	}
}
