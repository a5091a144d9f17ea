package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// The shipped configurations must keep every credential out of every log
// Caddy writes: the st token, the keys, partition ids and, in redirect
// mode, the presigned URL. These tests run the real binary on the shipped
// files themselves (settings and secrets from the environment, as an
// operator runs them), send the requests that reach each logger, and grep
// everything the process wrote.

// key32 is a random 32-byte key, as configured ("hex:…") and as bytes.
func key32(t *testing.T) (config string, raw []byte) {
	t.Helper()
	raw = make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	return "hex:" + hex.EncodeToString(raw), raw
}

// shippedConfig reads a Caddyfile the repository ships.
func shippedConfig(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// deadAddr is a loopback address nothing listens on (reverse_proxy's
// upstream there fails with 502, which Caddy's error log records).
func deadAddr(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", freePort(t))
}

// rawTarget sends a request line as given (a '#', an absolute URI)
// with Host host, and returns the status.
func rawTarget(t *testing.T, c *caddyProc, target, host string) int {
	t.Helper()
	st, err := rawStatus(c.Port, "GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", target, host, err)
	}
	return st
}

// processLogs is everything the process wrote: its stdout and stderr, and
// every file under its directory except the Caddyfile (the access log,
// autosaved config, anything a logger created). It stops the process first
// so that every line is flushed.
func processLogs(t *testing.T, c *caddyProc) map[string]string {
	t.Helper()
	c.Stop()
	out := map[string]string{"stdout+stderr": c.Output()}
	err := filepath.WalkDir(c.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == filepath.Join(c.Dir(), "Caddyfile") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[strings.TrimPrefix(p, c.Dir()+"/")] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noneHolds fails the test for every log that holds one of secrets (or a
// token's MAC), or a query parameter named st in any case.
func noneHolds(t *testing.T, logs map[string]string, secrets ...string) {
	t.Helper()
	for name, text := range logs {
		checkNoSecrets(t, name, text, secrets)
		if strings.Contains(strings.ToLower(text), "st=") {
			i := strings.Index(strings.ToLower(text), "st=")
			t.Errorf("%s holds an st parameter: …%s…", name, text[max(0, i-60):min(len(text), i+5)])
		}
	}
}

// mustShow fails the test unless log holds want: a log check that never
// saw the request proves nothing.
func mustShow(t *testing.T, logs map[string]string, name, want, why string) {
	t.Helper()
	if !strings.Contains(logs[name], want) {
		t.Errorf("%s does not show %s (%q): the check would prove nothing\n%s", name, why, want, logs[name])
	}
}

// mustShowSomewhere fails the test unless some log (stdout, stderr or a
// file Caddy wrote) holds want. Which logger records a request can move
// with the config (a wrong Host is the site's when the site address is a
// bare port, the default logger's when it names a host); noneHolds
// checks every log either way.
func mustShowSomewhere(t *testing.T, logs map[string]string, want, why string) {
	t.Helper()
	for _, text := range logs {
		if strings.Contains(text, want) {
			return
		}
	}
	names := make([]string, 0, len(logs))
	for name := range logs {
		names = append(names, name)
	}
	sort.Strings(names)
	t.Errorf("no log (%s) shows %s (%q): the check would prove nothing", strings.Join(names, ", "), why, want)
}

// TestLogExampleNoToken runs Caddyfile.example as shipped (SQLite store,
// access log file, default log on stderr) and sends a token down every path
// that reaches a logger: granted, refused, not found, handed to a dead
// upstream (Caddy's error log), a wrong Host (whichever logger takes it),
// and the '#' shapes a URL parser reads differently from Go's server.
func TestLogExampleNoToken(t *testing.T) {
	segKeyCfg, segKey := key32(t)
	audKeyCfg, audKey := key32(t)
	partition := "p-" + randKey(t)[:12]
	aud, _ := token.HMACAudience(audKey, "hex")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"log-check"}})
	body := []byte("SSG2 segment bytes for the log check")
	dbPath, id := seedOne(t, partition, digest, body)

	c := startCaddy(t, shippedConfig(t, "Caddyfile.example"),
		"SYNCULAR_SEGMENT_KEY="+segKeyCfg,
		"SYNCULAR_AUDIENCE_KEY="+audKeyCfg,
		"SYNCULAR_DB="+dbPath,
		"SYNCULAR_SITE_ADDRESS=:{{PORT}}",
		"SYNCULAR_ADMIN=127.0.0.1:{{ADMIN}}",
		"SYNCULAR_UPSTREAM="+deadAddr(t),
		"SYNCULAR_ACCESS_LOG={{DIR}}/access.log",
	)
	exp := time.Now().Add(15 * time.Minute).Unix()
	tok := token.Sign(segKey, id, digest, aud.Derive(partition), exp)
	badTok := token.Sign([]byte("not-the-segment-key-0123456789ab"), id, digest, aud.Derive(partition), exp)
	seg := "/sync/segments/" + id
	host := fmt.Sprintf("127.0.0.1:%d", c.Port)

	checkSegment(t, do(t, "GET", c.Base+seg+"?st="+tok, nil), id)
	checkSegment(t, do(t, "GET", c.Base+seg+"?a=1&%73t="+tok+"&b=2", nil), id)
	checkError(t, do(t, "GET", c.Base+seg+"?st="+badTok, nil), 403, "sync.forbidden")
	checkError(t, do(t, "GET", c.Base+"/sync/segments/sha256:zz?st="+tok, nil), 404, "sync.not_found")
	for _, q := range []string{"?st=", "?ST=", "?st%3D", "?x=1;st="} {
		// Not a token to the handler (or not under this path): reverse_proxy
		// takes it to the dead upstream and Caddy's error log records it.
		if r := do(t, "GET", c.Base+"/sync/pull"+q+tok, nil); r.Status != 502 {
			t.Fatalf("/sync/pull%s…: %d, want 502 from the dead upstream", q, r.Status)
		}
	}
	for _, target := range []string{
		seg + "?x=#&st=" + tok,
		seg + "?st=" + tok + "&x=#",
		seg + "?x#st=" + tok,
		seg + "#?st=" + tok,
		seg + "#st=" + tok,
		"http://" + host + seg + "?x=#&st=" + tok,
	} {
		if st := rawTarget(t, c, target, host); st != 403 {
			t.Errorf("GET %s: %d, want 403", strings.Replace(target, tok, "<token>", 1), st)
		}
	}
	// A Host no site names: the site (its address is a bare port, any
	// Host) or else Caddy's default logger records the request.
	for _, target := range []string{seg + "?st=" + tok, seg + "?x=#&st=" + tok, "http://wrong.example" + seg + "?st=" + tok} {
		rawTarget(t, c, target, "wrong.example")
	}

	logs := processLogs(t, c)
	mustShow(t, logs, "access.log", `"status":200`, "a granted request")
	mustShow(t, logs, "access.log", `"status":403`, "a refused request")
	mustShow(t, logs, "access.log", `"uri":"/sync/segments/`+id+`?a=1&&b=2"`, "the query around a removed st")
	mustShowSomewhere(t, logs, `"host":"wrong.example"`, "the wrong-host request")
	mustShow(t, logs, "stdout+stderr", `"status":502`, "reverse_proxy's error")
	noneHolds(t, logs, tok, badTok, segKeyCfg, audKeyCfg, hex.EncodeToString(segKey), hex.EncodeToString(audKey), partition)
}

