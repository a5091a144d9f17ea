package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

// recordingUpstream is a stand-in sync server that remembers every path
// it was asked for.
type recordingUpstream struct {
	mu    sync.Mutex
	paths []string
	addr  string
}

func newRecordingUpstream(t testing.TB) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.paths = append(u.paths, r.URL.Path)
		u.mu.Unlock()
		w.Header().Set("X-Upstream", "sync-server")
		fmt.Fprintf(w, "upstream %s %s", r.Method, r.URL.Path)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return u
}

func (u *recordingUpstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, p := range u.paths {
		if p == path {
			n++
		}
	}
	return n
}

// httpsClient trusts the root of Caddy's local CA (the data directory of
// the process) and dials every name at addr, as DNS would for the domain.
func httpsClient(t testing.TB, dataDir, addr string) *http.Client {
	t.Helper()
	rootPath := filepath.Join(dataDir, "caddy", "pki", "authorities", "local", "root.crt")
	var pem []byte
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(rootPath)
		if err == nil && len(b) > 0 {
			pem = b
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Caddy's local root %s did not appear: %v", rootPath, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", rootPath)
	}
	var d net.Dialer
	return &http.Client{
		Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, addr)
			},
		},
	}
}

// get is one request with cl, fully read.
func get(cl *http.Client, url string, hdr map[string]string) (response, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return response{}, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := cl.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{res.StatusCode, res.Header, b}, nil
}

