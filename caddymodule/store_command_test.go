package caddymodule

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// The gen-3 vector store at its nowMs (segments-gen3.json).
const (
	gen3Now        = int64(1800000000000)
	gen3TwoDigests = "sha256:33016ca4ff1ec281affb6d0d501780886b41ce55f64eff8c213b352a67283d50"
	gen3AllExpired = "sha256:1a37ce0a513c703be4ee3a3518fe1137b4f4fcac731f44f4dbee6c123c36ea07"
	gen3TwoParts   = "sha256:56fabe73ab9525b8a22d7d1e6106405ed70561156572290422af86f657d073ef"
	gen3Rotated    = "sha256:85bbb6e22770830b7e95162539b02472c1f97c30247ca098253890489cc5d008"
	gen3DigestA    = "46cf18d6bb2b57ec98116335c988810ed464a447bd574695bc165da7631414f6"
	gen3DigestC    = "982c567e3e59e7eca0b010757bd9243bbe2afedf869f75fa583aedd8aee9245d"
	inspectKeyHex  = "5c0e8a41d27b93f6e1a4c8d05b7f2e9a3d61c4b8f07e2a95d3c6b1e84f0a7d29"
)

// copyVectorTo copies a vector file into dir.
func copyVectorTo(t *testing.T, name, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// inspectConfig writes a Caddyfile with two sites: a.example on the gen-3
// vector, b.example on the legacy one. The key comes from the
// environment.
func inspectConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	gen3 := copyVectorTo(t, "segments-gen3.sqlite", dir)
	legacy := copyVectorTo(t, "segments-legacy.sqlite", dir)
	t.Setenv("INSPECT_TEST_KEY", "hex:"+inspectKeyHex)
	cfg := `http://a.example {
	syncular_segments /sync/segments/* {
		key {env.INSPECT_TEST_KEY}
		audience template aud:{partition}
		store sqlite ` + gen3 + `
	}
}

http://b.example {
	syncular_segments {
		key {env.INSPECT_TEST_KEY}
		audience template aud:{partition}
		store sqlite ` + legacy + `
	}
}
`
	p := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runStoreInspectArgs(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c := storeInspectCommand()
	var out bytes.Buffer
	c.SetOut(&out)
	c.SetErr(&out)
	c.SetArgs(args)
	err := c.ExecuteContext(context.Background())
	return out.String(), err
}

func inspectToken(t *testing.T, seg, sd, partition string) string {
	t.Helper()
	key, err := token.ParseKey("hex:" + inspectKeyHex)
	if err != nil {
		t.Fatal(err)
	}
	return token.Sign(key, seg, sd, "aud:"+partition, gen3Now/1000+600)
}

func TestStoreInspectDecisions(t *testing.T) {
	cfg := inspectConfig(t)
	now := "1800000000000"
	cases := []struct {
		name    string
		seg     string
		tok     string
		refused bool
		want    []string
		wantNot []string
	}{
		{
			name: "granted", seg: gen3TwoDigests, tok: inspectToken(t, gen3TwoDigests, gen3DigestA, "p1"),
			want: []string{
				"handler     #0 of 2: a.example /sync/segments/* (server srv0 on :80)",
				"backend     sqlite ", "layout      schema generation 3 (sync_segment_publications and sync_segment_scopes)",
				"partition registry present: epoch fencing on (2 partitions)",
				"backfill checkpoints table absent",
				"counts      9 segments, 10 publication rows",
				"record      2008 bytes, rows, 2 publication(s) at 2027-01-15T08:00:00Z",
				"[0] live      partition p1, epoch \"e1\"",
				"expires 2027-01-16T04:00:00Z (in 20h0m0s)",
				"token: scope digest matches, audience matches",
				"  status    200 OK", "  outcome   granted", "  key slot  1", "  delivery  serve", "  length    2008 bytes",
				"  cache     private, max-age=",
			},
		},
		{
			name: "wrong scope digest", seg: gen3TwoDigests, tok: inspectToken(t, gen3TwoDigests, gen3DigestC, "p1"), refused: true,
			want: []string{"  status    403 Forbidden", "  outcome   sync.forbidden", "  error     sync.forbidden: segment token rejected: scope-digest mismatch",
				"token: scope digest differs, audience matches"},
			wantNot: []string{"  delivery"},
		},
		{
			name: "expired publication", seg: gen3AllExpired, tok: inspectToken(t, gen3AllExpired, gen3DigestA, "p1"), refused: true,
			want: []string{"[0] expired   partition p1", "expires 2027-01-15T02:00:00Z (6h0m0s ago)", "  status    404 Not Found", "  error     sync.segment_expired: segment expired", "  matches   [0] expired (publications"},
		},
		{
			name: "one of two publications expired", seg: gen3TwoParts, tok: inspectToken(t, gen3TwoParts, gen3DigestA, "p1"), refused: true,
			want: []string{"[0] expired   partition p1", "[1] live      partition p2", "  error     sync.segment_expired"},
		},
		{
			name: "fenced", seg: gen3Rotated, tok: inspectToken(t, gen3Rotated, gen3DigestA, "p1"), refused: true,
			want: []string{"[0] fenced    partition p1, epoch \"e0\" (registry: \"e1\")", "  error     sync.not_found: segment not found: fenced by the partition registry", "  matches   [0] fenced ("},
		},
		{
			name: "other partition's audience", seg: gen3TwoDigests, tok: inspectToken(t, gen3TwoDigests, gen3DigestA, "p2"), refused: true,
			want: []string{"token: scope digest matches, audience differs", "segment token rejected: audience mismatch", "  matches   no publication has both"},
		},
		{
			name: "bad MAC", seg: gen3TwoDigests, tok: token.Sign([]byte("another-key-0123456789abcdef0123"), gen3TwoDigests, gen3DigestA, "aud:p1", gen3Now/1000+600), refused: true,
			want: []string{"  outcome   sync.forbidden", "segment token rejected: bad MAC", "  key slot  none"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := runStoreInspectArgs(t, "--config", cfg, "--now", now, c.seg, "--token", c.tok)
			if (err != nil) != c.refused {
				t.Fatalf("err = %v, refused %v\n%s", err, c.refused, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range c.wantNot {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
			all := out
			if err != nil {
				all += err.Error()
			}
			for _, secret := range []string{inspectKeyHex, c.tok, strings.SplitN(c.tok, ".", 2)[1]} {
				if strings.Contains(all, secret) {
					t.Errorf("output shows a secret (key or token):\n%s", all)
				}
			}
		})
	}
}

// TestStoreInspectURL decides for a whole signed URL (its segment id is
// the default), with the URL's own path.
func TestStoreInspectURL(t *testing.T) {
	cfg := inspectConfig(t)
	tok := inspectToken(t, gen3TwoDigests, gen3DigestA, "p1")
	out, err := runStoreInspectArgs(t, "--config", cfg, "--now", "2027-01-15T08:00:00Z", "--url", "https://a.example/sync/segments/"+gen3TwoDigests+"?st="+tok)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, w := range []string{"segment     " + gen3TwoDigests, "decision    HEAD /sync/segments/" + gen3TwoDigests + "?… ", "  outcome   granted"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, tok) {
		t.Error("output shows the token")
	}
	// --token env:NAME reads the token from the environment.
	t.Setenv("INSPECT_TEST_TOKEN", tok)
	out, err = runStoreInspectArgs(t, "--config", cfg, "--now", "1800000000000", gen3TwoDigests, "--token", "env:INSPECT_TEST_TOKEN")
	if err != nil || !strings.Contains(out, "  outcome   granted") {
		t.Errorf("--token env:: %v\n%s", err, out)
	}
	if _, err := runStoreInspectArgs(t, "--config", cfg, gen3TwoDigests, "--token", "env:INSPECT_TEST_NO_TOKEN"); err == nil || !strings.Contains(err.Error(), "INSPECT_TEST_NO_TOKEN is unset") {
		t.Errorf("--token env: of an unset variable: %v", err)
	}
	// A '#' after the token: the handler refuses what a log filter would
	// miss, and the inspector says so.
	out, err = runStoreInspectArgs(t, "--config", cfg, "--now", "1800000000000", "--url", "https://a.example/sync/segments/"+gen3TwoDigests+"?st="+tok+"#x")
	if err == nil || !strings.Contains(out, "segment token rejected: '#' in a signed URL") || strings.Contains(out, tok) {
		t.Errorf("'#' in the URL: %v\n%s", err, out)
	}
	// A URL for another segment than the one given is refused up front.
	if _, err := runStoreInspectArgs(t, "--config", cfg, gen3AllExpired, "--url", "https://a.example/sync/segments/"+gen3TwoDigests+"?st="+tok); err == nil {
		t.Error("a segment id that is not the URL's was accepted")
	}
}

func TestStoreInspectSitesAndLayouts(t *testing.T) {
	cfg := inspectConfig(t)
	for _, site := range []string{"b.example", "B.Example", "1"} {
		out, err := runStoreInspectArgs(t, "--config", cfg, "--site", site)
		if err != nil {
			t.Fatalf("--site %s: %v\n%s", site, err, out)
		}
		// The vector files are rollback-journal files: the inspector says
		// so and names the fix.
		for _, w := range []string{"(journal mode delete, ", "warning: journal mode delete is a rollback journal",
			"fix: open it with PRAGMA journal_mode=WAL"} {
			if !strings.Contains(out, w) {
				t.Errorf("--site %s: output lacks %q:\n%s", site, w, out)
			}
		}
		for _, w := range []string{"handler     #1 of 2: b.example (server srv0 on :80)", "schema generation 2 (sync_segments with log_epoch)",
			"partition registry absent: no epoch fencing", "counts      7 segments\n"} {
			if !strings.Contains(out, w) {
				t.Errorf("--site %s: output lacks %q:\n%s", site, w, out)
			}
		}
		if strings.Contains(out, "segment     ") {
			t.Errorf("a segment section without a segment id:\n%s", out)
		}
	}
	for _, site := range []string{"c.example", "2", "-1"} {
		_, err := runStoreInspectArgs(t, "--config", cfg, "--site", site)
		if err == nil || !strings.Contains(err.Error(), "0: a.example /sync/segments/*") || !strings.Contains(err.Error(), "1: b.example") {
			t.Errorf("--site %s: err = %v; want a refusal listing the handlers", site, err)
		}
	}
	// An unknown segment: no record.
	out, err := runStoreInspectArgs(t, "--config", cfg, "sha256:"+strings.Repeat("ab", 32))
	if err != nil || !strings.Contains(out, "record      none: the edge answers sync.not_found") {
		t.Errorf("unknown segment: %v\n%s", err, out)
	}
}

func TestStoreInspectArgs(t *testing.T) {
	cfg := inspectConfig(t)
	tok := inspectToken(t, gen3TwoDigests, gen3DigestA, "p1")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no config", []string{gen3TwoDigests}, "--config is required"},
		{"token without segment", []string{"--config", cfg, "--token", tok}, "--token needs the segment id"},
		{"token and url", []string{"--config", cfg, gen3TwoDigests, "--token", tok, "--url", "/s/" + gen3TwoDigests + "?st=" + tok}, "not both"},
		{"bad segment id", []string{"--config", cfg, "sha256:XYZ"}, "sha256: followed by 64"},
		{"bad now", []string{"--config", cfg, "--now", "yesterday"}, "--now"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := runStoreInspectArgs(t, c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v; want %q", err, c.want)
			}
			if err != nil && strings.Contains(err.Error(), tok) {
				t.Error("error shows the token")
			}
		})
	}
	// A config the edge refuses (the key's variable unset) fails at
	// provision, naming the variable, not a value.
	os.Unsetenv("INSPECT_TEST_KEY")
	out, err := runStoreInspectArgs(t, "--config", cfg)
	if err == nil || !strings.Contains(err.Error(), "INSPECT_TEST_KEY is unset or empty") || !strings.Contains(out, "provision   failed") {
		t.Errorf("unset key: %v\n%s", err, out)
	}
}

// TestStoreInspectTimeout: the run is bounded by --timeout.
func TestStoreInspectTimeout(t *testing.T) {
	cfg := inspectConfig(t)
	_, err := runStoreInspectArgs(t, "--config", cfg, "--timeout", "1ns", gen3TwoDigests)
	if err == nil || !strings.Contains(err.Error(), "did not finish within --timeout 1ns") {
		t.Errorf("err = %v", err)
	}
}

// TestStoreInspectS3 inspects a versitygw bucket holding a segment in each
// S3 layout, through a JSON config with redirect delivery: which objects
// exist, which record is read, and the handler's delivery for each
// (a legacy header is streamed, not redirected). Credentials never show.
func TestStoreInspectS3(t *testing.T) {
	srv := s3test.Start(t)
	const bucket, prefix, partition = "inspect", "edge/", "tenant-partition-77d0"
	srv.CreateBucket(t, bucket)
	c := srv.Client()
	record := func(body []byte) map[string]any {
		return map[string]any{
			"partition": partition, "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
			"scopeDigest": digestA, "asOfCommitSeq": 1, "rowCount": 1, "rowCursor": nil, "nextRowCursor": nil,
			"segmentId": s3test.SegmentID(body), "byteLength": len(body),
			"createdAtMs": testNow.UnixMilli(), "expiresAtMs": testNow.Add(time.Hour).UnixMilli(),
		}
	}
	currentBody := []byte("inspect: current writer, record object")
	currentID := s3test.PutSegment(t, c, bucket, prefix, currentBody, "")
	s3test.PutRecordObject(t, c, bucket, prefix, currentID, record(currentBody))
	legacyBody := []byte("inspect: older writer, header only")
	legacyID := s3test.PutSegment(t, c, bucket, prefix, legacyBody, s3test.RecordHeader(record(legacyBody)))
	bothBody := []byte("inspect: header and record object")
	bothID := s3test.PutSegment(t, c, bucket, prefix, bothBody, s3test.RecordHeader(record(bothBody)))
	s3test.PutRecordObject(t, c, bucket, prefix, bothID, record(bothBody))

	t.Setenv("INSPECT_S3_AK", srv.AccessKey)
	t.Setenv("INSPECT_S3_SK", srv.SecretKey)
	t.Setenv("INSPECT_S3_KEY", string(testKey))
	cfg := `{"apps":{"http":{"servers":{"edge":{"listen":["127.0.0.1:0"],"routes":[{
		"match":[{"host":["s3.example"]}],
		"handle":[{"handler":"syncular_segments","keys":["{env.INSPECT_S3_KEY}"],
			"audience":{"kind":"template","template":"aud:{partition}"},
			"store":{"backend":"s3","s3":{"bucket":"` + bucket + `","region":"` + srv.Region + `","endpoint":"` + srv.Endpoint + `",
				"prefix":"` + prefix + `","access_key_id":"{env.INSPECT_S3_AK}","secret_access_key":"{env.INSPECT_S3_SK}"}}}]}]}}}}}`
	path := filepath.Join(t.TempDir(), "caddy.json")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	hexOf := func(id string) string { return strings.TrimPrefix(id, "sha256:") }
	cases := []struct {
		name, id string
		want     []string
	}{
		{"record object", currentID, []string{
			"objects     " + prefix + "seg/sha256/" + hexOf(currentID) + ": present, 38 bytes, no x-amz-meta-syncular-record header",
			"            " + prefix + "rec/sha256/" + hexOf(currentID) + ".json: present",
			"layout      record object\n",
			"  status    302 Found", "  delivery  redirect",
			"  location  " + srv.Endpoint + "/" + bucket + "/" + prefix + "seg/sha256/" + hexOf(currentID) + " (presigned; query not shown)",
		}},
		{"legacy header", legacyID, []string{
			"carries x-amz-meta-syncular-record", ".json: absent",
			"layout      legacy x-amz-meta-syncular-record header only (no record object)",
			"  status    200 OK", "  delivery  stream_legacy",
		}},
		{"both", bothID, []string{
			"carries x-amz-meta-syncular-record", ".json: present",
			"layout      record object (the bytes object also carries a legacy",
			"  status    200 OK", "  delivery  stream_legacy",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := mintToken(tc.id, digestA, "aud:"+partition, testNow.Add(10*time.Minute))
			out, err := runStoreInspectArgs(t, "--config", path, "--adapter", "json", "--now", strconv.FormatInt(testNow.UnixMilli(), 10),
				"--site", "s3.example", tc.id, "--token", tok)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			want := append([]string{
				"handler     #0 of 1: s3.example (server edge on 127.0.0.1:0)",
				"delivery    redirect", `backend     s3 bucket "` + bucket + `" prefix "` + prefix + `"`,
				"[0] live      partition " + partition, "  outcome   granted",
			}, tc.want...)
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, secret := range []string{srv.AccessKey, srv.SecretKey, string(testKey), tok, "X-Amz-Signature"} {
				if strings.Contains(out, secret) {
					t.Errorf("output shows a secret:\n%s", out)
				}
			}
		})
	}
}
