// Command syncular-demo is `make demo`: it seeds a SQLite segment store in
// the reference layout (two partitions, rows and sqlite segments), starts
// bin/caddy with Caddyfile.example in front of a stand-in sync server,
// and prints a signed URL that downloads a segment and one that is
// refused. Keys are random per run and reach Caddy through the
// environment, as in production.
//
//	go run ./cmd/syncular-demo [-caddy bin/caddy] [-dir .demo] [-check]
//
// -check exits after verifying both URLs (used by the integration tests).
package main

import (
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
	"syscall"
	"time"

	_ "modernc.org/sqlite"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/store"
)

func main() {
	caddyBin := flag.String("caddy", "bin/caddy", "Caddy binary built by `make caddy`")
	caddyfile := flag.String("config", "Caddyfile.example", "Caddyfile to run")
	dir := flag.String("dir", ".demo", "working directory for the store and logs")
	check := flag.Bool("check", false, "verify the URLs and exit")
	flag.Parse()
	if err := run(*caddyBin, *caddyfile, *dir, *check); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type demoSegment struct {
	id, partition, digest string
	media                 string
}

func run(caddyBin, caddyfile, dir string, check bool) error {
	if _, err := os.Stat(caddyBin); err != nil {
		return fmt.Errorf("%s missing: run `make caddy` (or `make demo`, which builds it)", caddyBin)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dir, _ = filepath.Abs(dir)
	dbPath := filepath.Join(dir, "sync.db")
	for _, suffix := range []string{"", "-wal", "-shm"} {
		_ = os.Remove(dbPath + suffix)
	}

	segKey, audKey := randomHex(32), randomHex(32)
	segs, err := seedStore(dbPath, dir)
	if err != nil {
		return fmt.Errorf("seeding %s: %w", dbPath, err)
	}

	// A stand-in for the sync server: the direct path lands here.
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go http.Serve(upstream, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "sync server stand-in: %s %s (a real sync server re-authorizes this request)\n", r.Method, r.URL.Path)
	}))

	port, admin := freePort(), freePort()
	logPath := filepath.Join(dir, "caddy.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(caddyBin, "run", "--config", caddyfile, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(),
		"SYNCULAR_SEGMENT_KEY="+segKey,
		"SYNCULAR_AUDIENCE_KEY="+audKey,
		"SYNCULAR_DB="+dbPath,
		fmt.Sprintf("SYNCULAR_SITE_ADDRESS=:%d", port), // default_bind keeps it on loopback
		fmt.Sprintf("SYNCULAR_ADMIN=127.0.0.1:%d", admin),
		"SYNCULAR_UPSTREAM="+upstream.Addr().String(),
		"SYNCULAR_ACCESS_LOG="+filepath.Join(dir, "access.log"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := waitListening(port, 30*time.Second, exited); err != nil {
		return fmt.Errorf("caddy did not start (see %s): %w", logPath, err)
	}

	aud, _ := presign.HMACAudience([]byte(audKey), "hex")
	exp := time.Now().Add(15 * time.Minute).Unix()
	good := segs[0]
	goodURL := fmt.Sprintf("%s/sync/segments/%s?st=%s", base, good.id, presign.Sign([]byte(segKey), good.id, good.digest, aud.Derive(good.partition), exp))
	// Refused: a valid token of the other tenant for this segment.
	other := segs[2]
	badURL := fmt.Sprintf("%s/sync/segments/%s?st=%s", base, good.id, presign.Sign([]byte(segKey), good.id, good.digest, aud.Derive(other.partition), exp))

	if err := expect(goodURL, 200, good.id); err != nil {
		return err
	}
	if err := expect(badURL, 403, ""); err != nil {
		return err
	}

	fmt.Printf("\ncaddy-syncular demo: Caddy %s on %s, store %s\n", caddyBin, base, dbPath)
	fmt.Printf("logs: %s (server), %s (access, st removed)\n\n", logPath, filepath.Join(dir, "access.log"))
	fmt.Println("Downloads a segment (200, the bytes hash to the id):")
	fmt.Println(goodURL)
	fmt.Println()
	fmt.Println("Refused (403 sync.forbidden: a token for another tenant's audience):")
	fmt.Println(badURL)
	fmt.Println()
	fmt.Printf("Try: curl -sS -o seg.bin -D - '%s' && sha256sum seg.bin\n", goodURL)
	fmt.Printf("     curl -sS '%s'\n", badURL)
	fmt.Println("Without ?st= the request goes on to the sync server (reverse_proxy).")
	if check {
		fmt.Println("demo check passed")
		return nil
	}
	fmt.Println("\nPress Ctrl-C to stop.")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-exited:
		exited <- err
		return fmt.Errorf("caddy exited: %v (see %s)", err, logPath)
	}
	return nil
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
	inputs := []struct {
		partition, table, media string
		scopes                  map[string][]string
		body                    []byte
	}{
		{"tenant-acme", "tasks", store.MediaRows, map[string][]string{"user_id": {"u1"}}, rowsBytes("acme tasks page 1")},
		{"tenant-acme", "projects", store.MediaSQLite, map[string][]string{"user_id": {"u1"}}, image},
		{"tenant-globex", "tasks", store.MediaRows, map[string][]string{"user_id": {"u9"}}, rowsBytes("globex tasks page 1")},
	}
	var segs []demoSegment
	for _, in := range inputs {
		digest := presign.ScopeDigest(in.scopes)
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
		sum := sha256.Sum256(body)
		if "sha256:"+hex.EncodeToString(sum[:]) != segID {
			return errors.New("downloaded bytes do not hash to the segment id")
		}
	}
	return nil
}

func waitListening(port int, limit time.Duration, exited chan error) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("caddy exited: %v", err)
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
