// Command syncular-demo is `make demo` and `make demo-s3`: a playground
// for the edge. It seeds a segment store (a SQLite file in the reference
// layout, or with -s3 a versitygw bucket written the way the reference
// S3SegmentStore writes it), starts bin/caddy in front of a stand-in sync
// server, and prints a signed URL that downloads a segment, one that is
// refused, the metrics URL, and a `caddy syncular-token inspect` command
// line. Keys are random per run (32 bytes each) and reach Caddy through
// the environment, as in production; they are also written to
// <dir>/keys.env (mode 0600) as `export NAME=value` lines with the names
// the Caddyfile reads.
//
//	go run ./cmd/syncular-demo [-caddy bin/caddy] [-dir .demo] [-check]
//	go run ./cmd/syncular-demo -s3 [-versitygw .tools/bin/versitygw] ...
//
// -check exits after verifying the URLs, the metrics and the inspect
// command (used by the integration tests). Ctrl-C stops Caddy (and
// versitygw) and exits.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/token"
)

func main() {
	var o options
	flag.StringVar(&o.caddy, "caddy", "bin/caddy", "Caddy binary built by `make caddy`")
	flag.StringVar(&o.config, "config", "", "Caddyfile to run (default Caddyfile.example, with -s3 examples/demo-s3.Caddyfile)")
	flag.StringVar(&o.dir, "dir", ".demo", "working directory for the store, keys.env and logs")
	flag.BoolVar(&o.check, "check", false, "verify the URLs, metrics and inspect command, then exit")
	flag.BoolVar(&o.s3, "s3", false, "segments from a versitygw bucket (redirect and proxy delivery)")
	flag.StringVar(&o.versitygw, "versitygw", envOr("VERSITYGW", ".tools/bin/versitygw"), "versitygw binary (scripts/tools.sh versitygw)")
	flag.Parse()
	if o.config == "" {
		o.config = "Caddyfile.example"
		if o.s3 {
			o.config = "examples/demo-s3.Caddyfile"
		}
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type options struct {
	caddy, config, dir, versitygw string
	check, s3                     bool
}

type demoSegment struct {
	id, partition, digest string
	media                 string
}

// env is the environment of the Caddy process, in order: the names the
// Caddyfile reads. keys.env holds them all.
type env [][2]string

func (e *env) set(name, value string) { *e = append(*e, [2]string{name, value}) }

func (e env) list() []string {
	out := make([]string, len(e))
	for i, kv := range e {
		out[i] = kv[0] + "=" + kv[1]
	}
	return out
}

func run(o options) error {
	// Ctrl-C (or SIGTERM) at any point ends the demo through the deferred
	// stops below.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := os.Stat(o.caddy); err != nil {
		return fmt.Errorf("%s missing: run `make caddy` (or `make demo`, which builds it)", o.caddy)
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}

	segKey, audKey := randomHex(32), randomHex(32)
	var e env
	e.set("SYNCULAR_SEGMENT_KEY", segKey)
	e.set("SYNCULAR_AUDIENCE_KEY", audKey)

	var segs []demoSegment
	where, s3Endpoint := "", ""
	if o.s3 {
		gw, err := startS3(ctx, o.versitygw, dir)
		if err != nil {
			return err
		}
		defer gw.stop()
		if segs, err = seedS3(ctx, gw, dir); err != nil {
			return fmt.Errorf("seeding the bucket: %w", err)
		}
		s3Endpoint = gw.endpoint
		e.set("SYNCULAR_S3_ENDPOINT", gw.endpoint)
		e.set("SYNCULAR_S3_ACCESS_KEY_ID", gw.accessKey)
		e.set("SYNCULAR_S3_SECRET_ACCESS_KEY", gw.secretKey)
		e.set("SYNCULAR_S3_BUCKET", demoBucket)
		e.set("SYNCULAR_S3_PREFIX", demoPrefix)
		e.set("SYNCULAR_S3_REGION", demoRegion)
		where = fmt.Sprintf("bucket %s at %s (versitygw, data in %s)", demoBucket, gw.endpoint, gw.dataDir)
	} else {
		dbPath := filepath.Join(dir, "sync.db")
		for _, suffix := range []string{"", "-wal", "-shm"} {
			_ = os.Remove(dbPath + suffix)
		}
		if segs, err = seedStore(dbPath, dir); err != nil {
			return fmt.Errorf("seeding %s: %w", dbPath, err)
		}
		e.set("SYNCULAR_DB", dbPath)
		where = "store " + dbPath
	}

	// A stand-in for the sync server: the direct path lands here.
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer upstream.Close()
	go http.Serve(upstream, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "sync server stand-in: %s %s (a real sync server re-authorizes this request)\n", r.Method, r.URL.Path)
	}))

	port, admin, proxyPort := freePort(), freePort(), freePort()
	e.set("SYNCULAR_SITE_ADDRESS", fmt.Sprintf(":%d", port)) // default_bind keeps it on loopback
	if o.s3 {
		e.set("SYNCULAR_PROXY_SITE_ADDRESS", fmt.Sprintf(":%d", proxyPort))
	}
	e.set("SYNCULAR_ADMIN", fmt.Sprintf("127.0.0.1:%d", admin))
	e.set("SYNCULAR_UPSTREAM", upstream.Addr().String())
	if !o.s3 {
		e.set("SYNCULAR_ACCESS_LOG", filepath.Join(dir, "access.log"))
	}
	keysPath := filepath.Join(o.dir, "keys.env")
	if err := writeKeys(keysPath, e); err != nil {
		return err
	}

	logPath := filepath.Join(dir, "caddy.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(o.caddy, "run", "--config", o.config, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), e.list()...)
	cmd.Env = append(cmd.Env,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	caddy, err := startProc(cmd)
	if err != nil {
		return err
	}
	defer caddy.stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := waitListening(ctx, port, 30*time.Second, caddy.exited); err != nil {
		return fmt.Errorf("caddy did not start (see %s): %w", logPath, err)
	}

	aud, _ := token.HMACAudience([]byte(audKey), "hex")
	exp := time.Now().Add(15 * time.Minute).Unix()
	good := segs[0]
	goodPath := fmt.Sprintf("/sync/segments/%s?st=%s", good.id, token.Sign([]byte(segKey), good.id, good.digest, aud.Derive(good.partition), exp))
	goodURL := base + goodPath
	// Refused: a valid token of the other tenant for this segment.
	other := segs[2]
	badURL := fmt.Sprintf("%s/sync/segments/%s?st=%s", base, good.id, token.Sign([]byte(segKey), good.id, good.digest, aud.Derive(other.partition), exp))
	proxyURL := fmt.Sprintf("http://127.0.0.1:%d%s", proxyPort, goodPath)

	if err := expect(goodURL, 200, good.id); err != nil {
		return err
	}
	if err := expect(badURL, 403, ""); err != nil {
		return err
	}
	if o.s3 {
		if err := expectRedirect(goodURL, s3Endpoint); err != nil {
			return err
		}
		if err := expect(proxyURL, 200, good.id); err != nil {
			return fmt.Errorf("proxy site: %w", err)
		}
	}
	// A second download of the segment comes from the edge's memory
	// (on the proxy site with S3: the redirect site's bytes are the
	// bucket's), and says so in Cache-Status.
	cacheURL := goodURL
	if o.s3 {
		cacheURL = proxyURL
	}
	cacheStatus, err := cacheStatusOf(cacheURL)
	if err != nil {
		return err
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", admin)
	if err := expectMetrics(metricsURL, o.s3); err != nil {
		return err
	}
	inspect := fmt.Sprintf("(set -a; . %s; %s syncular-token inspect --config %s --partition %s '%s')", keysPath, o.caddy, o.config, good.partition, goodURL)
	inspectBad := fmt.Sprintf("(set -a; . %s; %s syncular-token inspect --config %s --partition %s '%s')", keysPath, o.caddy, o.config, good.partition, badURL)
	if o.check {
		if err := expectInspect(inspect, inspectBad); err != nil {
			return err
		}
	}

	fmt.Printf("\ncaddy-syncular demo: Caddy %s on %s with %s, %s\n", o.caddy, base, o.config, where)
	fmt.Printf("logs: %s (server)", logPath)
	if !o.s3 {
		fmt.Printf(", %s (access, st removed)", filepath.Join(dir, "access.log"))
	}
	fmt.Printf("\nkeys: %s (export lines, mode 0600, the names %s reads)\n\n", keysPath, o.config)
	if o.s3 {
		fmt.Println("Redirects to a presigned GET of the bucket (302; curl -L downloads, the bytes hash to the id):")
	} else {
		fmt.Println("Downloads a segment (200, the bytes hash to the id):")
	}
	fmt.Println(goodURL)
	fmt.Println()
	if o.s3 {
		fmt.Println("The same token on the proxy site (200, the edge streams the bytes from the bucket):")
		fmt.Println(proxyURL)
		fmt.Println()
	}
	fmt.Println("Cache-Status of a second download: " + cacheStatus)
	fmt.Println()
	fmt.Println("Refused (403 sync.forbidden: a token for another tenant's audience):")
	fmt.Println(badURL)
	fmt.Println()
	fmt.Println("Metrics (caddy_syncular_* series, one server label per site):")
	fmt.Println(metricsURL)
	fmt.Println()
	fmt.Println("Inspect the token with the config's keys (exits 1 for the refused URL):")
	fmt.Println(inspect)
	fmt.Println()
	fmt.Printf("Try: curl -sSL -o seg.bin -D - '%s' && sha256sum seg.bin\n", goodURL)
	fmt.Printf("     curl -sS '%s'\n", badURL)
	fmt.Printf("     curl -sS %s | grep ^caddy_syncular_requests_total\n", metricsURL)
	fmt.Println("Without ?st= the request goes on to the sync server (reverse_proxy).")
	if o.check {
		fmt.Println("demo check passed")
		return nil
	}
	fmt.Println("\nPress Ctrl-C to stop.")
	select {
	case <-ctx.Done():
		fmt.Println("\nstopping")
	case err := <-caddy.exited:
		caddy.exited <- err
		return fmt.Errorf("caddy exited: %w (see %s)", err, logPath)
	}
	return nil
}

// writeKeys writes the environment as `export NAME=value` lines (values
// are hex, paths and addresses: no quoting needed, but quoted anyway),
// readable by the owner only.
func writeKeys(path string, e env) error {
	var b bytes.Buffer
	b.WriteString("# caddy-syncular demo: the environment the demo's Caddy runs with.\n")
	b.WriteString("# Random keys, fresh each run. Use: set -a; . " + path + "\n")
	for _, kv := range e {
		fmt.Fprintf(&b, "export %s=%s\n", kv[0], shellQuote(kv[1]))
	}
	_ = os.Remove(path) // a previous run's file may have another mode
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600) // whatever the umask
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// expectRedirect checks that url answers 302 to a presigned GET at the
// bucket's endpoint (expect follows it to the bytes).
func expectRedirect(url, endpoint string) error {
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Get(url)
	if err != nil {
		return err
	}
	res.Body.Close()
	if loc := res.Header.Get("Location"); res.StatusCode != http.StatusFound || !strings.HasPrefix(loc, endpoint+"/") || !strings.Contains(loc, "X-Amz-Signature=") {
		return fmt.Errorf("redirect site: expected 302 to a presigned URL at %s, got %d", endpoint, res.StatusCode)
	}
	return nil
}

// expectMetrics checks that the admin endpoint's /metrics carries the
// module's series for the demo's own requests: granted and refused.
func expectMetrics(url string, s3 bool) error {
	res, err := http.Get(url)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		return fmt.Errorf("metrics: %s answered %d", url, res.StatusCode)
	}
	servers := map[string]bool{}
	granted, refused := false, false
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "caddy_syncular_requests_total{") || strings.HasSuffix(line, " 0") {
			continue
		}
		granted = granted || strings.Contains(line, `outcome="granted"`)
		refused = refused || strings.Contains(line, `outcome="sync.forbidden"`)
		if _, rest, ok := strings.Cut(line, `server="`); ok {
			name, _, _ := strings.Cut(rest, `"`)
			servers[name] = true
		}
	}
	if !granted || !refused {
		return fmt.Errorf("metrics: %s lacks caddy_syncular_requests_total for the demo's granted and refused requests", url)
	}
	if want := map[bool]int{false: 1, true: 2}[s3]; len(servers) != want {
		names := make([]string, 0, len(servers))
		for n := range servers {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("metrics: server labels %v, want %d", names, want)
	}
	return nil
}

