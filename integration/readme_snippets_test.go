package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// A config in the docs that stops working fails this test. Every fenced
// ```caddyfile and ```json block of README.md and of every docs/**/*.md
// file, and every config file under examples/ (Caddyfile, *.Caddyfile,
// *.json), goes through the real binary's `caddy validate` (adapt +
// provision: keys, stores, modules).
//
// What the test supplies, as an operator would:
//   - every {env.NAME} and {$NAME} it names, from the environment:
//     keys get 32 random bytes (hex:…), S3 credentials and endpoints those
//     of a versitygw on loopback; {$NAME:default} is left to its default.
//     Variables ending in _PREVIOUS or _NEXT stay unset: they exist only
//     during a key rotation, so a first-deployment snippet naming one
//     fails when pasted (`key 2 is empty`), and so fails here.
//   - the CloudFront private key file /etc/caddy/cloudfront-private-key.pem
//     is a generated RSA 2048 key, and every S3 `region` is the
//     versitygw's.
//   - the stores: /var/lib/syncular/sync.db is a freshly seeded SQLite
//     file, bucket syncular-segments exists, and every `endpoint` (an R2
//     account URL in the docs) points at the versitygw; /var/log/caddy
//     is a temp directory.
//
// Blocks that are not configs on their own are handled so:
//   - a Caddyfile block that starts with a directive (syncular_segments …)
//     is wrapped in a site block; a JSON block with a top-level "handler"
//     is wrapped in a one-route server.
//   - a block preceded by the line `<!-- snippet: fragment -->` is skipped
//     on purpose (the syntax summary with <placeholders>, a lone `cache`
//     block); the test logs each one it skips.

const fragmentMarker = "<!-- snippet: fragment -->"

type docSnippet struct {
	where, lang, text string
}

// readmeSnippets returns the fenced caddyfile/json blocks of a Markdown
// file and the places of those skipped by the fragment marker. Each is
// named by the file's path relative to the module root and its line.
func readmeSnippets(t *testing.T, path string) (out []docSnippet, skipped []string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "```")
		if !ok || lang == "" {
			continue
		}
		start := i
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, lines[i])
		}
		if lang != "caddyfile" && lang != "json" {
			continue
		}
		rel, err := filepath.Rel(repoRoot(t), path)
		if err != nil {
			rel = filepath.Base(path)
		}
		where := fmt.Sprintf("%s:%d", rel, start+1)
		prev := ""
		for j := start - 1; j >= 0; j-- {
			if strings.TrimSpace(lines[j]) != "" {
				prev = strings.TrimSpace(lines[j])
				break
			}
		}
		if prev == fragmentMarker {
			skipped = append(skipped, where)
			continue
		}
		out = append(out, docSnippet{where, lang, strings.Join(body, "\n") + "\n"})
	}
	return out, skipped
}

