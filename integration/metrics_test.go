package integration

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/token"
)

// metricsSite runs two syncular_segments handlers (so the second
// registration of the collectors in one config is exercised) with two
// keys, current first; secrets come from the environment.
const metricsSite = `{
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
		key {env.SEG_KEY} {env.SEG_KEY_OLD}
		audience hmac_sha256 {env.AUD_KEY}
		store sqlite STORE_PATH
		untokened reject
		SKEW
	}
	syncular_segments /other/segments/* {
		key {env.SEG_KEY}
		audience hmac_sha256 {env.AUD_KEY}
		store sqlite STORE_PATH
	}
	respond 404
}
`

// TestMetricsEndpoint drives the real binary with granted, refused (bad
// MAC, wrong audience, no token) and expired requests, some signed with
// the old key, and reads the counts back from the admin /metrics
// endpoint; then reloads and checks that the counts carry on.
func TestMetricsEndpoint(t *testing.T) {
	body := []byte("SSG2 metrics test segment; the bytes are what the client hashes")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"u1"}})
	dbPath, id := seedOne(t, "tenant-p1", digest, body)

	keyNew, keyOld, audKey := "metrics-key-new-7f3a", "metrics-key-old-19c2", "metrics-aud-key-55e1"
	aud, _ := token.HMACAudience([]byte(audKey), "hex")
	audP1, audP2 := aud.Derive("tenant-p1"), aud.Derive("tenant-p2")
	site := strings.NewReplacer("STORE_PATH", dbPath, "SKEW", "skew 60s").Replace(metricsSite)
	c := startCaddy(t, site, "SEG_KEY="+keyNew, "SEG_KEY_OLD="+keyOld, "AUD_KEY="+audKey)

	exp, past := time.Now().Unix()+600, time.Now().Unix()-300
	sign := func(key, a string, e int64) string { return token.Sign([]byte(key), id, digest, a, e) }
	var tokens []string
	get := func(tok string, wantStatus int) {
		t.Helper()
		u := c.Base + "/segments/" + id
		if tok != "" {
			tokens = append(tokens, tok)
			u += "?st=" + tok
		}
		if r := do(t, "GET", u, nil); r.Status != wantStatus {
			t.Fatalf("status %d, want %d: %s", r.Status, wantStatus, r.Body)
		}
	}
	for range 3 {
		get(sign(keyNew, audP1, exp), 200) // granted, slot 1
	}
	for range 2 {
		get(sign(keyOld, audP1, exp), 200) // granted, slot 2
	}
	for range 2 {
		get(sign("an-unknown-key", audP1, exp), 403) // bad MAC, slot none
	}
	for range 2 {
		get(sign(keyNew, audP1, past), 403) // expired, slot 1
	}
	get(sign(keyOld, audP1, past), 403) // expired, slot 2
	get(sign(keyNew, audP2, exp), 403)  // another tenant's audience, slot 1
	get("", 403)                        // no token (untokened reject): no verification

	m := scrape(t, c)
	want := []struct {
		series string
		v      float64
	}{
		{`caddy_syncular_requests_total{delivery="serve",outcome="granted",server="srv0"}`, 5},
		{`caddy_syncular_requests_total{delivery="serve",outcome="sync.forbidden",server="srv0"}`, 7},
		{`caddy_syncular_token_verifications_total{server="srv0",slot="1"}`, 6},
		{`caddy_syncular_token_verifications_total{server="srv0",slot="2"}`, 3},
		{`caddy_syncular_token_verifications_total{server="srv0",slot="none"}`, 2},
		{`caddy_syncular_bytes_served_total{delivery="serve",server="srv0"}`, float64(5 * len(body))},
	}
	for _, w := range want {
		if got, ok := m[w.series]; !ok || got != w.v {
			t.Errorf("%s = %v (present %v), want %v", w.series, got, ok, w.v)
		}
	}
	// store_duration_seconds counts store calls, not cache hits: of the 6
	// record lookups and 5 body opens, the first of each went to the store
	// and most of the rest were answered from the cache (a record older
	// than record_ttl on a slow machine is read again, and counted).
	for op, max := range map[string]float64{"lookup": 6, "open": 5} {
		s := `caddy_syncular_store_duration_seconds_count{backend="sqlite",op="` + op + `",server="srv0"}`
		if got := m[s]; got < 1 || got >= max {
			t.Errorf("%s = %v, want at least 1 and fewer than the %v requests (hits are not store calls)", s, got, max)
		}
	}
	if _, ok := m[`caddy_syncular_store_duration_seconds_count{backend="sqlite",op="presign",server="srv0"}`]; ok {
		t.Error("a presign series on a handler that does not redirect")
	}
	if t.Failed() {
		t.Fatalf("scraped:\n%s", dumpSyncular(m))
	}

	// A reload builds a new registry; the counts carry on.
	if err := c.Reload(strings.NewReplacer("STORE_PATH", dbPath, "SKEW", "skew 61s").Replace(metricsSite)); err != nil {
		t.Fatal(err)
	}
	get(sign(keyOld, audP1, exp), 200)
	m = scrape(t, c)
	if got := m[`caddy_syncular_requests_total{delivery="serve",outcome="granted",server="srv0"}`]; got != 6 {
		t.Fatalf("granted after reload = %v, want 6\n%s", got, dumpSyncular(m))
	}
	if got := m[`caddy_syncular_token_verifications_total{server="srv0",slot="2"}`]; got != 4 {
		t.Fatalf("slot 2 after reload = %v, want 4", got)
	}

	// The debug log has one decision line per request, with the key
	// slot, and nothing secret in any log.
	c.Stop()
	srv, err := os.ReadFile(filepath.Join(c.Dir(), "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(srv), `"msg":"segment decision"`); n != 13 {
		t.Errorf("%d decision lines in server.log, want 13", n)
	}
	if !regexp.MustCompile(`"segment decision".*"outcome":"granted".*"key_slot":"2".*"aud_hash":"[0-9a-f]{8}"`).Match(srv) {
		t.Errorf("no granted decision line with key_slot 2 and aud_hash in server.log")
	}
	secrets := append([]string{keyNew, keyOld, audKey, "tenant-p1", "tenant-p2", audP1, audP2}, tokens...)
	for _, name := range []string{"server.log", "access.log"} {
		b, err := os.ReadFile(filepath.Join(c.Dir(), name))
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %v (empty)", name, err)
		}
		checkNoSecrets(t, name, string(b), secrets)
	}
	checkNoSecrets(t, "stderr", c.Output(), secrets)
}

