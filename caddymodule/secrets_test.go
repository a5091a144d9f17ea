package caddymodule

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// secretNameRe marks a config field as a secret by its JSON name: a key
// (keys, key, tenant_key, private_key), a secret, a password, a token that
// is a credential (session_token; max_token_length is a size).
var secretNameRe = regexp.MustCompile(`^(keys?|.*_key|.*secret.*|.*password.*|.*passphrase.*|.*private.*|.*credential.*|.*_token)$`)

// configFields walks t's exported JSON fields, recursing into this
// package's structs (through pointers and slices), and calls f with each
// field's dot-separated JSON path and its struct field.
func configFields(t reflect.Type, prefix string, f func(path string, sf reflect.StructField)) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeOf(Handler{}).PkgPath() {
		return
	}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if !sf.IsExported() || name == "" || name == "-" {
			continue
		}
		f(prefix+name, sf)
		configFields(sf.Type, prefix+name+".", f)
	}
}

// TestSecretSettingsListed: every field of the handler's config whose
// name marks a secret is in secretSettings (so it gets the guardrails),
// and every listed path is such a field whose value the list reads.
func TestSecretSettingsListed(t *testing.T) {
	listed := map[string]secretSetting{}
	for _, s := range secretSettings {
		listed[s.path] = s
	}
	fields := map[string]bool{}
	configFields(reflect.TypeOf(Handler{}), "", func(path string, sf reflect.StructField) {
		fields[path] = true
		last := path[strings.LastIndex(path, ".")+1:]
		if secretNameRe.MatchString(last) {
			if _, ok := listed[path]; !ok {
				t.Errorf("%s (%s) looks like a secret but is not in secretSettings (secrets.go): add it, so it gets the secret guardrails", path, sf.Name)
			}
		}
	})
	// The walk must see what it is meant to see.
	for _, p := range []string{"keys", "tenant_key", "store.s3.secret_access_key", "cdn.cloudfront.private_key", "max_token_length"} {
		if !fields[p] {
			t.Fatalf("the walk missed %s: %v", p, fields)
		}
	}
	for _, s := range secretSettings {
		if !fields[s.path] {
			t.Errorf("secretSettings lists %s, which is not a config field", s.path)
			continue
		}
		// Set the field by reflection: the list must read that field.
		var h Handler
		setPath(t, reflect.ValueOf(&h).Elem(), strings.Split(s.path, "."), "{env.SECRET_PROBE}")
		got := s.values(&h)
		if len(got) != 1 || got[0].raw != "{env.SECRET_PROBE}" || got[0].what == "" {
			t.Errorf("secretSettings %s reads %+v from a handler with only that field set", s.path, got)
		}
	}
}

// setPath sets the string (or first element of the []string) at the JSON
// path under v, allocating the structs on the way.
func setPath(t *testing.T, v reflect.Value, path []string, val string) {
	t.Helper()
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		v = v.Elem()
	}
	for i := 0; i < v.NumField(); i++ {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		if name != path[0] {
			continue
		}
		fv := v.Field(i)
		if len(path) > 1 {
			setPath(t, fv, path[1:], val)
			return
		}
		switch fv.Kind() {
		case reflect.String:
			fv.SetString(val)
		case reflect.Slice:
			fv.Set(reflect.ValueOf([]string{val}))
		default:
			t.Fatalf("%s is a %v", name, fv.Kind())
		}
		return
	}
	t.Fatalf("no field %s in %v", path[0], v.Type())
}

