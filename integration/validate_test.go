package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
)

// TestValidateGolden runs `caddy validate` and `caddy adapt` of the real
// binary on every Caddyfile in testdata/validate and compares the outcome
// with testdata/validate/validate.golden: "ok", or substrings the error
// output must contain (the file:line of Caddyfile errors, the clear
// message of a store that cannot be opened or reached).
func TestValidateGolden(t *testing.T) {
	bin := caddyBinary(t)
	src := filepath.Join("testdata", "validate")
	golden := readValidateGolden(t, filepath.Join(src, "validate.golden"))

	dir := t.TempDir()
	w, err := seed.Create(filepath.Join(dir, "sync.db"), 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := os.WriteFile(filepath.Join(dir, "garbage.db"), []byte(strings.Repeat("not a database. ", 64)), 0o644); err != nil {
		t.Fatal(err)
	}
	// Key files for {file.*} keys: one private, one others can read.
	fileKey := "hex:" + strings.Repeat("5a17c3e9", 8)
	for name, mode := range map[string]os.FileMode{"key-0600": 0o600, "key-0644": 0o644} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(fileKey), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	s3 := s3test.Start(t)
	s3.CreateBucket(t, "segs")
	closed := fmt.Sprint(freePort(t))
	vars := strings.NewReplacer("{{DIR}}", dir, "{{CLOSED}}", closed, "{{S3}}", s3.Endpoint)

	files, err := filepath.Glob(filepath.Join(src, "*.caddyfile"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Caddyfiles in %s: %v", src, err)
	}
	secrets := []string{"seg-key-current-0123", "seg-key-previous-4567", "audience-key-89ab", s3.SecretKey, strings.TrimPrefix(fileKey, "hex:")}
	env := append(os.Environ(),
		"SEG_KEY="+secrets[0], "SEG_KEY_OLD="+secrets[1], "AUD_KEY="+secrets[2],
		"S3_AK="+s3.AccessKey, "S3_SK="+s3.SecretKey, "S3_CLOSED_ENDPOINT=http://127.0.0.1:"+closed,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"), "HOME="+dir)

	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(vars.Replace(string(raw))), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, command := range []string{"validate", "adapt"} {
			key := name + " " + command
			want, ok := golden[key]
			if !ok {
				t.Errorf("%s: no %q line in validate.golden", name, command)
				continue
			}
			seen[key] = true
			t.Run(strings.TrimSuffix(name, ".caddyfile")+"/"+command, func(t *testing.T) {
				cmd := exec.Command(bin, command, "--config", name, "--adapter", "caddyfile")
				cmd.Dir, cmd.Env = dir, env
				out, err := cmd.CombinedOutput()
				msgs := logMessages(out)
				// "+secret": the output does hold a secret (the adapted JSON
				// of a {$VAR} key, which is why validate warns about it).
				leaks := slices.Contains(want, "+secret")
				leaked := false
				for _, s := range secrets {
					leaked = leaked || strings.Contains(string(out), s)
				}
				if leaked != leaks {
					t.Errorf("output contains a secret: %v, want %v", leaked, leaks)
				}
				want = slices.DeleteFunc(slices.Clone(want), func(w string) bool { return w == "+secret" })
				if want[0] == "ok" {
					if err != nil {
						t.Fatalf("want success, got %v:\n%s", err, msgs)
					}
					if command == "validate" && !strings.Contains(msgs, "Valid configuration") {
						t.Fatalf("no \"Valid configuration\":\n%s", msgs)
					}
					for _, w := range want[1:] { // e.g. a warning
						if not, ok := strings.CutPrefix(w, "!"); ok {
							if strings.Contains(msgs, not) {
								t.Errorf("output contains %q:\n%s", not, msgs)
							}
						} else if !strings.Contains(msgs, w) {
							t.Errorf("output lacks %q:\n%s", w, msgs)
						}
					}
					return
				}
				if err == nil {
					t.Fatalf("want failure with %q, got success:\n%s", want, msgs)
				}
				for _, w := range want {
					if not, ok := strings.CutPrefix(w, "!"); ok {
						if strings.Contains(msgs, not) {
							t.Errorf("output contains %q:\n%s", not, msgs)
						}
					} else if !strings.Contains(msgs, w) {
						t.Errorf("output lacks %q:\n%s", w, msgs)
					}
				}
			})
		}
	}
	// Validating a config with a disk tier checked its directory without
	// creating it (disk_validate_creates_nothing.caddyfile).
	if _, err := os.Stat(filepath.Join(dir, "newdisk")); !os.IsNotExist(err) {
		t.Errorf("caddy validate created the disk tier's directory: %v", err)
	}
	var stale []string
	for k := range golden {
		if !seen[k] {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Errorf("validate.golden names cases without a Caddyfile: %v", stale)
	}
}

// readValidateGolden reads "<file> <command> <expectation>" lines (tab
// or space separated; the expectation is the rest of the line). Several
// lines for one file and command are all required.
func readValidateGolden(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			t.Fatalf("validate.golden: bad line %q", line)
		}
		rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(line, fields[0])), fields[1]))
		key := fields[0] + " " + fields[1]
		out[key] = append(out[key], rest)
	}
	if len(out) == 0 {
		t.Fatal("validate.golden is empty")
	}
	return out
}