// docsMarkdown is every Markdown file under docs/, at any depth (the
// pages and any subfolder).
func docsMarkdown(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(repoRoot(t), "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func exampleConfigs(t *testing.T) []docSnippet {
	t.Helper()
	var out []docSnippet
	root := repoRoot(t)
	add := func(p, lang string) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, docSnippet{rel, lang, string(b)})
	}
	add(filepath.Join(root, "Caddyfile.example"), "caddyfile")
	err := filepath.WalkDir(filepath.Join(root, "examples"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "monitoring" { // Prometheus and Grafana files: TestMonitoringOnPrometheus
				return filepath.SkipDir
			}
			return nil
		}
		switch name := d.Name(); {
		case name == "Caddyfile" || strings.HasSuffix(name, ".Caddyfile"):
			add(p, "caddyfile")
		case strings.HasSuffix(name, ".json"):
			add(p, "json")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	envPlaceholder   = regexp.MustCompile(`\{env\.([A-Za-z0-9_]+)\}`)
	adaptPlaceholder = regexp.MustCompile(`\{\$([A-Za-z0-9_]+)\}`)
	caddyEndpoint    = regexp.MustCompile(`(?m)^(\s*endpoint)\s+\S+\s*$`)
	jsonEndpoint     = regexp.MustCompile(`"endpoint":\s*"[^"]*"`)
)

// snippetEnv gives every variable the text names a working value.
func snippetEnv(t *testing.T, text string, srv *s3test.Server) []string {
	var env []string
	seen := map[string]bool{}
	names := envPlaceholder.FindAllStringSubmatch(text, -1)
	names = append(names, adaptPlaceholder.FindAllStringSubmatch(text, -1)...)
	for _, m := range names {
		name := m[1]
		if seen[name] {
			continue
		}
		seen[name] = true
		if strings.HasSuffix(name, "_PREVIOUS") || strings.HasSuffix(name, "_NEXT") {
			continue
		}
		var v string
		switch {
		case strings.Contains(name, "ACCESS_KEY_ID"):
			v = srv.AccessKey
		case strings.Contains(name, "SECRET_ACCESS_KEY"):
			v = srv.SecretKey
		case strings.HasSuffix(name, "ENDPOINT"):
			v = srv.Endpoint
		case strings.HasSuffix(name, "KEY") || strings.Contains(name, "_KEY_"):
			v, _ = exampleKey(t)
		default:
			v = "snippet-test"
		}
		env = append(env, name+"="+v)
	}
	return env
}

// TestReadmeSnippets validates every config in README.md, docs/ and
// examples/.
func TestReadmeSnippets(t *testing.T) {
	bin := caddyBinary(t)
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "syncular-segments")
	dir := t.TempDir()
	db, _ := seedOne(t, "p1", token.ScopeDigest(map[string][]string{"user_id": {"docs"}}), []byte("SSG2 docs"))
	logDir := filepath.Join(dir, "log")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}

	snips, skipped := readmeSnippets(t, filepath.Join(repoRoot(t), "README.md"))
	for _, s := range skipped {
		t.Logf("skipped on purpose (%s): %s", fragmentMarker, s)
	}
	if len(snips) < 3 {
		t.Fatalf("README.md has only %d config blocks: the extraction is broken", len(snips))
	}
	pages := docsMarkdown(t)
	var fromDocs int
	for _, p := range pages {
		s, sk := readmeSnippets(t, p)
		for _, w := range sk {
			t.Logf("skipped on purpose (%s): %s", fragmentMarker, w)
		}
		fromDocs += len(s)
		snips = append(snips, s...)
	}
	if len(pages) < 9 || fromDocs < 5 {
		t.Fatalf("docs/ has %d Markdown files with %d config blocks: the walk or the extraction is broken", len(pages), fromDocs)
	}
	snips = append(snips, exampleConfigs(t)...)
	_, _, cdnKey := cdnKeyPEM(t) // the CloudFront key file docs/cdn.md names
	for i, s := range snips {
		t.Run(s.where, func(t *testing.T) {
			text := strings.NewReplacer(
				"/var/lib/syncular/sync.db", db,
				"/var/log/caddy", logDir,
				"/etc/caddy/cloudfront-private-key.pem", cdnKey,
			).Replace(s.text)
			port := freePort(t)
			switch s.lang {
			case "caddyfile":
				text = caddyEndpoint.ReplaceAllString(text, "${1} "+srv.Endpoint)
				text = caddyRegion.ReplaceAllString(text, "${1} auto") // the versitygw's region
				if first := firstToken(text); first == "syncular_segments" {
					text = fmt.Sprintf("{\n\tadmin off\n}\n\n:%d {\n%s}\n", port, text)
				}
			case "json":
				text = jsonEndpoint.ReplaceAllString(text, fmt.Sprintf("%q: %q", "endpoint", srv.Endpoint))
				var top map[string]json.RawMessage
				if err := json.Unmarshal([]byte(text), &top); err != nil {
					t.Fatalf("not JSON: %v\n%s", err, s.text)
				}
				if _, ok := top["handler"]; ok {
					text = fmt.Sprintf(`{"admin": {"disabled": true}, "apps": {"http": {"servers": {"docs": {"listen": ["127.0.0.1:%d"], "routes": [{"handle": [%s]}]}}}}}`, port, text)
				}
			}
			cfg := filepath.Join(dir, fmt.Sprintf("snippet-%d.%s", i, s.lang))
			if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"validate", "--config", cfg}
			if s.lang == "caddyfile" {
				args = append(args, "--adapter", "caddyfile")
			}
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"), "HOME="+dir)
			cmd.Env = append(cmd.Env, snippetEnv(t, text, srv)...)
			out, err := cmd.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("Valid configuration")) {
				t.Fatalf("caddy validate failed (%v):\n%s\n--- config as tested:\n%s", err, logMessages(out), text)
			}
		})
	}
}

