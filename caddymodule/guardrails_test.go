package caddymodule

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/syncular/caddy-syncular/internal/seed"
)

// guardDB is a gen-3 SQLite file as the seed writer leaves it.
func guardDB(t *testing.T) string {
	t.Helper()
	db := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	return db
}

// TestGuardrailRefusals: an audience key equal to a token key, and
// settings the chosen store or delivery ignores, fail provisioning with
// the setting named and no secret shown. Settings that do apply pass.
func TestGuardrailRefusals(t *testing.T) {
	db := guardDB(t)
	t.Setenv("GUARD_SEG_KEY", strongKey)
	t.Setenv("GUARD_AUD_KEY", strongKey2)
	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	hmacAud := func(k string) *AudienceConfig { return &AudienceConfig{Kind: "hmac_sha256", Key: k} }
	sqlite := &StoreConfig{Backend: backendSQLite, Path: db}
	// Nothing listens on port 1: a refusal must come before any probe.
	s3 := &StoreConfig{Backend: backendS3, S3: &S3Config{Bucket: "b", Region: "r", Endpoint: "http://127.0.0.1:1"}}
	yes, no := true, false
	off := func(max int64) *CacheConfig { return &CacheConfig{Disk: DiskOff, DiskMaxBytes: &max} }
	min := caddy.Duration(time.Minute)
	cases := []struct {
		name string
		h    Handler
		want string // "" passes
	}{
		{"audience key is key 1", Handler{Keys: []string{strongKey}, Audience: hmacAud(strongKey), Store: sqlite}, "audience hmac_sha256 key is the same as key 1"},
		{"audience key is key 2 through env", Handler{Keys: []string{strongKey2, "{env.GUARD_SEG_KEY}"}, Audience: hmacAud("{env.GUARD_SEG_KEY}"), Store: sqlite}, "same as key 2"},
		// The same bytes written two ways are the same key.
		{"audience key is key 1 as text and hex", Handler{Keys: []string{"guard-key-0123456789"}, Audience: hmacAud("hex:" + "67756172642d6b65792d30313233343536373839"), Store: sqlite}, "same as key 1"},
		{"separate audience key", Handler{Keys: []string{"{env.GUARD_SEG_KEY}"}, Audience: hmacAud("{env.GUARD_AUD_KEY}"), Store: sqlite}, ""},
		{"presign_ttl with sqlite", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: sqlite, PresignTTL: min}, "presign_ttl applies to delivery redirect only (delivery is serve"},
		{"presign_ttl with proxy", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: s3, Delivery: DeliveryProxy, PresignTTL: min}, "presign_ttl applies to delivery redirect only (delivery is proxy"},
		{"verify_store_on_start false with sqlite", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: sqlite, VerifyStoreOnStart: &no}, "verify_store_on_start applies to an s3 store only"},
		{"verify_store_on_start true with sqlite", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: sqlite, VerifyStoreOnStart: &yes}, "verify_store_on_start applies to an s3 store only"},
		{"disk_max_bytes with disk off", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: sqlite, Cache: off(1 << 30)}, "disk_max_bytes has no effect with disk off"},
		{"disk_max_bytes 0 with disk off", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: sqlite, Cache: off(0)}, ""},
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
			if strings.Contains(err.Error(), "unreachable") {
				t.Fatalf("the bucket was probed before the refusal: %v", err)
			}
			for _, s := range []string{strings.TrimPrefix(strongKey, "hex:"), strings.TrimPrefix(strongKey2, "hex:"), "guard-key-0123456789", "67756172"} {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("error shows a key: %v", err)
				}
			}
		})
	}
}

