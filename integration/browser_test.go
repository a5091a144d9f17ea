package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// browserPage fetches every URL of urls (name → URL, with fetch options)
// from its own origin, hashes the bodies with crypto.subtle and POSTs
// what the page could see back to /report.
const browserPage = `<!doctype html>
<html><body><pre id="result">running</pre>
<script>
const CASES = %s;
const hex = (buf) => Array.from(new Uint8Array(buf)).map(b => b.toString(16).padStart(2, '0')).join('');
(async () => {
  const out = {secure: window.isSecureContext, subtle: !!(window.crypto && crypto.subtle)};
  for (const c of CASES) {
    try {
      const r = await fetch(c.url, {headers: c.headers || {}, cache: 'no-store'});
      const buf = await r.arrayBuffer();
      const text = new TextDecoder().decode(buf.byteLength < 2000 ? buf : new ArrayBuffer(0));
      let code = '';
      try { code = JSON.parse(text).code || ''; } catch (e) {}
      out[c.name] = {status: r.status, sha256: 'sha256:' + hex(await crypto.subtle.digest('SHA-256', buf)),
        bytes: buf.byteLength, etag: r.headers.get('ETag'), contentRange: r.headers.get('Content-Range'),
        code: code, redirected: r.redirected};
    } catch (e) {
      out[c.name] = {error: String(e)};
    }
  }
  document.getElementById('result').textContent = JSON.stringify(out);
  await fetch('/report', {method: 'POST', body: JSON.stringify(out)});
})();
</script></body></html>`

