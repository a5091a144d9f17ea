package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/token"
)

const toolSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /sync/segments/* {
		key {env.SEG_KEY} {env.SEG_KEY_OLD}
		audience hmac_sha256 {env.AUD_KEY}
		store sqlite STORE_PATH
	}
	respond 404
}
`

// TestTokenTool runs `caddy syncular-token mint` of the real binary, has
// the real edge serve the minted URL, and runs `inspect` on it with the
// right keys, the wrong key, a later clock and another segment.
func TestTokenTool(t *testing.T) {
	bin := caddyBinary(t)
	body := []byte("SSG2 token tool segment")
	sd := token.ScopeDigest(map[string][]string{"project_id": {"tool"}})
	dbPath, id := seedOne(t, "tool-partition-1", sd, body)
	keyNew, keyOld, audKey := "tool-key-new-a81f", "tool-key-old-3c07", "tool-aud-key-e6d2"
	c := startCaddy(t, strings.Replace(toolSite, "STORE_PATH", dbPath, 1), "SEG_KEY="+keyNew, "SEG_KEY_OLD="+keyOld, "AUD_KEY="+audKey)
	secrets := []string{keyNew, keyOld, audKey, "tool-partition-1"}

	env := append(os.Environ(), "T_NEW="+keyNew, "T_OLD="+keyOld, "T_AUD="+audKey, "HOME="+t.TempDir(),
		"SEG_KEY="+keyNew, "SEG_KEY_OLD="+keyOld, "AUD_KEY="+audKey)
	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"syncular-token"}, args...)...)
		cmd.Env = env
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets[:3] {
			if strings.Contains(o.String()+e.String(), s) {
				t.Errorf("syncular-token %s printed a key", args[0])
			}
		}
		return o.String(), e.String(), code
	}

	// Mint with the old key (slot 2 at the edge) and the keyed audience.
	out, errOut, code := run("mint", "--key", "env:T_OLD", "--segment", id, "--scope-digest", sd,
		"--partition", "tool-partition-1", "--audience-hmac-key", "{env.T_AUD}", "--ttl", "120s",
		"--base-url", c.Base+"/sync/segments/")
	if code != 0 {
		t.Fatalf("mint exited %d: %s%s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], c.Base+"/sync/segments/"+id+"?st=") || !strings.HasSuffix(lines[1], "?st="+lines[0]) {
		t.Fatalf("mint output is not token and URL:\n%s", out)
	}
	if strings.Contains(out, "tool-partition-1") {
		t.Fatal("mint printed the partition id")
	}
	tok, url := lines[0], lines[1]
	if !strings.Contains(errOut, "expires ") {
		t.Errorf("mint stderr lacks the expiry: %q", errOut)
	}

	// The edge serves it.
	r := do(t, "GET", url, nil)
	if r.Status != 200 || !bytes.Equal(r.Body, body) {
		t.Fatalf("edge answered the minted URL %d %s", r.Status, r.Body)
	}

	audP1, _ := token.HMACAudience([]byte(audKey), "hex")
	aud := audP1.Derive("tool-partition-1")
	out, errOut, code = run("inspect", url, "--key", "env:T_NEW", "--key", "env:T_OLD", "--audience", aud, "--scope-digest", sd)
	if code != 0 || !strings.Contains(out, "mac:       verified by key 2") || !strings.Contains(out, "verdict:   accept") || !strings.Contains(out, `"aud":"`+aud+`"`) {
		t.Fatalf("inspect with both keys: exit %d\n%s%s", code, out, errOut)
	}

	// Only the new key: the edge would refuse with bad MAC.
	out, errOut, code = run("inspect", url, "--key", "env:T_NEW")
	if code == 0 || !strings.Contains(out, "refuse: segment token rejected: bad MAC") || !strings.Contains(errOut, "bad MAC") {
		t.Fatalf("inspect with the new key only: exit %d\n%s%s", code, out, errOut)
	}

	// 61 s after exp (skew 60 s): expired by 1 s.
	expSec := mustExp(t, tok)
	later := strconv.FormatInt((expSec+61)*1000, 10)
	out, errOut, code = run("inspect", url, "--key", "env:T_OLD", "--now", later)
	if code == 0 || !strings.Contains(out, "token expired") || !strings.Contains(out, "expired 1s ago") || !strings.Contains(out, "verified by key 1") {
		t.Fatalf("inspect later: exit %d\n%s%s", code, out, errOut)
	}

	// The bare token presented for another segment.
	other := "sha256:" + strings.Repeat("0", 64)
	out, _, code = run("inspect", tok, "--key", "env:T_OLD", "--segment", other)
	if code == 0 || !strings.Contains(out, "segment mismatch") || !strings.Contains(out, other) {
		t.Fatalf("inspect other segment: exit %d\n%s", code, out)
	}
	// Another audience.
	out, _, code = run("inspect", url, "--key", "env:T_OLD", "--audience", audP1.Derive("tool-partition-2"))
	if code == 0 || !strings.Contains(out, "audience mismatch") {
		t.Fatalf("inspect other audience: exit %d\n%s", code, out)
	}
	// No key: claims decoded, MAC unchecked.
	out, _, code = run("inspect", url)
	if code != 0 || !strings.Contains(out, "mac:       unchecked") || !strings.Contains(out, `"seg":"`+id+`"`) {
		t.Fatalf("inspect without key: exit %d\n%s", code, out)
	}

	// Keys, skew and the audience rule from the edge's own Caddyfile.
	cfgPath := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(c.render(strings.Replace(toolSite, "STORE_PATH", dbPath, 1))), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = run("inspect", url, "--config", cfgPath, "--partition", "tool-partition-1")
	if code != 0 || !strings.Contains(out, "verified by key 2") || !strings.Contains(out, "audience:  "+aud) {
		t.Fatalf("inspect --config: exit %d\n%s%s", code, out, errOut)
	}
	out, _, code = run("inspect", url, "--config", cfgPath, "--partition", "tool-partition-2")
	if code == 0 || !strings.Contains(out, "audience mismatch") {
		t.Fatalf("inspect --config, other partition: exit %d\n%s", code, out)
	}

	// Template and literal audiences; mistakes are named, secrets never.
	out, _, code = run("mint", "--key", "hex:"+strings.Repeat("ab", 16), "--segment", id, "--scope-digest", sd, "--partition", "p9", "--audience-template", "aud:{partition}")
	if code != 0 || !strings.Contains(out, "http://127.0.0.1:8080/sync/segments/"+id+"?st=") {
		t.Fatalf("mint with template: exit %d\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mint", "--key", "env:T_UNSET_VARIABLE", "--segment", id, "--scope-digest", sd, "--audience", "a"}, "environment variable T_UNSET_VARIABLE is unset or empty"},
		{[]string{"mint", "--key", "env:T_NEW", "--segment", id, "--scope-digest", sd}, "an audience is required"},
		{[]string{"mint", "--key", "env:T_NEW", "--segment", "sha256:nothex", "--scope-digest", sd, "--audience", "a"}, "--segment must be sha256:"},
		{[]string{"mint", "--key", "env:T_NEW", "--segment", id, "--scope-digest", sd, "--partition", "p", "--audience-template", "x"}, "must contain {partition}"},
		{[]string{"inspect", url, "--key", "hex:zz"}, `"hex:" prefix is not valid hex`},
		// mint refuses the keys the edge refuses at provision.
		{[]string{"mint", "--key", "hex:00", "--segment", id, "--scope-digest", sd, "--audience", "a"}, "--key is too short: at least 16 bytes"},
		{[]string{"mint", "--key", "hex:" + strings.Repeat("00", 32), "--segment", id, "--scope-digest", sd, "--audience", "a"}, "--key is all zero bytes"},
		{[]string{"mint", "--key", "env:T_NEW", "--segment", id, "--scope-digest", sd, "--partition", "p", "--audience-hmac-key", "z"}, "--audience-hmac-key is too short"},
	} {
		_, errOut, code := run(tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
	// inspect diagnoses a token made with a weak key (it grants nothing),
	// and says the edge would refuse that key.
	weak := token.Sign([]byte("a"), id, sd, "a", time.Now().Unix()+60)
	out, errOut, code = run("inspect", weak, "--key", "a", "--segment", id)
	if code != 0 || !strings.Contains(out, "verified by key 1") || !strings.Contains(errOut, "the edge refuses such a key") {
		t.Errorf("inspect with a weak key: exit %d\n%s%s", code, out, errOut)
	}
}

// mustExp reads the exp claim of a token.
func mustExp(t *testing.T, tok string) int64 {
	t.Helper()
	r := token.Inspect(tok, token.InspectOptions{})
	if !r.HasExp {
		t.Fatalf("token has no exp")
	}
	return int64(r.Exp)
}