// TestProductionExample runs examples/production/Caddyfile as committed
// (deployment values from the environment: tls internal instead of ACME,
// loopback ports) over HTTPS against versitygw and a stand-in sync
// server, in both S3 deliveries.
func TestProductionExample(t *testing.T) {
	cfg := examplePath(t, "production", "Caddyfile")
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	digest := token.ScopeDigest(map[string][]string{"user_id": {"prod-example"}})
	const partition = "tenant-prod-7f3a"
	segs := putSegments(t, srv, "segments", partition, digest, 1, 300_000)
	seg := segs[0]

	for _, delivery := range []string{"proxy", "redirect"} {
		t.Run(delivery, func(t *testing.T) {
			segKeyCfg, segKey := exampleKey(t)
			audKeyCfg, audKey := exampleKey(t)
			up := newRecordingUpstream(t)
			httpsPort, httpsAddr := loopback(t)
			_, httpAddr := loopback(t)
			_, adminAddr := loopback(t)
			metricsPort, metricsAddr := loopback(t)
			logDir := t.TempDir()
			env := []string{
				"SYNCULAR_SEGMENT_KEY=" + segKeyCfg,
				"SYNCULAR_AUDIENCE_KEY=" + audKeyCfg,
				"SYNCULAR_S3_ENDPOINT=" + srv.Endpoint,
				"SYNCULAR_S3_ACCESS_KEY_ID=" + srv.AccessKey,
				"SYNCULAR_S3_SECRET_ACCESS_KEY=" + srv.SecretKey,
				"SYNCULAR_S3_BUCKET=segments",
				"SYNCULAR_DELIVERY=" + delivery,
				"SYNCULAR_DOMAIN=edge.test",
				"SYNCULAR_TLS=internal",
				"SYNCULAR_BIND=127.0.0.1",
				"SYNCULAR_HTTPS_PORT=" + fmt.Sprint(httpsPort),
				"SYNCULAR_HTTP_PORT=" + strings.TrimPrefix(httpAddr, "127.0.0.1:"),
				"SYNCULAR_ADMIN=" + adminAddr,
				"SYNCULAR_METRICS_PORT=" + fmt.Sprint(metricsPort),
				"SYNCULAR_LOG_DIR=" + logDir,
				"SYNCULAR_UPSTREAM=" + up.addr,
			}
			c := startConfig(t, cfg, "caddyfile", env, httpsAddr, metricsAddr, adminAddr)
			cl := httpsClient(t, filepath.Join(c.Dir(), "data"), httpsAddr)
			base := fmt.Sprintf("https://edge.test:%d", httpsPort)

			// The certificate is issued in the background: wait for /healthz.
			var health response
			waitFor(20*time.Second, func() bool {
				r, err := get(cl, base+"/healthz", nil)
				health = r
				return err == nil
			})
			if health.Status != 200 || !strings.HasPrefix(string(health.Body), `{"status":"ok"`) {
				t.Fatalf("/healthz: %d %q", health.Status, health.Body)
			}

			exp := time.Now().Add(15 * time.Minute).Unix()
			good := token.Sign(segKey, seg.id, digest, hmacAud(t, audKey, partition), exp)
			other := token.Sign(segKey, seg.id, digest, hmacAud(t, audKey, "tenant-other"), exp)
			segURL := base + "/sync/segments/" + seg.id

			r, err := get(cl, segURL+"?st="+good, nil)
			if err != nil {
				t.Fatal(err)
			}
			switch delivery {
			case "proxy":
				checkSegmentS3(t, r, seg.id)
			case "redirect":
				if r.Status != 302 || !strings.HasPrefix(r.Header.Get("Location"), srv.Endpoint+"/segments/"+examplePrefix+"seg/sha256/") {
					t.Fatalf("granted redirect: %d Location %q", r.Status, r.Header.Get("Location"))
				}
				b := do(t, "GET", r.Header.Get("Location"), nil)
				if b.Status != 200 || s3test.SegmentID(b.Body) != seg.id {
					t.Fatalf("presigned URL answered %d with %d bytes", b.Status, len(b.Body))
				}
			}

			r, err = get(cl, segURL+"?st="+other, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkError(t, r, 403, "sync.forbidden")

			// No st: the direct path, re-authorized by the sync server.
			r, err = get(cl, segURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != 200 || r.Header.Get("X-Upstream") != "sync-server" || up.count("/sync/segments/"+seg.id) != 1 {
				t.Fatalf("untokened request: %d %q (upstream saw it %d times)", r.Status, r.Body, up.count("/sync/segments/"+seg.id))
			}

			// Active health checks reach the sync server on their own.
			if waitFor(15*time.Second, func() bool { return up.count("/health") > 0 }) < 0 {
				t.Errorf("no active health check reached the sync server")
			}

			// Metrics: on the loopback operator site and the admin
			// endpoint; the public site hands /metrics to the sync server.
			for _, u := range []string{"http://" + metricsAddr + "/metrics", "http://" + adminAddr + "/metrics"} {
				m := do(t, "GET", u, nil)
				want := fmt.Sprintf(`(?m)^caddy_syncular_requests_total\{delivery=%q,outcome="granted",server="srv\d+"\} 1$`, delivery)
				if m.Status != 200 || !regexp.MustCompile(want).Match(m.Body) {
					t.Errorf("%s: %d, no %s", u, m.Status, want)
				}
			}
			r, err = get(cl, base+"/metrics", nil)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(r.Body), "caddy_syncular") || r.Header.Get("X-Upstream") != "sync-server" {
				t.Errorf("public /metrics exposed metrics (%d)", r.Status)
			}

			// The access log: one line per request with the edge's
			// decision, and no token, presigned URL or partition id.
			logPath := filepath.Join(logDir, "syncular-access.log")
			var logText string
			waitFor(5*time.Second, func() bool {
				logText = readFile(t, logPath)
				return strings.Contains(logText, `"syncular_outcome":"sync.forbidden"`)
			})
			for _, want := range []string{
				`"syncular_outcome":"granted"`, `"syncular_outcome":"sync.forbidden"`, `"syncular_outcome":"next"`,
				`"syncular_delivery":"` + delivery + `"`, `"syncular_key_slot":"1"`,
				`"syncular_segment_id":"` + seg.id + `"`, `"syncular_reason":"`,
			} {
				if !strings.Contains(logText, want) {
					t.Errorf("access log lacks %s:\n%s", want, logText)
				}
			}
			if strings.Contains(logText, "/healthz") {
				t.Errorf("/healthz was logged")
			}
			for what, text := range map[string]string{"access log": logText, "server log": c.Output()} {
				noneOf(t, what, text, good, other, segKeyCfg, audKeyCfg, srv.SecretKey, partition, "X-Amz-Signature")
			}
		})
	}
}
