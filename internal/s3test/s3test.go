// Package s3test runs a real S3-compatible server (versitygw) on loopback
// for tests, and writes segment objects the way the reference
// S3SegmentStore does (protocol §5.2).
//
// A test that cannot start the server fails; it never skips. The binary is
// $VERSITYGW, or <repo>/.tools/bin/versitygw, installed on first need by
// <repo>/scripts/tools.sh versitygw (a cold install takes about 75 s).
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// DefaultRegion is the region a server answers to unless WithRegion says
// otherwise.
const DefaultRegion = "us-east-1"

const (
	readyTimeout = 10 * time.Second
	stopTimeout  = 5 * time.Second
)

// Server is one running versitygw (posix backend) on 127.0.0.1.
type Server struct {
	// Endpoint is the origin, http://127.0.0.1:PORT.
	Endpoint string
	// AccessKey and SecretKey are the root credentials (random per server).
	AccessKey string
	SecretKey string
	// Region is the only region the server accepts in a signature scope.
	Region string
	// AccessLog is the path of the server's S3 access log (one line per
	// request; see Requests).
	AccessLog string

	t       testing.TB
	bin     string
	addr    string
	dataDir string
	outPath string
	keep    bool // --keep-alive (WithKeepAlive)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

type options struct {
	region    string
	keepAlive bool
}

// Option changes how Start runs the server.
type Option func(*options)

// WithRegion makes the server accept only region r (e.g. "auto", as R2).
func WithRegion(r string) Option { return func(o *options) { o.region = r } }

// WithKeepAlive makes the server keep its HTTP connections open between
// requests, as S3 services do. versitygw closes each connection after
// one response by default, so that every request of a client is a new
// TCP connection (a dial, an accept and a close on each side).
func WithKeepAlive() Option { return func(o *options) { o.keepAlive = true } }

// Start runs a fresh server (new data directory under t.TempDir(), free
// port) and stops it when the test ends. It calls t.Fatal when the server
// cannot be started.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := Launch(t.TempDir(), opts...)
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	s.t = t
	t.Cleanup(s.Stop)
	return s
}

// Launch is Start for programs that are not tests (the load benchmark):
// it runs a fresh server with its data, access log and output under dir
// (created if missing) on a free port, and returns an error instead of
// failing a test. The caller stops the server with Stop. Restart needs a
// server from Start.
func Launch(dir string, opts ...Option) (*Server, error) {
	o := options{region: DefaultRegion}
	for _, fn := range opts {
		fn(&o)
	}
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	ak, err := randHex(6)
	if err != nil {
		return nil, err
	}
	sk, err := randHex(20)
	if err != nil {
		return nil, err
	}
	s := &Server{
		AccessKey: "s3test" + ak,
		SecretKey: sk,
		Region:    o.region,
		keep:      o.keepAlive,
		AccessLog: filepath.Join(dir, "access.log"),
		bin:       bin,
		dataDir:   filepath.Join(dir, "data"),
		outPath:   filepath.Join(dir, "versitygw.out"),
	}
	if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if s.addr, err = freeAddr(); err != nil {
			return nil, err
		}
		s.Endpoint = "http://" + s.addr
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("versitygw did not start: %w", lastErr)
}

// Stop kills the server (SIGTERM, then SIGKILL after 5 s) and waits for
// it. Safe to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	p := s.cmd.Process
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		_ = p.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Signal sends sig to the running server: SIGSTOP freezes it (its port
// still accepts connections, nothing answers them), SIGCONT resumes it.
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("s3test: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Kill ends the server with SIGKILL (no shutdown: connections are reset,
// the port refuses new ones) and waits for it. Restart starts it again.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart stops the server and starts it again on the same port with the
// same data, so objects survive.
func (s *Server) Restart() {
	if s.t == nil {
		panic("s3test: Restart needs a server from Start")
	}
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("s3test: versitygw did not restart: %v", err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	out, err := os.OpenFile(s.outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	args := []string{"--port", s.addr, "--region", s.Region, "--quiet", "--access-log", s.AccessLog}
	if s.keep {
		args = append(args, "--keep-alive")
	}
	cmd := exec.Command(s.bin, append(args, "posix", s.dataDir)...)
	cmd.Env = append(cleanEnv(),
		"ROOT_ACCESS_KEY="+s.AccessKey,
		"ROOT_SECRET_KEY="+s.SecretKey)
	cmd.Stdout = out
	cmd.Stderr = out
	if err := startChild(cmd); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	deadline := time.Now().Add(readyTimeout)
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	for {
		select {
		case <-done:
			return fmt.Errorf("exited early: %s", s.outputTail())
		default:
		}
		if resp, err := hc.Get(s.Endpoint + "/"); err == nil {
			resp.Body.Close()
			s.cmd, s.done = cmd, done
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("no answer on %s within %s: %s", s.addr, readyTimeout, s.outputTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) outputTail() string {
	b, _ := os.ReadFile(s.outPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// cleanEnv drops variables versitygw would read as configuration.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "VGW_") || strings.HasPrefix(k, "ROOT_") || k == "LOGFILE" || k == "WEBHOOK" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// Client is an SDK client for the server with its root credentials,
// path-style, without the SDK's optional checksums (the reference writer
// sends none).
func (s *Server) Client() *s3.Client {
	return s.ClientWith(s.AccessKey, s.SecretKey)
}

// ClientWith is Client with other credentials (e.g. a wrong secret).
func (s *Server) ClientWith(accessKey, secretKey string) *s3.Client {
	return s3.New(s3.Options{
		Region:                     s.Region,
		Credentials:                credentials.NewStaticCredentialsProvider(accessKey, secretKey, ""),
		BaseEndpoint:               aws.String(s.Endpoint),
		UsePathStyle:               true,
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		RetryMaxAttempts:           1,
	})
}

// CreateBucket creates bucket name.
func (s *Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("s3test: create bucket %s: %v", name, err)
	}
}

var (
	installMu   sync.Mutex
	installDone bool
)

// Binary returns the versitygw binary: $VERSITYGW, or
// <repo>/.tools/bin/versitygw, running <repo>/scripts/tools.sh versitygw
// once when it is missing. It calls t.Fatal when none can be had.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	return bin
}

func binary() (string, error) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$VERSITYGW: %w", err)
		}
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, ".tools", "bin", "versitygw")
	if isExecutable(bin) {
		return bin, nil
	}
	installMu.Lock()
	defer installMu.Unlock()
	if !installDone && !isExecutable(bin) {
		installDone = true
		if err := install(root); err != nil {
			return "", fmt.Errorf("installing versitygw: %w", err)
		}
	}
	if !isExecutable(bin) {
		return "", fmt.Errorf("%s missing after scripts/tools.sh versitygw (set VERSITYGW to a versitygw binary)", bin)
	}
	return bin, nil
}

func install(root string) error {
	if err := os.MkdirAll(filepath.Join(root, ".tools"), 0o755); err != nil {
		return err
	}
	// Test binaries of several packages may get here at once: one installs,
	// the others wait on the lock and then find the binary.
	unlock, err := lockFile(filepath.Join(root, ".tools", ".s3test-install.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if isExecutable(filepath.Join(root, ".tools", "bin", "versitygw")) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "tools.sh"), "versitygw")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// repoRoot walks up from the working directory to the directory holding
// go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	l.Close()
	return addr, nil
}

func randHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