// logMessages turns Caddy's JSON log lines into their messages (with
// quotes unescaped); other lines are kept as they are.
func logMessages(out []byte) string {
	var b strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		var e struct {
			Msg string `json:"msg"`
		}
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &e) == nil {
			line = e.Msg
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestReloadRejectsUnreachableBucket: with verify_store_on_start (the
// default) a reload to a config whose bucket does not exist is refused
// and the running config keeps serving; with verify_store_on_start false
// the same config loads (and the store faults are 503s).
func TestReloadRejectsUnreachableBucket(t *testing.T) {
	s3 := s3test.Start(t)
	s3.CreateBucket(t, "segs")
	site := func(bucket, extra string) string {
		return `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store_timeout 2s
		` + extra + `
		store s3 {
			bucket ` + bucket + `
			region us-east-1
			endpoint ` + s3.Endpoint + `
			access_key_id {env.S3_AK}
			secret_access_key {env.S3_SK}
		}
		delivery proxy
	}
	respond "alive"
}
`
	}
	c := startCaddy(t, site("segs", ""), "SEG_KEY="+randKey(t), "S3_AK="+s3.AccessKey, "S3_SK="+s3.SecretKey)
	err := c.Reload(site("no-such-bucket", ""))
	if err == nil || !strings.Contains(err.Error(), "bucket not found (check bucket, endpoint and region) at start") {
		t.Fatalf("reload to a missing bucket: %v", err)
	}
	seg := "/segments/sha256:" + strings.Repeat("0", 64) + "?st=x.y"
	if r := do(t, "GET", c.Base+seg, nil); r.Status != 403 {
		t.Fatalf("old config not serving after the refused reload: %d %s", r.Status, r.Body)
	}
	cfg := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/config/", c.AdminPort), nil)
	if !strings.Contains(string(cfg.Body), `"bucket":"segs"`) || strings.Contains(string(cfg.Body), "no-such-bucket") {
		t.Fatalf("running config after the refused reload:\n%s", cfg.Body)
	}
	if err := c.Reload(site("no-such-bucket", "verify_store_on_start false")); err != nil {
		t.Fatalf("reload with verify_store_on_start false: %v", err)
	}
	if r := do(t, "GET", c.Base+"/", nil); r.Status != 200 || string(r.Body) != "alive" {
		t.Fatalf("after the warning-only reload: %d %s", r.Status, r.Body)
	}
	if !strings.Contains(c.Output(), "s3 store bucket not found (check bucket, endpoint and region) at start; serving anyway") {
		t.Errorf("no start-up warning in the log:\n%s", c.Output())
	}
}