// expectInspect runs the printed inspect command lines through bash: the
// granted token is accepted, the other tenant's refused (audience).
func expectInspect(good, bad string) error {
	out, err := exec.Command("bash", "-c", good).CombinedOutput()
	if err != nil {
		return fmt.Errorf("inspect of the good URL failed: %w\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("accept")) {
		return fmt.Errorf("inspect of the good URL did not accept:\n%s", out)
	}
	out, err = exec.Command("bash", "-c", bad).CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("audience")) {
		return fmt.Errorf("inspect of the refused URL did not refuse on the audience (%v):\n%s", err, out)
	}
	return nil
}

// proc is a started child process; stop ends it with SIGTERM (SIGKILL
// after 10 s) and waits.
type proc struct {
	cmd    *exec.Cmd
	exited chan error
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	return p, nil
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// seedStore writes a gen-3 store the way the sync server does: WAL mode,
// two partitions in the registry, rows segments and one sqlite image.
func seedStore(dbPath, dir string) ([]demoSegment, error) {
	w, err := seed.Create(dbPath, 3)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	now := time.Now().UnixMilli()
	image, err := sqliteImage(filepath.Join(dir, "image.tmp.db"))
	if err != nil {
		return nil, err
	}
	var segs []demoSegment
	for _, in := range demoInputs(image) {
		digest := token.ScopeDigest(in.scopes)
		id, err := w.Put(seed.SegmentInput{Bytes: in.body, Publication: store.Publication{
			Partition: in.partition, LogEpoch: "e1", Table: in.table, SchemaVersion: 1, MediaType: in.media,
			ScopeDigest: digest, AsOfCommitSeq: 42, RowCount: 3, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
		}})
		if err != nil {
			return nil, err
		}
		segs = append(segs, demoSegment{id: id, partition: in.partition, digest: digest, media: in.media})
	}
	for _, p := range []string{"tenant-acme", "tenant-globex"} {
		if err := w.SetEpoch(p, "e1", now); err != nil {
			return nil, err
		}
	}
	return segs, nil
}

// demoInput is one segment the demo publishes.
type demoInput struct {
	partition, table, media string
	scopes                  map[string][]string
	body                    []byte
}

// demoInputs are two tenants' segments: the first is the one the good
// URL downloads, the third's tenant is the refused URL's audience.
func demoInputs(image []byte) []demoInput {
	return []demoInput{
		{"tenant-acme", "tasks", store.MediaRows, map[string][]string{"user_id": {"u1"}}, rowsBytes("acme tasks page 1")},
		{"tenant-acme", "projects", store.MediaSQLite, map[string][]string{"user_id": {"u1"}}, image},
		{"tenant-globex", "tasks", store.MediaRows, map[string][]string{"user_id": {"u9"}}, rowsBytes("globex tasks page 1")},
	}
}

// segmentID is "sha256:" + hex(sha256(b)).
func segmentID(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// rowsBytes is a stand-in rows segment: the SSG2 magic and some payload.
func rowsBytes(s string) []byte { return append([]byte("SSG2"), []byte(s)...) }

// sqliteImage builds a small SQLite database file and returns its bytes.
func sqliteImage(path string) ([]byte, error) {
	_ = os.Remove(path)
	defer os.Remove(path)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return nil, err
	}
	for _, q := range []string{
		"CREATE TABLE projects(id TEXT PRIMARY KEY, name TEXT)",
		"INSERT INTO projects VALUES ('p1','Apollo'),('p2','Gemini'),('p3','Mercury')",
	} {
		if _, err := db.Exec(q); err != nil {
			db.Close()
			return nil, err
		}
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

func expect(url string, status int, segID string) error {
	res, err := http.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != status {
		return fmt.Errorf("expected %d, got %d: %s", status, res.StatusCode, body)
	}
	if segID != "" {
		if segmentID(body) != segID {
			return errors.New("downloaded bytes do not hash to the segment id")
		}
	}
	return nil
}

// cacheStatusOf downloads url and returns its Cache-Status header.
func cacheStatusOf(url string) (string, error) {
	res, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, res.Body)
	cs := res.Header.Get("Cache-Status")
	if res.StatusCode != 200 || cs == "" {
		return "", fmt.Errorf("second download: %d with Cache-Status %q", res.StatusCode, cs)
	}
	return cs, nil
}

func waitListening(ctx context.Context, port int, limit time.Duration, exited chan error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("exited: %w", err)
		default:
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
