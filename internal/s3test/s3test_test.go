package s3test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

func TestStartPutHeadRestart(t *testing.T) {
	srv := Start(t)
	if !strings.HasPrefix(srv.Endpoint, "http://127.0.0.1:") || srv.Region != DefaultRegion {
		t.Fatalf("server %+v", srv)
	}
	srv.CreateBucket(t, "segments")
	c := srv.Client()
	body := []byte("rows whole table: [t1,t2]")
	const header = "eyJwYXJ0aXRpb24iOiJwMSJ9"
	id := PutSegment(t, c, "segments", "syncular/", body, header)
	if id != "sha256:e4bf042fcff1b465955855b452050305804d76e8990c41c16dd291c1f05ca748" {
		t.Fatalf("id %s", id)
	}
	key := ObjectKey("syncular/", id)
	if key != "syncular/seg/sha256/e4bf042fcff1b465955855b452050305804d76e8990c41c16dd291c1f05ca748" {
		t.Fatalf("key %s", key)
	}
	head := func() (*s3.HeadObjectOutput, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("segments"), Key: aws.String(key)})
	}
	out, err := head()
	if err != nil {
		t.Fatal(err)
	}
	if out.Metadata["syncular-record"] != header || aws.ToString(out.ContentType) != "application/octet-stream" ||
		aws.ToInt64(out.ContentLength) != int64(len(body)) {
		t.Errorf("head: meta %v type %q length %d", out.Metadata, aws.ToString(out.ContentType), aws.ToInt64(out.ContentLength))
	}
	if n := srv.CountRequests(t, "s3_HeadObject", key); n != 1 {
		t.Errorf("access log: %d HEADs of %s; log %+v", n, key, srv.Requests(t))
	}
	if n := srv.CountRequests(t, "s3_PutObject", key); n != 1 {
		t.Errorf("access log: %d PUTs", n)
	}

	srv.Stop()
	if _, err := head(); err == nil {
		t.Fatal("HEAD succeeded with the server stopped")
	}
	srv.Restart()
	if _, err := head(); err != nil {
		t.Fatalf("after restart: %v", err)
	}

	DeleteSegment(t, c, "segments", "syncular/", id)
	_, err = head()
	var nf *types.NotFound
	if !errors.As(err, &nf) {
		t.Errorf("HEAD after delete: %v", err)
	}
	DeleteSegment(t, c, "segments", "syncular/", id) // idempotent
}

func TestWrongSecretRefused(t *testing.T) {
	srv := Start(t, WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	ctx := context.Background()
	_, err := srv.ClientWith(srv.AccessKey, "not-the-secret").HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("segments")})
	if err == nil {
		t.Fatal("wrong secret accepted")
	}
	// The server's region is enforced in the signature scope.
	other := &Server{Endpoint: srv.Endpoint, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Region: "us-east-1"}
	if _, err := other.Client().HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("segments")}); err == nil {
		t.Fatal("wrong region accepted")
	}
	if _, err := srv.Client().HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("segments")}); err != nil {
		t.Fatal(err)
	}
}

func TestTwoServersAreIndependent(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Endpoint == b.Endpoint || a.SecretKey == b.SecretKey {
		t.Fatal("servers share an endpoint or credentials")
	}
	a.CreateBucket(t, "segments")
	resp, err := http.Get(b.Endpoint + "/segments")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == 200 {
		t.Fatal("anonymous listing allowed")
	}
}

func TestRecordHeader(t *testing.T) {
	const js = `{"partition":"p<1>&","segmentId":"sha256:x"}`
	for name, in := range map[string]any{"string": js, "bytes": []byte(js)} {
		if got := RecordHeader(in); got != base64.RawURLEncoding.EncodeToString([]byte(js)) {
			t.Errorf("%s: %s", name, got)
		}
	}
	got := RecordHeader(map[string]any{"partition": "p<1>&", "segmentId": "sha256:x"})
	raw, err := base64.RawURLEncoding.DecodeString(got)
	if err != nil || string(raw) != js || strings.ContainsRune(got, '=') {
		t.Errorf("map: %s (%s, %v)", got, raw, err)
	}
}

// fatalTB records Fatal instead of failing the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fatalTB) Fatal(args ...any) { f.msg = fmt.Sprint(args...); runtime.Goexit() }

func runFatal(t *testing.T, fn func(tb testing.TB)) string {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.msg
}

func TestStartFailsLoudly(t *testing.T) {
	t.Setenv("VERSITYGW", "/nonexistent/versitygw")
	if msg := runFatal(t, func(tb testing.TB) { Start(tb) }); !strings.Contains(msg, "VERSITYGW") {
		t.Errorf("missing binary: %q", msg)
	}
	t.Setenv("VERSITYGW", "/bin/false")
	if msg := runFatal(t, func(tb testing.TB) { Start(tb) }); !strings.Contains(msg, "did not start") {
		t.Errorf("binary that exits: %q", msg)
	}
}

// TestPutRecordObject: the current writers' layout is a plain-JSON record
// object beside a bytes object without metadata.
func TestPutRecordObject(t *testing.T) {
	srv := Start(t)
	srv.CreateBucket(t, "segments")
	c := srv.Client()
	body := []byte("current writer bytes")
	id := PutSegment(t, c, "segments", "p/", body, "")
	rec := `{"segmentId":"` + id + `","partition":"p1"}`
	PutRecordObject(t, c, "segments", "p/", id, rec)
	key := RecordKey("p/", id)
	if key != "p/rec/sha256/"+id[7:]+".json" {
		t.Fatalf("record key %s", key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("segments"), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if string(got) != rec || aws.ToString(out.ContentType) != "application/json" {
		t.Errorf("record object %q (%s)", got, aws.ToString(out.ContentType))
	}
	head, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("segments"), Key: aws.String(ObjectKey("p/", id))})
	if err != nil {
		t.Fatal(err)
	}
	if len(head.Metadata) != 0 {
		t.Errorf("bytes object carries metadata %v", head.Metadata)
	}
	if h := RecordHeader(rec); h != base64.RawURLEncoding.EncodeToString([]byte(rec)) {
		t.Errorf("RecordHeader %s", h)
	}
	DeleteRecordObject(t, c, "segments", "p/", id)
	if _, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("segments"), Key: aws.String(key)}); err == nil {
		t.Error("record object still there after DeleteRecordObject")
	}
	DeleteRecordObject(t, c, "segments", "p/", id) // idempotent
}

// TestKeepAlive: without WithKeepAlive the server answers each request
// on a connection of its own (versitygw's default: the second request of
// a client dials again); with it, the second request reuses the first's
// connection.
func TestKeepAlive(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep-alive=%v", keep), func(t *testing.T) {
			var opts []Option
			if keep {
				opts = append(opts, WithKeepAlive())
			}
			srv := Start(t, opts...)
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
			var reused []bool
			for range 3 {
				var got bool
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					GotConn: func(ci httptrace.GotConnInfo) { got = ci.Reused },
				})
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.Endpoint+"/", nil)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				reused = append(reused, got)
			}
			for i, r := range reused[1:] {
				if r != keep {
					t.Errorf("request %d: connection reused %v, want %v (all: %v)", i+2, r, keep, reused)
				}
			}
		})
	}
}