type browserCase struct {
	Name    string            `json:"name"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
}

type browserResult struct {
	Status       int    `json:"status"`
	SHA256       string `json:"sha256"`
	Bytes        int    `json:"bytes"`
	ETag         string `json:"etag"`
	ContentRange string `json:"contentRange"`
	Code         string `json:"code"`
	Redirected   bool   `json:"redirected"`
	Error        string `json:"error"`
}

// chromiumBinary is Debian's chromium (scripts/tools.sh chromium installs it).
func chromiumBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SYNCULAR_CHROMIUM"); p != "" {
		return p
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not on PATH: run `scripts/tools.sh chromium` (make integration does): %v", err)
	}
	return p
}

// runBrowser serves the page on its own loopback origin, opens it in
// headless Chromium and returns what the page reported.
func runBrowser(t *testing.T, cases []browserCase) (origin string, res map[string]json.RawMessage) {
	t.Helper()
	js, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	report := make(chan []byte, 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, browserPage, js)
		case "/report":
			b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			select {
			case report <- b:
			default:
			}
			w.WriteHeader(204)
		default:
			http.NotFound(w, r)
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	origin = "http://" + l.Addr().String()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out := &lockedBuffer{}
	cmd := exec.Command(chromiumBinary(t), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--user-data-dir="+filepath.Join(t.TempDir(), "profile"), origin+"/")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	select {
	case b := <-report:
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("page report %q: %v", b, err)
		}
		return origin, res
	case <-ctx.Done():
		t.Fatalf("the page reported nothing within 90s; chromium said:\n%s", out.String())
	}
	return "", nil
}

func decodeResult(t *testing.T, res map[string]json.RawMessage, name string) browserResult {
	t.Helper()
	var r browserResult
	raw, ok := res[name]
	if !ok {
		t.Fatalf("page reported no %q", name)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestBrowserCORS opens a page on one loopback origin in headless
// Chromium; it fetches signed URLs from an edge on another origin
// (examples/browser: SQLite serve, S3 proxy and redirect) and hashes the
// bodies with crypto.subtle. Redirect works only when the bucket's CORS
// allows the origin null the browser sends after the redirect. A refused URL must be a 403 the page can read; a path
// the CORS lines do not cover must be a failed fetch (the control that
// the browser enforces CORS here).
func TestBrowserCORS(t *testing.T) {
	digest := token.ScopeDigest(map[string][]string{"user_id": {"browser"}})
	const partition = "tenant-browser"
	up := newRecordingUpstream(t)

	type edgeSetup struct {
		name, config string
		env          []string
		id           string
		size         int
	}
	var setups []edgeSetup

	body := pseudoRandom(150_000, 7)
	dbPath, sqliteID := seedOne(t, partition, digest, body)
	setups = append(setups, edgeSetup{"serve", "Caddyfile", []string{"SYNCULAR_DB=" + dbPath}, sqliteID, len(body)})

	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	s3seg := putSegments(t, srv, "segments", partition, digest, 1, 120_000)[0]
	setups = append(setups, edgeSetup{"proxy", "s3.Caddyfile", []string{
		"SYNCULAR_S3_ENDPOINT=" + srv.Endpoint, "SYNCULAR_S3_ACCESS_KEY_ID=" + srv.AccessKey,
		"SYNCULAR_S3_SECRET_ACCESS_KEY=" + srv.SecretKey, "SYNCULAR_S3_BUCKET=segments", "SYNCULAR_DELIVERY=proxy",
	}, s3seg.id, len(s3seg.body)})

	// Redirect delivery: the browser follows the 302 to the bucket with
	// Origin: null. A bucket whose CORS rule allows * serves the page; one
	// without CORS is a failed fetch (what docs/production.md warns about).
	srv.CreateBucket(t, "nocors")
	noCorsSeg := putSegments(t, srv, "nocors", partition, digest, 1, 90_000)[0]
	_, err := srv.Client().PutBucketCors(context.Background(), &s3.PutBucketCorsInput{
		Bucket: aws.String("segments"),
		CORSConfiguration: &s3types.CORSConfiguration{CORSRules: []s3types.CORSRule{{
			AllowedMethods: []string{"GET", "HEAD"},
			AllowedOrigins: []string{"*"},
			ExposeHeaders:  []string{"ETag", "Content-Range"},
		}}},
	})
	if err != nil {
		t.Fatalf("PutBucketCors: %v", err)
	}
	s3env := func(bucket, delivery string) []string {
		return []string{"SYNCULAR_S3_ENDPOINT=" + srv.Endpoint, "SYNCULAR_S3_ACCESS_KEY_ID=" + srv.AccessKey,
			"SYNCULAR_S3_SECRET_ACCESS_KEY=" + srv.SecretKey, "SYNCULAR_S3_BUCKET=" + bucket, "SYNCULAR_DELIVERY=" + delivery}
	}
	setups = append(setups,
		edgeSetup{"redirect", "s3.Caddyfile", s3env("segments", "redirect"), s3seg.id, len(s3seg.body)},
		edgeSetup{"redirect_bucket_without_cors", "s3.Caddyfile", s3env("nocors", "redirect"), noCorsSeg.id, len(noCorsSeg.body)})

	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			segKeyCfg, segKey := exampleKey(t)
			audKeyCfg, audKey := exampleKey(t)
			port, addr := loopback(t)
			_, admin := loopback(t)
			env := append([]string{
				"SYNCULAR_SEGMENT_KEY=" + segKeyCfg, "SYNCULAR_AUDIENCE_KEY=" + audKeyCfg,
				fmt.Sprintf("SYNCULAR_SITE_ADDRESS=:%d", port), "SYNCULAR_ADMIN=" + admin,
				"SYNCULAR_BIND=127.0.0.1", "SYNCULAR_UPSTREAM=" + up.addr,
			}, s.env...)
			startConfig(t, examplePath(t, "browser", s.config), "caddyfile", env, addr)
			exp := time.Now().Add(15 * time.Minute).Unix()
			seg := "http://" + addr + "/sync/segments/" + s.id + "?st="
			good := seg + token.Sign(segKey, s.id, digest, hmacAud(t, audKey, partition), exp)
			refused := seg + token.Sign(segKey, s.id, digest, hmacAud(t, audKey, "tenant-other"), exp)

			cases := []browserCase{
				{Name: "granted", URL: good},
				{Name: "refused", URL: refused},
				{Name: "uncovered", URL: "http://" + addr + "/elsewhere"},
			}
			redirect := strings.HasPrefix(s.name, "redirect")
			if !redirect {
				cases = append(cases,
					browserCase{Name: "range", URL: good, Headers: map[string]string{"Range": "bytes=100-199"}},
					browserCase{Name: "not_modified", URL: good, Headers: map[string]string{"If-None-Match": `"` + s.id + `"`}})
			}
			origin, res := runBrowser(t, cases)
			t.Logf("page on %s, edge on http://%s: %s", origin, addr, mustJSON(res))
			if string(res["secure"]) != "true" || string(res["subtle"]) != "true" {
				t.Fatalf("page is not a secure context with crypto.subtle: %s", mustJSON(res))
			}
			f := decodeResult(t, res, "refused")
			if f.Error != "" || f.Status != 403 || f.Code != "sync.forbidden" {
				t.Errorf("refused: %+v, want a 403 sync.forbidden the page can read", f)
			}
			u := decodeResult(t, res, "uncovered")
			if u.Error == "" || !strings.Contains(u.Error, "TypeError") {
				t.Errorf("a response without CORS headers was readable by the page: %+v", u)
			}
			g := decodeResult(t, res, "granted")
			switch s.name {
			case "redirect":
				if g.Error != "" || g.Status != 200 || g.SHA256 != s.id || g.Bytes != s.size || !g.Redirected {
					t.Errorf("granted via the bucket: %+v, want a followed redirect, 200 hashing to %s", g, s.id)
				}
				return
			case "redirect_bucket_without_cors":
				if g.Error == "" || !strings.Contains(g.Error, "TypeError") {
					t.Errorf("a bucket without CORS served the page: %+v", g)
				}
				return
			}
			if g.Error != "" || g.Status != 200 || g.SHA256 != s.id || g.Bytes != s.size || g.ETag != `"`+s.id+`"` {
				t.Errorf("granted: %+v, want 200 hashing to %s with ETag visible", g, s.id)
			}
			r := decodeResult(t, res, "range")
			if r.Error != "" || r.Status != 206 || r.Bytes != 100 || r.ContentRange != fmt.Sprintf("bytes 100-199/%d", s.size) {
				t.Errorf("range: %+v", r)
			}
			nm := decodeResult(t, res, "not_modified")
			if nm.Error != "" || nm.Status != 304 {
				t.Errorf("If-None-Match (preflighted): %+v, want 304", nm)
			}
		})
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