var seriesRe = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$`)

// scrape reads the admin endpoint's /metrics (Prometheus text format)
// into series -> value, labels sorted as the exposition writes them.
func scrape(t *testing.T, c *caddyProc) map[string]float64 {
	t.Helper()
	r := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/metrics", c.AdminPort), nil)
	if r.Status != 200 {
		t.Fatalf("/metrics: %d %s", r.Status, r.Body)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(r.Body)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if sm := seriesRe.FindStringSubmatch(sc.Text()); sm != nil {
			if v, err := strconv.ParseFloat(sm[2], 64); err == nil {
				m[sm[1]] = v
			}
		}
	}
	return m
}

func dumpSyncular(m map[string]float64) string {
	var b strings.Builder
	for k, v := range m {
		if strings.HasPrefix(k, "caddy_syncular_") && !strings.Contains(k, "_bucket") {
			fmt.Fprintf(&b, "%s %v\n", k, v)
		}
	}
	return b.String()
}

// twoSites are two sites on two ports (two servers of Caddy's http app,
// srv0 and srv1 from the adapter), each with its own handler.
const twoSites = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience hmac_sha256 {env.AUD_KEY}
		store sqlite STORE_PATH
	}
	respond 404
}

http://127.0.0.1:PORT2 {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience hmac_sha256 {env.AUD_KEY}
		store sqlite STORE_PATH
	}
	respond 404
}
`

// TestMetricsPerServer: requests to two sites land in two series of
// each per-request metric, told apart by the server label.
func TestMetricsPerServer(t *testing.T) {
	body := []byte("SSG2 per-server metrics segment")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"u1"}})
	dbPath, id := seedOne(t, "tenant-p1", digest, body)
	segKey, audKey := randomKey(t), randomKey(t)
	port2 := freePort(t)
	site := strings.NewReplacer("STORE_PATH", dbPath, "PORT2", strconv.Itoa(port2)).Replace(twoSites)
	c := startCaddy(t, site, "SEG_KEY="+segKey, "AUD_KEY="+audKey)

	aud, _ := token.HMACAudience([]byte(audKey), "hex")
	tok := token.Sign([]byte(segKey), id, digest, aud.Derive("tenant-p1"), time.Now().Unix()+600)
	first, second := c.Base, fmt.Sprintf("http://127.0.0.1:%d", port2)
	for _, base := range []string{first, first, second} {
		if r := do(t, "GET", base+"/segments/"+id+"?st="+tok, nil); r.Status != 200 {
			t.Fatalf("%s: %d %s", base, r.Status, r.Body)
		}
	}

	m := scrape(t, c)
	granted := regexp.MustCompile(`^caddy_syncular_requests_total\{delivery="serve",outcome="granted",server="([^"]+)"\}$`)
	bytes := regexp.MustCompile(`^caddy_syncular_bytes_served_total\{delivery="serve",server="([^"]+)"\}$`)
	byServer, bytesByServer := map[string]float64{}, map[string]float64{}
	for series, v := range m {
		if sm := granted.FindStringSubmatch(series); sm != nil {
			byServer[sm[1]] = v
		}
		if sm := bytes.FindStringSubmatch(series); sm != nil {
			bytesByServer[sm[1]] = v
		}
	}
	if len(byServer) != 2 {
		t.Fatalf("granted series by server %v, want two server label values\n%s", byServer, dumpSyncular(m))
	}
	var counts []float64
	for server, v := range byServer {
		counts = append(counts, v)
		if want := v * float64(len(body)); bytesByServer[server] != want {
			t.Errorf("bytes_served_total{server=%q} = %v, want %v", server, bytesByServer[server], want)
		}
	}
	if !(counts[0] == 2 && counts[1] == 1) && !(counts[0] == 1 && counts[1] == 2) {
		t.Fatalf("granted by server %v, want 2 on one site and 1 on the other", byServer)
	}
}

// randomKey is a fresh 32-byte key, hex-encoded (used as text, 64 bytes).
func randomKey(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
