package integration

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/testkit"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

// gen3Vectors is segments-gen3.json (testkit.Gen3).
type gen3Vectors = testkit.Gen3

// sqliteSite is the Caddyfile the SQLite tests run: secrets from the
// environment, debug server log and a filtered access log in the
// process's directory, unsigned requests proxied to the stand-in.
const sqliteSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log {
		level DEBUG
		output file {{DIR}}/server.log
	}
}

http://127.0.0.1:{{PORT}} {
	log {
		output file {{DIR}}/access.log
		format filter {
			fields {
				request>uri query {
					delete st
				}
			}
		}
	}
	syncular_segments /segments/* {
		key {env.SEG_KEY} {env.SEG_KEY_PREVIOUS}
		audience hmac_sha256 {env.AUD_KEY}
		store sqlite STORE_PATH
	}
	reverse_proxy UPSTREAM
}
`

// realClockStore rewrites the gen-3 vector store into a fresh WAL file
// through the seed writer (the reference layout), with every time moved
// by delta ms so that the vectors' "now" is the real clock's now. Two
// rows are set relative to the real clock because the test takes time:
// "expires just after now" gets ten minutes, "expires exactly now"
// expires at generation time.
func realClockStore(t *testing.T, v gen3Vectors, delta int64) string {
	t.Helper()
	src, err := sql.Open("sqlite", "file:"+filepath.Join(vectorsDir(t), "segments-gen3.sqlite")+"?mode=ro&immutable=1")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	nowMs := v.NowMs + delta
	override := map[string]int64{
		v.Segments["expiresSoon"].SegmentID:  nowMs + 10*60*1000,
		v.Segments["expiredAtNow"].SegmentID: nowMs,
	}
	shiftExp := func(id string, exp int64) int64 {
		if o, ok := override[id]; ok {
			return o
		}
		return exp + delta
	}
	rows, err := src.Query(`SELECT segment_id, partition, log_epoch, tbl, schema_version, media_type, scope_digest,
		as_of_commit_seq, row_count, row_cursor, next_row_cursor, created_at_ms, expires_at_ms, bytes FROM sync_segments`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id string
		var p store.Publication
		var b []byte
		if err := rows.Scan(&id, &p.Partition, &p.LogEpoch, &p.Table, &p.SchemaVersion, &p.MediaType, &p.ScopeDigest,
			&p.AsOfCommitSeq, &p.RowCount, &p.RowCursor, &p.NextRowCursor, &p.CreatedAtMs, &p.ExpiresAtMs, &b); err != nil {
			t.Fatal(err)
		}
		p.CreatedAtMs += delta
		p.ExpiresAtMs = shiftExp(id, p.ExpiresAtMs)
		got, err := w.Put(seed.SegmentInput{Bytes: b, Publication: p, RowOnly: true})
		if err != nil || got != id {
			t.Fatalf("put %s: %v (%s)", id, err, got)
		}
		n++
	}
	rows.Close()
	if n != len(v.Segments) {
		t.Fatalf("copied %d segments, vectors name %d", n, len(v.Segments))
	}
	scopes, err := src.Query(`SELECT segment_id, scope_digest FROM sync_segment_scopes`)
	if err != nil {
		t.Fatal(err)
	}
	for scopes.Next() {
		var id, d string
		if err := scopes.Scan(&id, &d); err != nil {
			t.Fatal(err)
		}
		if err := w.AddScope(id, d); err != nil {
			t.Fatal(err)
		}
	}
	scopes.Close()
	pubs, err := src.Query(`SELECT segment_id, pub_key, partition, log_epoch, tbl, schema_version, media_type, scope_digest,
		as_of_commit_seq, row_count, row_cursor, next_row_cursor, byte_length, created_at_ms, expires_at_ms FROM sync_segment_publications`)
	if err != nil {
		t.Fatal(err)
	}
	for pubs.Next() {
		var id, key string
		var p store.Publication
		if err := pubs.Scan(&id, &key, &p.Partition, &p.LogEpoch, &p.Table, &p.SchemaVersion, &p.MediaType, &p.ScopeDigest,
			&p.AsOfCommitSeq, &p.RowCount, &p.RowCursor, &p.NextRowCursor, &p.ByteLength, &p.CreatedAtMs, &p.ExpiresAtMs); err != nil {
			t.Fatal(err)
		}
		p.CreatedAtMs += delta
		p.ExpiresAtMs = shiftExp(id, p.ExpiresAtMs)
		if err := w.AddPublication(id, key, p); err != nil {
			t.Fatal(err)
		}
	}
	pubs.Close()
	reg, err := src.Query(`SELECT partition, log_epoch FROM sync_partition_registry`)
	if err != nil {
		t.Fatal(err)
	}
	for reg.Next() {
		var p, e string
		if err := reg.Scan(&p, &e); err != nil {
			t.Fatal(err)
		}
		if err := w.SetEpoch(p, e, nowMs); err != nil {
			t.Fatal(err)
		}
	}
	reg.Close()
	return path
}

var expRe = regexp.MustCompile(`"exp":(-?[0-9]+)`)

// vectorStandIns are the keys the binary runs with in place of the
// vectors' own: those are shorter than the 16 bytes an edge accepts at
// provision (the verifier still accepts them; see caddymodule's vector
// tests), so the vector tokens are re-signed for the stand-ins.
type vectorStandIns struct{ cur, prev, aud string }

func newVectorStandIns(t *testing.T) vectorStandIns {
	return vectorStandIns{cur: randKey(t), prev: randKey(t), aud: randKey(t)}
}

// vectorPartitions are the partitions the gen3 vector tokens' audiences
// are derived from.
var vectorPartitions = []string{"p1", "p2", "p3-unregistered"}

var audRe = regexp.MustCompile(`"aud":"[^"]*"`)

// reissue moves a vector token to the real clock and to the stand-in
// keys: its payload's exp is shifted by deltaS (or set by setExp), its
// aud, when derived from a vector partition, is derived again under the
// stand-in audience key, and it is re-signed with the stand-in of the key
// that signed it (an unknown key stays unknown). Tokens that are not
// base64url JSON are returned unchanged.
func reissue(t *testing.T, tok string, v gen3Vectors, keys vectorStandIns, deltaS int64, setExp func(int64) int64) string {
	t.Helper()
	p64, m64, ok := strings.Cut(tok, ".")
	payload, err := base64.RawURLEncoding.DecodeString(p64)
	if !ok || err != nil || !expRe.Match(payload) {
		return tok
	}
	mac, _ := base64.RawURLEncoding.DecodeString(m64)
	key := []byte("an-unknown-key-of-32-bytes-00000")
	for _, k := range []struct{ vec, standIn string }{{v.Keys.Current, keys.cur}, {v.Keys.Previous, keys.prev}} {
		m := hmac.New(sha256.New, []byte(k.vec))
		m.Write(payload)
		if hmac.Equal(m.Sum(nil), mac) {
			key = []byte(k.standIn)
		}
	}
	payload = expRe.ReplaceAllFunc(payload, func(b []byte) []byte {
		old, _ := strconv.ParseInt(string(b[6:]), 10, 64)
		return []byte(`"exp":` + strconv.FormatInt(setExp(old+deltaS), 10))
	})
	oldAud, _ := token.HMACAudience([]byte(v.Audience.Key), "hex")
	newAud, _ := token.HMACAudience([]byte(keys.aud), "hex")
	payload = audRe.ReplaceAllFunc(payload, func(b []byte) []byte {
		for _, p := range vectorPartitions {
			if string(b) == `"aud":"`+oldAud.Derive(p)+`"` {
				return []byte(`"aud":"` + newAud.Derive(p) + `"`)
			}
		}
		return b
	})
	m := hmac.New(sha256.New, key)
	m.Write(payload)
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

type errJSON struct {
	Code              string `json:"code"`
	Category          string `json:"category"`
	Retryable         *bool  `json:"retryable"`
	RecommendedAction string `json:"recommendedAction"`
	Message           string `json:"message"`
}

func checkError(t *testing.T, r response, status int, code string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var e errJSON
	if err := json.Unmarshal(r.Body, &e); err != nil {
		t.Fatalf("error body not JSON: %s", r.Body)
	}
	if e.Code != code || e.Category == "" || e.Retryable == nil || e.RecommendedAction == "" || e.Message == "" {
		t.Fatalf("error body %+v, want code %s with catalog fields", e, code)
	}
}

func checkSegment(t *testing.T, r response, id string) {
	t.Helper()
	if r.Status != 200 {
		t.Fatalf("status %d, want 200: %s", r.Status, r.Body)
	}
	sum := sha256.Sum256(r.Body)
	if "sha256:"+hex.EncodeToString(sum[:]) != id {
		t.Fatalf("body (%d bytes) does not hash to %s", len(r.Body), id)
	}
	if r.Header.Get("ETag") != `"`+id+`"` || r.Header.Get("Content-Type") != "application/octet-stream" ||
		r.Header.Get("Content-Length") != strconv.Itoa(len(r.Body)) {
		t.Fatalf("headers: %v", r.Header)
	}
}

// TestSQLiteGen3 drives every case of segments-gen3.json through the real
// binary against a store generated now, while a writer keeps publishing
// new segments into the same file.
func TestSQLiteGen3(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(vectorsDir(t), "segments-gen3.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v gen3Vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	realNow := time.Now().Unix()
	deltaS := realNow - v.NowMs/1000
	dbPath := realClockStore(t, v, deltaS*1000)

	up, upHits := upstream(t)
	site := strings.NewReplacer("STORE_PATH", dbPath, "UPSTREAM", up).Replace(sqliteSite)
	keys := newVectorStandIns(t)
	c := startCaddy(t, site, "SEG_KEY="+keys.cur, "SEG_KEY_PREVIOUS="+keys.prev, "AUD_KEY="+keys.aud)

	// The writer: publishes new segments into the live file (WAL) while
	// the cases run; each is then downloaded with a fresh token.
	aud, _ := token.HMACAudience([]byte(keys.aud), "hex")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"writer"}})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var published, fetched atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		w, err := seed.Open(dbPath)
		if err != nil {
			t.Error(err)
			return
		}
		defer w.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := bytes.Repeat([]byte(fmt.Sprintf("SSG2 writer segment %d;", i)), 50+i)
			now := time.Now().UnixMilli()
			id, err := w.Put(seed.SegmentInput{Bytes: body, Publication: store.Publication{
				Partition: "p1", LogEpoch: "e1", Table: "tasks", SchemaVersion: 3, MediaType: "rows",
				ScopeDigest: digest, AsOfCommitSeq: int64(100 + i), RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 3600_000,
			}})
			if err != nil {
				t.Errorf("writer put: %v", err)
				return
			}
			published.Add(1)
			tok := token.Sign([]byte(keys.cur), id, digest, aud.Derive("p1"), time.Now().Unix()+600)
			r, err := try("GET", c.Base+"/segments/"+id+"?st="+tok, nil)
			if err != nil {
				t.Errorf("writer fetch: %v", err)
				return
			}
			if r.Status != 200 || r.Header.Get("ETag") != `"`+id+`"` {
				t.Errorf("freshly published segment: %d %s", r.Status, r.Body)
				return
			}
			sum := sha256.Sum256(r.Body)
			if "sha256:"+hex.EncodeToString(sum[:]) != id {
				t.Errorf("freshly published segment: wrong bytes")
				return
			}
			fetched.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()

	var tokens []string
	for round := 0; round < 10; round++ { // several rounds so the writer overlaps
		for _, tc := range v.Cases {
			t.Run(fmt.Sprintf("round%d/%s", round, tc.Name), func(t *testing.T) {
				target := c.Base + tc.Path
				if tc.Token != nil {
					keep := func(e int64) int64 { return e }
					if tc.Name == "token expired within skew" {
						// 59 s past exp in the vectors; give the test ten seconds of slack.
						keep = func(int64) int64 { return time.Now().Unix() - 50 }
					}
					tok := reissue(t, *tc.Token, v, keys, deltaS, keep)
					tokens = append(tokens, tok)
					target += "?st=" + tok
				}
				before := upHits()
				r := do(t, "GET", target, nil)
				switch st := tc.Expect.Status.(type) {
				case string:
					if r.Status != 200 || r.Header.Get("X-Upstream") != "sync-server" || upHits() != before+1 {
						t.Fatalf("not handed to the next handler: %d %s", r.Status, r.Body)
					}
				case float64:
					if st == 200 {
						checkSegment(t, r, v.Segments[tc.Expect.Segment].SegmentID)
						return
					}
					checkError(t, r, int(st), tc.Expect.Code)
				}
			})
		}
	}

	// HEAD, Range, If-None-Match, 405 on a granted URL.
	seg := v.Segments["bigImage"]
	var tok string
	for _, tc := range v.Cases {
		if tc.Name == "large sqlite image" {
			tok = reissue(t, *tc.Token, v, keys, deltaS, func(e int64) int64 { return e })
		}
	}
	url := c.Base + "/segments/" + seg.SegmentID + "?st=" + tok
	r := do(t, "HEAD", url, nil)
	if r.Status != 200 || len(r.Body) != 0 || r.Header.Get("Content-Length") != strconv.Itoa(seg.ByteLength) || r.Header.Get("ETag") != `"`+seg.SegmentID+`"` {
		t.Fatalf("HEAD: %d %v", r.Status, r.Header)
	}
	full := do(t, "GET", url, nil)
	checkSegment(t, full, seg.SegmentID)
	r = do(t, "GET", url, map[string]string{"Range": "bytes=1000-1999"})
	if r.Status != 206 || !bytes.Equal(r.Body, full.Body[1000:2000]) || r.Header.Get("Content-Range") != fmt.Sprintf("bytes 1000-1999/%d", seg.ByteLength) {
		t.Fatalf("Range: %d %v", r.Status, r.Header)
	}
	r = do(t, "GET", url, map[string]string{"Range": fmt.Sprintf("bytes=%d-", seg.ByteLength)})
	checkError(t, r, 416, "edge.range_not_satisfiable")
	r = do(t, "GET", url, map[string]string{"If-None-Match": `"` + seg.SegmentID + `"`})
	if r.Status != 304 || len(r.Body) != 0 {
		t.Fatalf("If-None-Match: %d", r.Status)
	}
	r = do(t, "DELETE", url, nil)
	checkError(t, r, 405, "edge.method_not_allowed")
	if r.Header.Get("Allow") != "GET, HEAD" {
		t.Fatalf("Allow %q", r.Header.Get("Allow"))
	}

	close(stop)
	wg.Wait()
	if fetched.Load() < 5 {
		t.Fatalf("writer published %d segments, only %d were fetched: the concurrent-writer check did not run", published.Load(), fetched.Load())
	}
	t.Logf("writer published %d segments during the run; all %d fetched correctly", published.Load(), fetched.Load())

	// Nothing secret in any log the binary wrote.
	c.Stop()
	secrets := append([]string{keys.cur, keys.prev, keys.aud, v.Keys.Current, v.Keys.Previous, v.Audience.Key, "p3-unregistered", `"p1"`, `"p2"`}, tokens...)
	for _, name := range []string{"server.log", "access.log"} {
		b, err := os.ReadFile(filepath.Join(c.Dir(), name))
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %v (empty: the log check would prove nothing)", name, err)
		}
		checkNoSecrets(t, name, string(b), secrets)
	}
	checkNoSecrets(t, "stderr", c.Output(), secrets)
}

func checkNoSecrets(t *testing.T, what, text string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if len(s) > 40 {
			// A token: its MAC part alone must not appear either.
			if _, mac, ok := strings.Cut(s, "."); ok && len(mac) > 20 && strings.Contains(text, mac) {
				t.Errorf("%s contains a token's MAC", what)
			}
		}
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s contains a secret or partition id (%d chars)", what, len(s))
		}
	}
}