// TestConfigWarnings: each risky setting gives one warning line naming
// the setting and the fix, a clean config gives none, and no warning
// shows a secret.
func TestConfigWarnings(t *testing.T) {
	dir := t.TempDir()
	keyFile := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strongKey), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	private, groupRead, worldRead := keyFile("private", 0o600), keyFile("group", 0o640), keyFile("world", 0o644)
	t.Setenv("GUARD_SEG_KEY", strongKey)
	t.Setenv("GUARD_AUD_KEY", strongKey2)
	t.Setenv("GUARD_S3_SECRET", "guard-s3-secret-value")
	t.Setenv("GUARD_PREFIX", "edge")
	env := "{env.GUARD_SEG_KEY}"
	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	sqlite := &StoreConfig{Backend: backendSQLite, Path: "/nonexistent/sync.db"}
	s3 := func(prefix, secretKey string) *StoreConfig {
		return &StoreConfig{Backend: backendS3, S3: &S3Config{Bucket: "b", Prefix: prefix, AccessKeyID: "AKIDGUARD", SecretAccessKey: secretKey}}
	}
	dur := func(d time.Duration) *caddy.Duration { c := caddy.Duration(d); return &c }
	size := func(n int64) *int64 { return &n }
	cases := []struct {
		name string
		h    Handler
		want []string // one substring per expected warning, in order
	}{
		{"clean", Handler{Keys: []string{env, "{file." + private + "}"}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: "{env.GUARD_AUD_KEY}"}, Store: sqlite}, nil},
		{"clean s3", Handler{Keys: []string{env}, Audience: tmpl, Store: s3("{env.GUARD_PREFIX}/", "{env.GUARD_S3_SECRET}")}, nil},
		{"literal key", Handler{Keys: []string{env, strongKey2}, Audience: tmpl, Store: sqlite}, []string{"key 2 is written in the config"}},
		{"literal audience key", Handler{Keys: []string{env}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: strongKey2}, Store: sqlite}, []string{"audience hmac_sha256 key is written in the config"}},
		{"literal with escaped brace", Handler{Keys: []string{`guard-key-0123\{x\}`}, Audience: tmpl, Store: sqlite}, []string{"key 1 is written in the config"}},
		{"literal s3 secret", Handler{Keys: []string{env}, Audience: tmpl, Store: s3("", "guard-s3-secret-value")}, []string{"store s3 secret_access_key is written in the config"}},
		{"group-readable key file", Handler{Keys: []string{"{file." + groupRead + "}"}, Audience: tmpl, Store: sqlite}, []string{"key 1: file " + groupRead + " is accessible to group or others (mode 0640); chmod 600"}},
		{"world-readable audience key file", Handler{Keys: []string{env}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: "{file." + worldRead + "}"}, Store: sqlite}, []string{"audience hmac_sha256 key: file " + worldRead + " is accessible to group or others (mode 0644)"}},
		{"skew 10m is fine", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Skew: dur(10 * time.Minute)}, nil},
		{"skew 87600h", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Skew: dur(87600 * time.Hour)}, []string{"skew 87600h0m0s is above 10m0s"}},
		{"record_ttl 1m is fine", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Cache: &CacheConfig{RecordTTL: dur(time.Minute)}}, nil},
		{"record_ttl 876000h", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Cache: &CacheConfig{RecordTTL: dur(876000 * time.Hour)}}, []string{"cache record_ttl 876000h0m0s is above 1m0s"}},
		{"max_entry above max_bytes", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Cache: &CacheConfig{MaxBytes: size(1 << 20), MaxEntry: size(4 << 20)}}, []string{"cache max_entry 4.0 MiB is above max_bytes 1.0 MiB"}},
		{"max_entry above the default max_bytes", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Cache: &CacheConfig{MaxEntry: size(128 << 20)}}, []string{"max_entry 128 MiB is above max_bytes 64 MiB"}},
		{"max_entry with the bytes cache off", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Cache: &CacheConfig{MaxBytes: size(0), MaxEntry: size(1)}}, []string{"max_entry 1 B is above max_bytes 0 B"}},
		{"max_entry equal to max_bytes", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Cache: &CacheConfig{MaxBytes: size(1 << 20), MaxEntry: size(1 << 20)}}, nil},
		{"only max_bytes below the default max_entry", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, Cache: &CacheConfig{MaxBytes: size(1 << 20)}}, nil},
		{"s3 prefix without /", Handler{Keys: []string{env}, Audience: tmpl, Store: s3("syncular", "{env.GUARD_S3_SECRET}")}, []string{`store s3 prefix "syncular" does not end in "/"`}},
		{"s3 prefix from env without /", Handler{Keys: []string{env}, Audience: tmpl, Store: s3("{env.GUARD_PREFIX}", "{env.GUARD_S3_SECRET}")}, []string{`store s3 prefix "edge" does not end in "/"`}},
		{"store_queue_wait below store_timeout", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, StoreQueueWait: caddy.Duration(4 * time.Second)}, nil},
		{"store_queue_wait at store_timeout", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, StoreQueueWait: caddy.Duration(5 * time.Second)}, []string{"store_queue_wait 5s is not below store_timeout 5s"}},
		{"store_queue_wait with no cap", Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite, StoreQueueWait: caddy.Duration(time.Minute), StoreConcurrency: new(int)}, nil},
		{"everything at once", Handler{Keys: []string{strongKey}, Audience: tmpl, Store: sqlite, Skew: dur(time.Hour), Cache: &CacheConfig{RecordTTL: dur(time.Hour)}},
			[]string{"key 1 is written in the config", "skew 1h0m0s", "record_ttl 1h0m0s"}},
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
				if strings.ContainsAny(w, "\n\r") {
					t.Errorf("warning %d is more than one line: %q", i+1, w)
				}
				for _, s := range []string{strings.TrimPrefix(strongKey, "hex:"), strings.TrimPrefix(strongKey2, "hex:"), "guard-s3-secret-value", "guard-key-0123"} {
					if strings.Contains(w, s) {
						t.Errorf("warning %d shows a secret: %q", i+1, w)
					}
				}
			}
		})
	}
}
