package integration

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// hostileStrings are strings a store's writer or a token's sender may
// choose, one per class of character a terminal acts on.
func hostileStrings() map[string]string {
	var c1, raw8 string
	for r := rune(0x80); r <= 0x9f; r++ {
		c1 += string(r)
		raw8 += string([]byte{byte(r)}) // 0x9b is CSI on an 8-bit terminal
	}
	return map[string]string{
		"osc":     "p\x1b]0;owned\x07\x1b[2Jq",
		"c1":      "c1-" + c1,
		"raw8bit": "raw-" + raw8,
		"bidi":    "b\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061cz",
		"invalid": "inv\xff\xfe\xc0\xaf",
	}
}

// terminalSafe fails when out holds a raw control, format character or
// invalid UTF-8 (newlines aside).
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("%s: output is not valid UTF-8:\n%q", what, out)
	}
	for _, r := range out {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Fatalf("%s: output holds %U raw:\n%q", what, r, out)
		}
	}
}

// TestInspectToolsEscape runs both inspect commands of the real binary on
// a store and tokens holding each class of terminal-control text, and
// checks that none of it reaches the output raw while the values are
// still shown (Go-quoted). It then runs `syncular-token inspect` on URLs
// with a raw '#' and checks its verdict against the running edge's answer
// to the same request target.
func TestInspectToolsEscape(t *testing.T) {
	bin := caddyBinary(t)
	sd := token.ScopeDigest(map[string][]string{"project_id": {"escape"}})
	body := []byte("SSG2 escape segment")
	dbPath := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(dbPath, 3)
	if err != nil {
		t.Fatal(err)
	}
	nowMs := time.Now().UnixMilli()
	pub := func(partition, table, digest string) store.Publication {
		return store.Publication{Partition: partition, LogEpoch: "e1", Table: table, SchemaVersion: 1, MediaType: "rows",
			ScopeDigest: digest, RowCount: 1, CreatedAtMs: nowMs, ExpiresAtMs: nowMs + 3600_000}
	}
	id, err := w.Put(seed.SegmentInput{Bytes: body, Publication: pub("tenant-ok", "tasks", sd)})
	if err != nil {
		t.Fatal(err)
	}
	hostile := hostileStrings()
	for name, s := range hostile {
		if err := w.AddPublication(id, "", pub(s, "tbl-"+s, name+s)); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()

	segKey, segRaw := exampleKey(t)
	audKey, audRaw := exampleKey(t)
	c := startCaddy(t, strings.Replace(inspectSite, "STORE_PATH", dbPath, 1), "SEG_KEY="+segKey, "AUD_KEY="+audKey)
	cfg := filepath.Join(c.dir, "Caddyfile")
	env := append(os.Environ(), "SEG_KEY="+segKey, "AUD_KEY="+audKey, "HOME="+t.TempDir())
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var o bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &o
		code := 0
		if err := cmd.Run(); err != nil {
			ee, ok := err.(*exec.ExitError)
			if !ok {
				t.Fatal(err)
			}
			code = ee.ExitCode()
		}
		return o.String(), code
	}

	// The store inspector: every publication listed, each value quoted.
	out, code := run("syncular-store", "inspect", "--config", cfg, id)
	terminalSafe(t, "syncular-store inspect", out)
	if code != 0 || !strings.Contains(out, "partition tenant-ok,") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for name, s := range hostile {
		for _, want := range []string{"partition " + strconv.Quote(s) + ",", "table " + strconv.Quote("tbl-"+s), "scope digest " + strconv.Quote(name+s)} {
			if !strings.Contains(out, want) {
				t.Errorf("store inspect lacks %s", want)
			}
		}
	}

	// The token inspector, on claims and a URL segment of each class.
	aud, _ := token.HMACAudience(audRaw, "hex")
	for name, s := range hostile {
		payload := `{"v":1,"seg":` + jsonString(s) + `,"sd":` + jsonString(s) + `,"aud":` + jsonString(s) + `,"exp":1}`
		if name != "osc" { // raw in the JSON text too (ESC and BEL would make it invalid JSON)
			payload = "{\"v\":1,\"seg\":\"" + s + "\",\"sd\":\"" + s + "\",\"aud\":\"" + s + "\",\"exp\":1}"
		}
		forged := base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".AAAA"
		signed := token.Sign(segRaw, id, s, s, time.Now().Add(time.Minute).Unix())
		// The forged token fails its MAC; the signed one may pass (its
		// aud is the --audience given): either way the claims are shown.
		for _, u := range []string{
			c.Base + "/sync/segments/" + url.PathEscape(s) + "?st=" + forged,
			c.Base + "/sync/segments/" + id + "?st=" + signed,
		} {
			out, code := run("syncular-token", "inspect", u, "--key", segKey, "--audience", s)
			terminalSafe(t, "syncular-token inspect ("+name+")", out)
			if !strings.Contains(out, "claims:    {") || (u[len(u)-5:] == ".AAAA" && code != 1) {
				t.Errorf("%s: exit %d, want the claims shown (and the forged token refused):\n%s", name, code, out)
			}
		}
	}

	// A raw '#' with an st: the tool's verdict is the edge's answer to
	// the same request target.
	good := token.Sign(segRaw, id, sd, aud.Derive("tenant-ok"), time.Now().Add(5*time.Minute).Unix())
	seg := "/sync/segments/" + id
	for _, target := range []string{
		seg + "?st=" + good + "#frag",
		seg + "?x=#&st=" + good,
		seg + "#?st=" + good,
		seg + "?x=%23&st=" + good, // an escaped '#' is data: granted
	} {
		status := rawTarget(t, c, target, "127.0.0.1")
		out, code := run("syncular-token", "inspect", c.Base+target, "--key", segKey)
		terminalSafe(t, "syncular-token inspect "+target, out)
		refusedForHash := strings.Contains(out, "verdict:   refuse: segment token rejected: '#' in a signed URL")
		switch {
		case status == 403 && (!refusedForHash || code != 1):
			t.Errorf("%s: the edge answers 403; the tool (exit %d) says:\n%s", target, code, out)
		case status == 200 && (refusedForHash || code != 0 || !strings.Contains(out, "verdict:   accept")):
			t.Errorf("%s: the edge answers 200; the tool (exit %d) says:\n%s", target, code, out)
		case status != 200 && status != 403:
			t.Errorf("%s: the edge answers %d", target, status)
		}
		if strings.Contains(target, "#") != (status == 403) {
			t.Errorf("%s: edge status %d", target, status)
		}
	}
}

// jsonString is s as a JSON string with every control escaped.
func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r < 0x20 || r == '"' || r == '\\' {
			b.WriteString(`\u00`)
			b.WriteString(strconv.FormatInt(int64(r)>>4, 16))
			b.WriteString(strconv.FormatInt(int64(r)&15, 16))
			continue
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}