// TestLogS3RedirectNoPresignedURL runs examples/s3-redirect.Caddyfile
// against a real S3-compatible server: the 302's Location is a live
// presigned URL, and no log may hold it (nor the bucket credentials).
func TestLogS3RedirectNoPresignedURL(t *testing.T) {
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "syncular-segments")
	segKeyCfg, segKey := key32(t)
	audKeyCfg, audKey := key32(t)
	partition := "p-" + randKey(t)[:12]
	aud, _ := token.HMACAudience(audKey, "hex")
	digest := strings.Repeat("d", 64)
	body := randomBytes(t, 5000)
	id := s3test.SegmentID(body)
	// As current reference writers do: a bytes object with the legacy
	// record header would be streamed, not redirected (protocol §5.2).
	s3test.PutSegment(t, srv.Client(), "syncular-segments", "syncular/", body, "")
	s3test.PutRecordObject(t, srv.Client(), "syncular-segments", "syncular/", id,
		record(id, len(body), partition, digest, time.Now().Add(time.Hour)))

	c := startCaddy(t, shippedConfig(t, "examples/s3-redirect.Caddyfile"),
		"SYNCULAR_SEGMENT_KEY="+segKeyCfg,
		"SYNCULAR_AUDIENCE_KEY="+audKeyCfg,
		"SYNCULAR_S3_ENDPOINT="+srv.Endpoint,
		"SYNCULAR_S3_ACCESS_KEY_ID="+srv.AccessKey,
		"SYNCULAR_S3_SECRET_ACCESS_KEY="+srv.SecretKey,
		"SYNCULAR_SITE_ADDRESS=:{{PORT}}",
		"SYNCULAR_ADMIN=127.0.0.1:{{ADMIN}}",
		"SYNCULAR_UPSTREAM="+deadAddr(t),
		"SYNCULAR_ACCESS_LOG={{DIR}}/access.log",
	)
	tok := token.Sign(segKey, id, digest, aud.Derive(partition), time.Now().Add(15*time.Minute).Unix())
	r := do(t, "GET", c.Base+"/sync/segments/"+id+"?st="+tok, nil)
	loc, err := url.Parse(r.Header.Get("Location"))
	if r.Status != 302 || err != nil || loc.Query().Get("X-Amz-Signature") == "" {
		t.Fatalf("want a 302 to a presigned URL: %d %q", r.Status, r.Header.Get("Location"))
	}
	if got := do(t, "GET", loc.String(), nil); got.Status != 200 || s3test.SegmentID(got.Body) != id {
		t.Fatalf("the presigned URL is not live (%d): the check would prove nothing", got.Status)
	}
	sig, cred := loc.Query().Get("X-Amz-Signature"), loc.Query().Get("X-Amz-Credential")
	rawTarget(t, c, "/sync/segments/"+id+"?st="+tok, "wrong.example")

	logs := processLogs(t, c)
	mustShow(t, logs, "access.log", `"status":302`, "the redirect")
	mustShow(t, logs, "access.log", `"resp_headers":{`, "the response headers (with Location removed)")
	mustShowSomewhere(t, logs, `"host":"wrong.example"`, "the wrong-host request")
	for name, text := range logs {
		for _, s := range []string{"X-Amz-Signature", "X-Amz-Credential", "X-Amz-", `"Location":`} {
			if strings.Contains(text, s) {
				t.Errorf("%s holds %q", name, s)
			}
		}
	}
	noneHolds(t, logs, tok, sig, cred, srv.AccessKey, srv.SecretKey, segKeyCfg, audKeyCfg, partition)
}