// TestSecretGuardrailsEverySetting: the secrets that had no guardrails
// before (tenant_key, session_token, the CloudFront private_key file) warn
// like key does, and name the setting, never the value.
func TestSecretGuardrailsEverySetting(t *testing.T) {
	dir := t.TempDir()
	keyFile := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strongKey2), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	private, world, group := keyFile("private", 0o600), keyFile("world", 0o644), keyFile("group", 0o640)
	t.Setenv("GUARD_SEG_KEY", strongKey)
	env := "{env.GUARD_SEG_KEY}"
	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	sqlite := &StoreConfig{Backend: backendSQLite, Path: "/nonexistent/sync.db"}
	s3 := func(token string) *StoreConfig {
		return &StoreConfig{Backend: backendS3, S3: &S3Config{Bucket: "b", AccessKeyID: "AKIDGUARD", SecretAccessKey: env, SessionToken: token}}
	}
	cdn := func(pk string) *CDNConfig {
		return &CDNConfig{CloudFront: &CloudFrontConfig{Domain: "d111111abcdef8.cloudfront.net", KeyPairID: "K2JCJMDEHXQW5F", PrivateKey: pk}}
	}
	cases := []struct {
		name string
		h    Handler
		want []string
	}{
		{"tenant_key from a private file", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, TenantKey: "{file." + private + "}"}, nil},
		{"tenant_key from env", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, TenantKey: env}, nil},
		{"literal tenant_key", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, TenantKey: strongKey2}, []string{"tenant_key is written in the config"}},
		{"world-readable tenant_key file", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, TenantKey: "{file." + world + "}"},
			[]string{"tenant_key: file " + world + " is accessible to group or others (mode 0644)"}},
		{"literal session_token", Handler{Keys: []string{env}, Audience: tmpl, Store: s3("guard-session-token")}, []string{"store s3 session_token is written in the config"}},
		{"cloudfront private_key from a private file", Handler{Keys: []string{env}, Audience: tmpl, Store: s3(""), CDN: cdn("{file." + private + "}")}, nil},
		{"group-readable cloudfront private_key", Handler{Keys: []string{env}, Audience: tmpl, Store: s3(""), CDN: cdn("{file." + group + "}")},
			[]string{"cdn cloudfront private_key: file " + group + " is accessible to group or others (mode 0640)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.h
			if err := h.setDefaults(); err != nil {
				t.Fatal(err)
			}
			got := h.configWarnings(caddy.NewReplacer())
			if len(got) != len(c.want) {
				t.Fatalf("%d warnings, want %d:\n%s", len(got), len(c.want), strings.Join(got, "\n"))
			}
			for i, w := range got {
				if !strings.Contains(w, c.want[i]) {
					t.Errorf("warning %d is %q, want it to contain %q", i+1, w, c.want[i])
				}
				for _, s := range []string{strings.TrimPrefix(strongKey, "hex:"), strings.TrimPrefix(strongKey2, "hex:"), "guard-session-token"} {
					if strings.Contains(w, s) {
						t.Errorf("warning %d shows a secret: %q", i+1, w)
					}
				}
			}
		})
	}
}

// TestTenantKeyRefusedWhenTokenKey: tenant_key equal to a token key (as
// written or through env, in another encoding) fails provisioning, as an
// audience key equal to a token key does; a separate key passes.
func TestTenantKeyRefusedWhenTokenKey(t *testing.T) {
	db := guardDB(t)
	t.Setenv("GUARD_SEG_KEY", strongKey)
	t.Setenv("GUARD_TENANT_KEY", strongKey2)
	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	sqlite := &StoreConfig{Backend: backendSQLite, Path: db}
	cases := []struct {
		name string
		h    Handler
		want string
	}{
		{"tenant_key is key 1", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: sqlite, TenantKey: strongKey}, "tenant_key is the same as key 1"},
		{"tenant_key is key 2 through env", Handler{Keys: []string{strongKey2, "{env.GUARD_SEG_KEY}"}, Audience: tmpl, Store: sqlite, TenantKey: "{env.GUARD_SEG_KEY}"}, "tenant_key is the same as key 2"},
		{"tenant_key is key 1 as text and hex", Handler{Keys: []string{"guard-key-0123456789"}, Audience: tmpl, Store: sqlite, TenantKey: "hex:67756172642d6b65792d30313233343536373839"}, "tenant_key is the same as key 1"},
		{"separate tenant_key", Handler{Keys: []string{"{env.GUARD_SEG_KEY}"}, Audience: tmpl, Store: sqlite, TenantKey: "{env.GUARD_TENANT_KEY}"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.h
			err := provision(t, &h)
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			for _, s := range []string{strings.TrimPrefix(strongKey, "hex:"), strings.TrimPrefix(strongKey2, "hex:"), "guard-key-0123456789", "67756172"} {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("error shows a key: %v", err)
				}
			}
		})
	}
}
