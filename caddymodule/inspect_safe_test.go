package caddymodule

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// runTokenInspect runs `syncular-token inspect` in process.
func runTokenInspect(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c := inspectCommand()
	var out bytes.Buffer
	c.SetOut(&out)
	c.SetErr(&out)
	c.SetArgs(args)
	err := c.ExecuteContext(context.Background())
	return out.String(), err
}

// TestTokenInspectHashRuleIsTheEdges: for every target, `syncular-token
// inspect` refuses for a raw '#' exactly when the handler does, and with
// the handler's reason: both call hashHidesTokenIn.
func TestTokenInspectHashRuleIsTheEdges(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("x"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	tok := mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))
	seg := "/sync/segments/" + id
	refused := 0
	for _, target := range []string{
		seg + "?x=#&st=" + tok,
		seg + "?st=" + tok + "&x=#",
		seg + "?st=" + tok + "#",
		seg + "?st=" + tok + "#frag",
		seg + "?#st=" + tok,
		seg + "?x#st=" + tok,
		seg + "?x=1&#&%73t=" + tok,
		seg + "#?st=" + tok,
		seg + "#x?y=1&st=" + tok,
		"http://edge.example" + seg + "?x=#&st=" + tok,
		// Not refused for a '#': escaped, or no '#' at all.
		seg + "?x=%23&st=" + tok,
		seg + "?st=" + tok,
		"http://edge.example" + seg + "?st=" + tok,
	} {
		rec, repl := serve(t, h, "GET", target, nil)
		reason, _ := repl.GetString("http.syncular.reason")
		edge := reason == reasonHashInURL
		if edge && rec.Code != 403 {
			t.Fatalf("%s: the edge's '#' refusal answered %d", target, rec.Code)
		}
		out, err := runTokenInspect(t, target, "--key", string(testKey), "--now", testNow.Format(time.RFC3339))
		tool := err != nil && strings.Contains(out, "verdict:   refuse: "+reasonHashInURL) && strings.Contains(err.Error(), reasonHashInURL)
		if tool != edge {
			t.Errorf("%s: the edge refuses it for '#': %v, the tool says so: %v\n%s%v", target, edge, tool, out, err)
		}
		if edge {
			refused++
			if strings.Contains(out, tok) || strings.Contains(out, "accept") {
				t.Errorf("%s: the tool printed the token or a verdict past the refusal:\n%s", target, out)
			}
		}
	}
	if refused != 10 {
		t.Fatalf("%d targets refused for '#', want 10", refused)
	}
}

// TestTokenInspectEscapesOutput: the claims and the URL's segment reach
// the output escaped, whatever they hold, and it still shows them.
func TestTokenInspectEscapesOutput(t *testing.T) {
	// Raw in the JSON: C1, bidi and invalid UTF-8 (valid inside JSON
	// strings, or replaced when decoded); ESC and BEL as JSON escapes
	// (raw, the payload would not be JSON).
	payload := "{\"v\":{\"\u202e\":\"\u0085\"},\"seg\":\"sha256:\\u001b]0;t\\u0007\\u001b[2J\",\"sd\":\"\u2066\u200f\u061c\xff\"," +
		"\"aud\":\"\u009b2J\u202a\u202b\u202c\u202d\u2067\u2068\u2069\u200e\",\"exp\":1}"
	tok := base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".AAAA"
	target := "https://edge.example/sync/segments/" + url.PathEscape("\x1b]0;title\x07\x1b[2J\u202e\x9b") + "?st=" + tok
	for _, args := range [][]string{{target}, {tok}, {target, "--key", string(testKey), "--audience", "\x1b[2J", "--scope-digest", "\u202e"}} {
		out, err := runTokenInspect(t, args...)
		all := out
		if err != nil {
			all += err.Error()
		}
		if !utf8.ValidString(all) {
			t.Fatalf("output is not valid UTF-8: %q", all)
		}
		for _, r := range all {
			if r != '\n' && !unicode.IsPrint(r) {
				t.Fatalf("output holds %U raw:\n%q", r, all)
			}
		}
		for _, want := range []string{`\u202e`, `\u0085`, `\u2066`} {
			if !strings.Contains(out, want) {
				t.Errorf("claims line lacks the escape %s:\n%s", want, out)
			}
		}
	}
}