// firstToken is the first word of a Caddyfile outside comments.
func firstToken(text string) string {
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		return strings.Fields(l)[0]
	}
	return ""
}

// TestProductionJSONMatchesCaddyfile: examples/production/caddy.json is
// what `caddy adapt` makes of the Caddyfile beside it with no deployment
// variables set (the defaults), so the two cannot drift apart.
func TestProductionJSONMatchesCaddyfile(t *testing.T) {
	bin := caddyBinary(t)
	cmd := exec.Command(bin, "adapt", "--config", examplePath(t, "production", "Caddyfile"), "--adapter", "caddyfile")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SYNCULAR_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("caddy adapt: %v", err)
	}
	committed, err := os.ReadFile(examplePath(t, "production", "caddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(committed, &b); err != nil {
		t.Fatalf("caddy.json: %v", err)
	}
	ja, _ := json.MarshalIndent(a, "", "  ")
	jb, _ := json.MarshalIndent(b, "", "  ")
	if !bytes.Equal(ja, jb) {
		t.Fatalf("examples/production/caddy.json differs from `caddy adapt` of the Caddyfile; regenerate with\n"+
			"  env -u ... bin/caddy adapt --config examples/production/Caddyfile --pretty > examples/production/caddy.json\nadapt gave:\n%s", ja)
	}
	var keys []string
	for _, m := range envPlaceholder.FindAllStringSubmatch(string(committed), -1) {
		keys = append(keys, m[1])
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		t.Fatalf("caddy.json takes no secret from the environment")
	}
}

// TestExampleAnswersAnyHost: Caddyfile.example's site address matches no
// host, so a request for the edge's public name with a valid token gets
// the segment (an `http://127.0.0.1:8080` address answered it with an
// empty 200).
func TestExampleAnswersAnyHost(t *testing.T) {
	digest := token.ScopeDigest(map[string][]string{"user_id": {"any-host"}})
	body := pseudoRandom(40_000, 3)
	db, id := seedOne(t, "tenant-host", digest, body)
	segKeyCfg, segKey := exampleKey(t)
	audKeyCfg, audKey := exampleKey(t)
	port, addr := loopback(t)
	_, admin := loopback(t)
	up := newRecordingUpstream(t)
	logDir := t.TempDir()
	startConfig(t, filepath.Join(repoRoot(t), "Caddyfile.example"), "caddyfile", []string{
		"SYNCULAR_SEGMENT_KEY=" + segKeyCfg, "SYNCULAR_AUDIENCE_KEY=" + audKeyCfg,
		"SYNCULAR_DB=" + db, fmt.Sprintf("SYNCULAR_SITE_ADDRESS=:%d", port), "SYNCULAR_ADMIN=" + admin,
		"SYNCULAR_UPSTREAM=" + up.addr, "SYNCULAR_ACCESS_LOG=" + filepath.Join(logDir, "access.log"),
	}, addr)
	tok := token.Sign(segKey, id, digest, hmacAud(t, audKey, "tenant-host"), time.Now().Add(15*time.Minute).Unix())
	for _, host := range []string{"edge.example.com", "127.0.0.1", "localhost:8080"} {
		req, err := http.NewRequest("GET", "http://"+addr+"/sync/segments/"+id+"?st="+tok, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || s3test.SegmentID(b) != id {
			t.Errorf("Host %s: %d with %d bytes, want the segment", host, res.StatusCode, len(b))
		}
	}
}
