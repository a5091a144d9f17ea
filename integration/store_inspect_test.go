package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

const inspectSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /sync/segments/* {
		key {env.SEG_KEY}
		audience hmac_sha256 {env.AUD_KEY}
		store sqlite STORE_PATH
	}
	respond 404
}
`

// TestStoreInspect runs `caddy syncular-store inspect` of the real binary
// on the config a running edge serves, for signed URLs the edge answers,
// and checks that the inspector's decision is the edge's answer (status
// and error code), that it shows the store as written by the seed writer
// (gen-3 SQLite in WAL mode), and that no key or token reaches its output.
func TestStoreInspect(t *testing.T) {
	bin := caddyBinary(t)
	body := []byte("SSG2 store inspector segment")
	const partition = "inspect-partition-9f2c"
	sd := token.ScopeDigest(map[string][]string{"project_id": {"inspect"}})
	otherSD := token.ScopeDigest(map[string][]string{"project_id": {"someone-else"}})
	dbPath, id := seedOne(t, partition, sd, body)
	segKey := "hex:0b6f93c2d4a81e57f0c3b9a26d4e1f8a7c50e92b3d16f4a8c7e05b2d91a3f6c4"
	audKey := "hex:e27c4a9f1b3d5e8c06a2f7b4d9c1e3a58f0b6d2c4e7a91f3b5d8c0e2a4f6b1d3"
	c := startCaddy(t, strings.Replace(inspectSite, "STORE_PATH", dbPath, 1), "SEG_KEY="+segKey, "AUD_KEY="+audKey)
	cfg := filepath.Join(c.dir, "Caddyfile")

	kb, _ := token.ParseKey(segKey)
	ab, _ := token.ParseKey(audKey)
	aud, _ := token.HMACAudience(ab, "hex")
	exp := time.Now().Add(5 * time.Minute).Unix()
	tokens := map[string]string{
		"granted":         token.Sign(kb, id, sd, aud.Derive(partition), exp),
		"wrong digest":    token.Sign(kb, id, otherSD, aud.Derive(partition), exp),
		"other partition": token.Sign(kb, id, sd, aud.Derive("another-partition"), exp),
	}
	env := append(os.Environ(), "SEG_KEY="+segKey, "AUD_KEY="+audKey, "HOME="+t.TempDir())
	inspect := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"syncular-store", "inspect", "--config", cfg}, args...)...)
		cmd.Env = env
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		code := 0
		if err := cmd.Run(); err != nil {
			ee, ok := err.(*exec.ExitError)
			if !ok {
				t.Fatal(err)
			}
			code = ee.ExitCode()
		}
		all := o.String() + e.String()
		secrets := []string{strings.TrimPrefix(segKey, "hex:"), strings.TrimPrefix(audKey, "hex:"), aud.Derive(partition)}
		for _, tok := range tokens {
			secrets = append(secrets, tok, tok[strings.IndexByte(tok, '.')+1:])
		}
		for _, s := range secrets {
			if strings.Contains(all, s) {
				t.Errorf("syncular-store inspect printed a key, token or audience:\n%s", all)
			}
		}
		return all, code
	}

	for name, tok := range tokens {
		t.Run(name, func(t *testing.T) {
			url := c.Base + "/sync/segments/" + id + "?st=" + tok
			res, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(res.Body)
			res.Body.Close()
			var e struct{ Code, Message string }
			if res.StatusCode != http.StatusOK {
				if err := json.Unmarshal(got, &e); err != nil {
					t.Fatalf("edge answered %d with %q", res.StatusCode, got)
				}
			}
			for _, args := range [][]string{{id, "--token", tok}, {"--url", url}} {
				out, code := inspect(args...)
				wantStatus := "  status    " + res.Status + "\n"
				if !strings.Contains(out, wantStatus) {
					t.Errorf("edge answered %s; inspector (%s) says:\n%s", res.Status, args[0], out)
				}
				if res.StatusCode == http.StatusOK {
					if code != 0 || !strings.Contains(out, "  outcome   granted") || !strings.Contains(out, "  delivery  serve") {
						t.Errorf("exit %d:\n%s", code, out)
					}
					continue
				}
				if code != 1 || !strings.Contains(out, "  error     "+e.Code+": "+e.Message+"\n") {
					t.Errorf("edge answered %s %q; inspector exit %d:\n%s", e.Code, e.Message, code, out)
				}
			}
		})
	}

	// The store as the seed writer left it, and the publication's state.
	out, code := inspect(id)
	for _, w := range []string{
		"backend     sqlite " + dbPath + " (journal mode wal",
		"layout      schema generation 3 (sync_segment_publications and sync_segment_scopes)",
		"counts      1 segments, 1 publication rows",
		"[0] live      partition " + partition + `, epoch "e1"`,
		"scope digest " + sd,
	} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("exit %d, output lacks %q:\n%s", code, w, out)
		}
	}
}

const inspectS3Site = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /sync/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store s3 {
			bucket segments
			region auto
			prefix edge/
			endpoint {env.S3_ENDPOINT}
			access_key_id {env.S3_ACCESS_KEY}
			secret_access_key {env.S3_SECRET_KEY}
		}
	}
	respond 404
}
`

// TestStoreInspectS3 runs the real binary's inspector on a redirect edge
// over versitygw holding a segment of each S3 layout: it names the objects
// and the record read, and its decision is the running edge's (302 for a
// record object, the bytes streamed for a legacy header), with no
// credential, key or token in its output.
func TestStoreInspectS3(t *testing.T) {
	bin := caddyBinary(t)
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	c3 := srv.Client()
	const prefix, partition = "edge/", "inspect-s3-partition-41a"
	sd := token.ScopeDigest(map[string][]string{"project_id": {"inspect-s3"}})
	now := time.Now()
	record := func(body []byte) map[string]any {
		return map[string]any{
			"partition": partition, "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
			"scopeDigest": sd, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
			"segmentId": s3test.SegmentID(body), "byteLength": len(body),
			"createdAtMs": now.UnixMilli(), "expiresAtMs": now.Add(time.Hour).UnixMilli(),
		}
	}
	currentBody := []byte("inspector: current writer's segment")
	currentID := s3test.PutSegment(t, c3, "segments", prefix, currentBody, "")
	s3test.PutRecordObject(t, c3, "segments", prefix, currentID, record(currentBody))
	legacyBody := []byte("inspector: older writer's segment")
	legacyID := s3test.PutSegment(t, c3, "segments", prefix, legacyBody, s3test.RecordHeader(record(legacyBody)))

	segKey := "hex:7d2e9b41c6a05f38e1d4b7a29c60f3e58b1a4d7c2e9f06b3a58d1c4e7b20f9a6"
	vars := []string{"SEG_KEY=" + segKey, "S3_ENDPOINT=" + srv.Endpoint, "S3_ACCESS_KEY=" + srv.AccessKey, "S3_SECRET_KEY=" + srv.SecretKey}
	c := startCaddy(t, inspectS3Site, vars...)
	cfg := filepath.Join(c.dir, "Caddyfile")
	kb, _ := token.ParseKey(segKey)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	for _, tc := range []struct {
		name, id string
		want     []string
	}{
		{"record object", currentID, []string{
			"no x-amz-meta-syncular-record header", "layout      record object\n", "  delivery  redirect",
			"  location  " + srv.Endpoint + "/segments/" + prefix + "seg/sha256/" + strings.TrimPrefix(currentID, "sha256:") + " (presigned; query not shown)",
		}},
		{"legacy header", legacyID, []string{
			"carries x-amz-meta-syncular-record", "layout      legacy x-amz-meta-syncular-record header only (no record object)",
			"  delivery  stream_legacy",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := token.Sign(kb, tc.id, sd, "aud:"+partition, now.Add(5*time.Minute).Unix())
			res, err := noRedirect.Get(c.Base + "/sync/segments/" + tc.id + "?st=" + tok)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			cmd := exec.Command(bin, "syncular-store", "inspect", "--config", cfg, tc.id, "--token", "env:ST")
			cmd.Env = append(os.Environ(), append(vars, "ST="+tok, "HOME="+t.TempDir())...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			want := append([]string{
				`backend     s3 bucket "segments" prefix "` + prefix + `"`,
				"[0] live      partition " + partition,
				"  status    " + res.Status + "\n", "  outcome   granted",
			}, tc.want...)
			for _, w := range want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q (edge answered %s):\n%s", w, res.Status, out)
				}
			}
			for _, s := range []string{srv.AccessKey, srv.SecretKey, strings.TrimPrefix(segKey, "hex:"), tok, "X-Amz-"} {
				if strings.Contains(string(out), s) {
					t.Errorf("output shows a credential, key or token:\n%s", out)
				}
			}
		})
	}
}
