package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// Helpers of the tests that run the committed configs (examples/, the
// docs' snippets) unchanged: the deployment values reach them through the
// environment, exactly as an operator supplies them.

// exampleKey is a key as the docs ask for one: 32 random bytes, hex.
// It returns the config form ("hex:…") and the raw bytes.
func exampleKey(t testing.TB) (string, []byte) {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "hex:" + hex.EncodeToString(b), b
}

// examplePath is a file of the repository's examples/ directory.
func examplePath(t testing.TB, parts ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{repoRoot(t), "examples"}, parts...)...)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("example missing: %v", err)
	}
	return p
}

// startConfig runs `caddy run` on a config file as committed (adapter
// "caddyfile" or "" for JSON) with env, and waits until every address in
// waitFor accepts connections. The process is stopped when the test ends.
func startConfig(t testing.TB, cfgPath, adapter string, env []string, waitFor ...string) *caddyProc {
	t.Helper()
	c := &caddyProc{t: t, dir: t.TempDir(), bin: caddyBinary(t), Env: env, stderr: &lockedBuffer{}}
	args := []string{"run", "--config", cfgPath}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	c.cmd = exec.Command(c.bin, args...)
	c.cmd.Env = append(os.Environ(),
		"XDG_CONFIG_HOME="+filepath.Join(c.dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(c.dir, "data"),
		"HOME="+c.dir,
	)
	c.cmd.Env = append(c.cmd.Env, env...)
	c.cmd.Stdout, c.cmd.Stderr = c.stderr, c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_, _ = c.cmd.Process.Wait()
		close(exited)
	}()
	t.Cleanup(c.Stop)
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range waitFor {
		for {
			select {
			case <-exited:
				t.Fatalf("caddy exited during start-up:\n%s", c.stderr.String())
			default:
			}
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not listen on %s within 30s:\n%s", cfgPath, addr, c.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// stopProc ends a process started by startConfig (SIGTERM: Caddy's
// graceful shutdown, as an operator stops an edge) and waits for it.
func (c *caddyProc) stopGraceful(limit time.Duration) error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(c.cmd.Process.Pid, 0); err != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("caddy pid %d still running %v after SIGTERM", c.cmd.Process.Pid, limit)
}

// loopback is 127.0.0.1:port of a fresh free port.
func loopback(t testing.TB) (int, string) {
	p := freePort(t)
	return p, fmt.Sprintf("127.0.0.1:%d", p)
}

// bucketSegment is one segment published in a versitygw bucket under
// partition and digest, live for an hour.
type bucketSegment struct {
	id   string
	body []byte
}

// examplePrefix is the S3 key prefix of the committed examples (their
// SYNCULAR_S3_PREFIX default), the docs and the demo.
const examplePrefix = "syncular/"

// s3ExampleStore is s3SegmentsStore under examplePrefix: the store block
// of a site whose bucket putSegments seeds.
var s3ExampleStore = strings.Replace(s3SegmentsStore, "bucket segments", "bucket segments\n\t\t\tprefix "+examplePrefix, 1)

// putSegments writes n random segments of size bytes under examplePrefix
// the way current
// reference writers do: the bytes object without metadata and the record
// as a plain JSON object. (A bytes object with the legacy record header
// is streamed, not redirected: protocol §5.2.)
func putSegments(t *testing.T, srv *s3test.Server, bucket, partition, digest string, n, size int) []bucketSegment {
	t.Helper()
	cl := srv.Client()
	var out []bucketSegment
	for i := 0; i < n; i++ {
		b := randomBytes(t, size)
		id := s3test.SegmentID(b)
		s3test.PutSegment(t, cl, bucket, examplePrefix, b, "")
		s3test.PutRecordObject(t, cl, bucket, examplePrefix, id, record(id, len(b), partition, digest, time.Now().Add(time.Hour)))
		out = append(out, bucketSegment{id: id, body: b})
	}
	return out
}

// hmacAud is the audience the keyed rule (audience hmac_sha256, hex)
// derives for partition.
func hmacAud(t testing.TB, key []byte, partition string) string {
	t.Helper()
	a, err := token.HMACAudience(key, "hex")
	if err != nil {
		t.Fatal(err)
	}
	return a.Derive(partition)
}

// noneOf fails when text contains any of the secrets.
func noneOf(t testing.TB, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s contains a secret (%.12s…)", what, s)
		}
	}
}
