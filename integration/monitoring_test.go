package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// monitoringSite is an S3 edge with every kind of handler whose series
// the dashboard and the alerts read: a proxy handler with a disk tier
// (/p/), a redirect handler (/r/, the presign series), a handler with a
// store read gate of one slot and no queue (/tight/, for a refusal
// burst), and syncular_health at /healthz with a grace of 1s.
const monitoringSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
	handle /healthz {
		syncular_health {
			grace 1s
		}
	}
	syncular_segments /p/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery proxy
		store_timeout 1s
		cache {
			max_entry 16KiB
			disk {{DIR}}/segments
		}
	}
	syncular_segments /r/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery redirect
	}
	syncular_segments /tight/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery proxy
		store_concurrency 1
		store_queue 0
		cache {
			disk off
		}
	}
	respond 404
}
`

// monScale divides the alert rules' time windows and `for` durations,
// so that an alert meant to fire after 2 minutes of a fault fires here
// after 6 seconds.
const monScale = 20

// TestMonitoringOnPrometheus runs examples/monitoring on a real
// Prometheus (Debian's package) scraping the real edge every second:
// promtool checks and unit-tests the rules; a small storm, a refusal
// burst and a frozen versitygw (SIGSTOP) drive the edge; the overload
// and breaker alerts (time-scaled copies) fire while their fault lasts
// and resolve after it; every dashboard query and every alert and
// recording expression, evaluated through the HTTP API, returns series;
// and a query naming a metric that does not exist is caught.
func TestMonitoringOnPrometheus(t *testing.T) {
	promtool := monTool(t, "promtool")
	prometheus := monTool(t, "prometheus")
	mon := examplePath(t, "monitoring")
	for _, args := range [][]string{
		{"check", "rules", "rules.yml", "alerts.yml"},
		{"test", "rules", "rules_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = mon
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	const partition = "tenant-mon"
	digest := token.ScopeDigest(map[string][]string{"user_id": {"mon"}})
	segs := putSegments(t, srv, "segments", partition, digest, 40, 32<<10)
	keyCfg, key := exampleKey(t)
	c := startCaddy(t, strings.ReplaceAll(monitoringSite, "{{S3_SEGMENTS}}", s3ExampleStore), "SEG_KEY="+keyCfg, "S3_ENDPOINT="+srv.Endpoint,
		"S3_ACCESS_KEY="+srv.AccessKey, "S3_SECRET_KEY="+srv.SecretKey)
	exp := time.Now().Add(time.Hour).Unix()
	segURL := func(route, id string) string {
		return c.Base + "/" + route + "/segments/" + id + "?st=" + token.Sign(key, id, digest, "aud:"+partition, exp)
	}

	p := startPrometheus(t, prometheus, mon, c.AdminPort)

	// The storm: 16 clients × 12 segments through the proxy handler
	// (fills, followers, memory and disk hits), HEADs, refused tokens,
	// redirects.
	storm := segs[:12]
	var wg sync.WaitGroup
	var stormErr sync.Once
	var firstErr error
	for cl := 0; cl < 16; cl++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, s := range storm {
				if r, err := try("GET", segURL("p", s.id), nil); err != nil || r.Status != 200 {
					stormErr.Do(func() { firstErr = fmt.Errorf("storm: %d %v", r.Status, err) })
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	for _, s := range storm[:4] {
		do(t, "HEAD", segURL("p", s.id), nil)
		if r := do(t, "GET", segURL("r", s.id), nil); r.Status != 302 {
			t.Fatalf("redirect: %d %s", r.Status, r.Body)
		}
		bad := c.Base + "/p/segments/" + s.id + "?st=" + token.Sign([]byte("not-the-key-0123456789abcdef0123"), s.id, digest, "aud:"+partition, exp)
		if r := do(t, "GET", bad, nil); r.Status != 403 {
			t.Fatalf("bad token: %d", r.Status)
		}
	}

	// The refusal burst: 28 cold segments at once through a gate of one
	// slot and no queue, twice.
	burstAt := time.Now()
	refused := 0
	var mu sync.Mutex
	for round := 0; round < 2; round++ {
		for _, s := range segs[12:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r, err := try("GET", segURL("tight", s.id), nil); err == nil && r.Status == 503 && strings.Contains(string(r.Body), "edge.overloaded") {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	burstEnd := time.Now()
	if refused == 0 {
		t.Fatal("the refusal burst refused nothing")
	}
	t.Logf("refusal burst: %d of %d answered 503 edge.overloaded", refused, 2*len(segs[12:]))
	firedOverload := p.waitAlert(t, "SyncularOverloaded", "firing", 60*time.Second)
	t.Logf("SyncularOverloaded fired %.1fs after the refusal burst began", firedOverload.Sub(burstAt).Seconds())

	// Freeze the store: cold lookups time out (store_timeout 1s) and
	// open the breaker; /healthz turns 503 after its 1s grace.
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := true
	defer func() {
		if frozen {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	frozenAt := time.Now()
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("sha256:%064x", 0xf00d+i)
			try("GET", segURL("p", id), nil)
		}()
	}
	wg.Wait()
	var health response
	if waitFor(10*time.Second, func() bool {
		health = do(t, "GET", c.Base+"/healthz", nil)
		return health.Status == 503
	}) < 0 {
		t.Fatalf("/healthz with the store frozen: %d %s", health.Status, health.Body)
	}
	if !strings.Contains(string(health.Body), `"breaker":"open"`) {
		t.Fatalf("/healthz body: %s", health.Body)
	}
	firedBreaker := p.waitAlert(t, "SyncularStoreBreakerOpen", "firing", 60*time.Second)
	t.Logf("SyncularStoreBreakerOpen fired %.1fs after versitygw froze", firedBreaker.Sub(frozenAt).Seconds())

	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	frozen = false
	thawedAt := time.Now()
	resolvedBreaker := p.waitAlert(t, "SyncularStoreBreakerOpen", "", 60*time.Second)
	t.Logf("SyncularStoreBreakerOpen resolved %.1fs after versitygw resumed", resolvedBreaker.Sub(thawedAt).Seconds())
	if r := do(t, "GET", c.Base+"/healthz", nil); r.Status != 200 {
		t.Fatalf("/healthz after the store resumed: %d %s", r.Status, r.Body)
	}
	resolvedOverload := p.waitAlert(t, "SyncularOverloaded", "", 60*time.Second)
	t.Logf("SyncularOverloaded resolved %.1fs after the last refusal (its rate window is %ds)", resolvedOverload.Sub(burstEnd).Seconds(), 5*60/monScale)

	// Every query of the dashboard, every recording rule and every alert
	// expression returns series now.
	dash := readDashboard(t, filepath.Join(mon, "dashboard.json"))
	var queries []string
	for _, q := range dash.prometheus {
		queries = append(queries, strings.ReplaceAll(q, "$__rate_interval", "3m"))
	}
	if len(dash.panels) < 16 || len(queries) < 16 {
		t.Fatalf("dashboard: %d panels, %d Prometheus queries", len(dash.panels), len(queries))
	}
	t.Logf("dashboard: %d panels, %d Prometheus queries evaluated, %d queries of other data sources not evaluated here", len(dash.panels), len(queries), dash.other)
	rules := readRules(t, filepath.Join(mon, "rules.yml"), filepath.Join(mon, "alerts.yml"))
	alerts := 0
	for _, r := range rules {
		if r.Record != "" {
			queries = append(queries, r.Record, r.Expr)
			continue
		}
		alerts++
		queries = append(queries, withBool(t, r.Expr))
	}
	t.Logf("rules: %d recording, %d alerts evaluated", len(rules)-alerts, alerts)
	if dead := p.deadQueries(t, queries); len(dead) > 0 {
		t.Errorf("queries that return no series:\n%s", strings.Join(dead, "\n"))
	}
	// The check catches a query naming a metric that does not exist.
	planted := "sum(rate(caddy_syncular_no_such_family_total[3m]))"
	if dead := p.deadQueries(t, []string{planted}); len(dead) != 1 {
		t.Errorf("a query of a missing metric was not caught: %v", dead)
	}
}

// monTool finds a tool of Debian's prometheus package (scripts/tools.sh
// prometheus installs it); the test fails without it.
func monTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found (run scripts/tools.sh prometheus): %v", name, err)
	}
	return p
}

// promProc is a Prometheus server of the test's own, on loopback.
type promProc struct {
	base string
}

// startPrometheus runs Prometheus on a fresh loopback port with its own
// storage, scraping the edge's admin /metrics every second, with
// time-scaled copies of the monitoring rules (monScale).
func startPrometheus(t *testing.T, bin, mon string, adminPort int) *promProc {
	t.Helper()
	dir := t.TempDir()
	var files []string
	for _, name := range []string{"rules.yml", "alerts.yml"} {
		b, err := os.ReadFile(filepath.Join(mon, name))
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, name)
		if err := os.WriteFile(out, []byte(scaleRules(string(b))), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, out)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [%q, %q]
scrape_configs:
  - job_name: syncular
    static_configs:
      - targets: ["127.0.0.1:%d"]
`, files[0], files[1], adminPort)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	port, addr := loopback(t)
	_ = port
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	p := &promProc{base: "http://" + addr}
	if waitFor(30*time.Second, func() bool {
		var up struct {
			Data struct {
				ActiveTargets []struct {
					Health string `json:"health"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := p.get("/api/v1/targets", nil, &up); err != nil {
			return false
		}
		return len(up.Data.ActiveTargets) == 1 && up.Data.ActiveTargets[0].Health == "up"
	}) < 0 {
		t.Fatalf("prometheus did not scrape the edge within 30s:\n%s", out.String())
	}
	return p
}

var (
	rangeRe = regexp.MustCompile(`\[(\d+)m\]`)
	forRe   = regexp.MustCompile(`(?m)^(\s*for:\s*)(\d+)m\s*$`)
)

// scaleRules divides every range window and `for` of a rules file by
// monScale (in seconds).
func scaleRules(s string) string {
	s = rangeRe.ReplaceAllStringFunc(s, func(m string) string {
		n, _ := strconv.Atoi(rangeRe.FindStringSubmatch(m)[1])
		return fmt.Sprintf("[%ds]", n*60/monScale)
	})
	return forRe.ReplaceAllStringFunc(s, func(m string) string {
		sm := forRe.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sm[2])
		return fmt.Sprintf("%s%ds", sm[1], n*60/monScale)
	})
}

func (p *promProc) get(path string, q url.Values, v any) error {
	u := p.base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	res, err := http.Get(u)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != 200 {
		return fmt.Errorf("%s: %d %s", path, res.StatusCode, b)
	}
	return json.Unmarshal(b, v)
}

// alertState is the state of alertname now: "pending", "firing" or ""
// (inactive).
func (p *promProc) alertState(t *testing.T, name string) string {
	t.Helper()
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/alerts", nil, &r); err != nil {
		t.Fatal(err)
	}
	state := ""
	for _, a := range r.Data.Alerts {
		if a.Labels["alertname"] == name && (state == "" || a.State == "firing") {
			state = a.State
		}
	}
	return state
}

// waitAlert waits until alertname is in state and returns when it was
// seen so.
func (p *promProc) waitAlert(t *testing.T, name, state string, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if p.alertState(t, name) == state {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("alert %s not %q within %v", name, state, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// deadQueries evaluates each query now and returns those that fail or
// return no series.
func (p *promProc) deadQueries(t *testing.T, queries []string) []string {
	t.Helper()
	var dead []string
	for _, q := range queries {
		var r struct {
			Data struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := p.get("/api/v1/query", url.Values{"query": {q}}, &r); err != nil {
			dead = append(dead, q+": "+err.Error())
		} else if len(r.Data.Result) == 0 {
			dead = append(dead, q)
		}
	}
	return dead
}

// cmpRe is an alert expression's last comparison with a number.
var cmpRe = regexp.MustCompile(`^(.*\S)\s+(>|<|>=|<=|==|!=)\s+([0-9.]+)$`)

// withBool turns `expr > N` into `expr > bool N`: series whether or not
// the alert would fire. alerts.yml keeps every expression in that form.
func withBool(t *testing.T, expr string) string {
	t.Helper()
	expr = strings.TrimSpace(expr)
	sm := cmpRe.FindStringSubmatch(expr)
	if sm == nil {
		t.Fatalf("alert expression %q does not end in a comparison with a number", expr)
	}
	return sm[1] + " " + sm[2] + " bool " + sm[3]
}

// rule is one rule of a rules file (the fields the test reads).
type rule struct {
	Record, Alert, Expr string
}

// readRules reads the rules of rules files with promtool's own parser
// avoided: the files are small YAML of a known shape (`- record:` /
// `- alert:` then `expr:`, a folded `>-` block or one line).
func readRules(t *testing.T, paths ...string) []rule {
	t.Helper()
	var out []rule
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		var cur *rule
		folding := false
		indent := 0
		for sc.Scan() {
			line := sc.Text()
			trim := strings.TrimSpace(line)
			if folding {
				if trim != "" && len(line)-len(strings.TrimLeft(line, " ")) > indent {
					cur.Expr += " " + trim
					continue
				}
				folding = false
			}
			switch {
			case strings.HasPrefix(trim, "- record:"), strings.HasPrefix(trim, "- alert:"):
				out = append(out, rule{})
				cur = &out[len(out)-1]
				v := strings.TrimSpace(trim[strings.Index(trim, ":")+1:])
				if strings.HasPrefix(trim, "- record:") {
					cur.Record = v
				} else {
					cur.Alert = v
				}
			case strings.HasPrefix(trim, "expr:") && cur != nil:
				v := strings.TrimSpace(strings.TrimPrefix(trim, "expr:"))
				if v == ">-" || v == ">" || v == "|" {
					folding = true
					indent = len(line) - len(strings.TrimLeft(line, " "))
					continue
				}
				cur.Expr = v
			}
		}
		f.Close()
	}
	for _, r := range out {
		if r.Expr == "" {
			t.Fatalf("rule %s%s without an expression", r.Record, r.Alert)
		}
	}
	if len(out) == 0 {
		t.Fatal("no rules read")
	}
	return out
}

// dashboard is what the test reads of dashboard.json.
type dashboard struct {
	panels     []string
	prometheus []string // every Prometheus target's expression
	other      int      // targets of other data sources (the access-log panel)
}

func readDashboard(t *testing.T, path string) dashboard {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type ds struct {
		Type string `json:"type"`
	}
	var d struct {
		Panels []struct {
			Title      string `json:"title"`
			Datasource ds     `json:"datasource"`
			Targets    []struct {
				Expr       string `json:"expr"`
				Datasource *ds    `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var out dashboard
	for _, p := range d.Panels {
		out.panels = append(out.panels, p.Title)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			typ := p.Datasource.Type
			if tg.Datasource != nil {
				typ = tg.Datasource.Type
			}
			switch {
			case tg.Expr == "":
				t.Errorf("panel %q: a target without an expression", p.Title)
			case typ == "prometheus":
				out.prometheus = append(out.prometheus, tg.Expr)
			default:
				out.other++
			}
		}
	}
	sort.Strings(out.panels)
	return out
}

// documentedSite runs every kind of store and handler in one process, so
// that every family the module can expose is on its /metrics: a SQLite
// handler, an S3 proxy handler with a disk tier, an S3 redirect handler.
const documentedSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
	syncular_segments /sqlite/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite STORE_PATH
	}
	syncular_segments /p/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery proxy
		cache {
			disk {{DIR}}/segments
		}
	}
	syncular_segments /r/segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		{{S3_SEGMENTS}}
		delivery redirect
	}
	respond 404
}
`

// TestMetricsDocumented: every caddy_syncular_* family on /metrics is in
// docs/observability.md or docs/operations.md, and every family those
// docs name (outside the table of renamed metrics) is on /metrics.
func TestMetricsDocumented(t *testing.T) {
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"doc"}})
	dbPath, sqliteID := seedOne(t, "tenant-doc", digest, []byte("SSG2 a segment of the documented metrics test"))
	s3Segs := putSegments(t, srv, "segments", "tenant-doc", digest, 1, 4<<10)
	keyCfg, key := exampleKey(t)
	c := startCaddy(t, strings.NewReplacer("STORE_PATH", dbPath, "{{S3_SEGMENTS}}", s3ExampleStore).Replace(documentedSite), "SEG_KEY="+keyCfg, "S3_ENDPOINT="+srv.Endpoint,
		"S3_ACCESS_KEY="+srv.AccessKey, "S3_SECRET_KEY="+srv.SecretKey)
	exp := time.Now().Add(time.Hour).Unix()
	// One answer of each handler, so that the histograms have series.
	for route, id := range map[string]string{"sqlite": sqliteID, "p": s3Segs[0].id, "r": s3Segs[0].id} {
		u := c.Base + "/" + route + "/segments/" + id + "?st=" + token.Sign(key, id, digest, "aud:tenant-doc", exp)
		if r := do(t, "GET", u, nil); r.Status != 200 && r.Status != 302 {
			t.Fatalf("%s: %d %s", route, r.Status, r.Body)
		}
	}
	r := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/metrics", c.AdminPort), nil)
	exposed := map[string]string{} // family -> type
	typeRe := regexp.MustCompile(`(?m)^# TYPE (caddy_syncular_\w+) (\w+)$`)
	for _, m := range typeRe.FindAllStringSubmatch(string(r.Body), -1) {
		exposed[m[1]] = m[2]
	}
	if len(exposed) < 40 {
		t.Fatalf("%d caddy_syncular_ families on /metrics", len(exposed))
	}
	// The binary says the version make caddy stamped into it (bin/.version,
	// scripts/version.sh's answer), the one list-modules shows.
	want := `v\d+\.\d+\.\d+[^"]*`
	if v, err := os.ReadFile(filepath.Join(filepath.Dir(caddyBinary(t)), ".version")); err == nil {
		want = regexp.QuoteMeta(strings.TrimSpace(string(v)))
	}
	if bi := regexp.MustCompile(`(?m)^caddy_syncular_build_info\{caddy_version="v2\.[^"]+",go_version="go[^"]+",version="` + want + `"\} 1$`); !bi.Match(r.Body) {
		t.Errorf("no build_info series with version %s:\n%s", want, regexp.MustCompile(`(?m)^caddy_syncular_build_info.*$`).Find(r.Body))
	}

	documented := map[string]string{} // family -> doc file
	nameRe := regexp.MustCompile(`caddy_syncular_[a-z0-9_]*[a-z0-9]`)
	for _, name := range []string{"observability.md", "operations.md"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", name))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		// The renames table names the old families on purpose.
		if i := strings.Index(text, "## Renamed metrics"); i >= 0 {
			j := strings.Index(text[i+1:], "\n## ")
			if j < 0 {
				j = len(text) - i - 1
			}
			text = text[:i] + text[i+1+j:]
		}
		for _, n := range nameRe.FindAllString(text, -1) {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if base := strings.TrimSuffix(n, suffix); base != n && exposed[base] == "histogram" {
					n = base
				}
			}
			documented[n] = name
		}
	}
	var missing, stale []string
	for n := range exposed {
		if documented[n] == "" {
			missing = append(missing, n)
		}
	}
	for n, doc := range documented {
		if exposed[n] == "" {
			stale = append(stale, n+" ("+doc+")")
		}
	}
	sort.Strings(missing)
	sort.Strings(stale)
	if len(missing) > 0 {
		t.Errorf("on /metrics but in no doc:\n%s", strings.Join(missing, "\n"))
	}
	if len(stale) > 0 {
		t.Errorf("in the docs but not on /metrics:\n%s", strings.Join(stale, "\n"))
	}
}
