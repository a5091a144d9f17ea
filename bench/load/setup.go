package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	s3store "github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/token"
)

const (
	bucket    = "segments"
	partition = "p1"
	serveSize = 256 << 10
	redirSize = 2 << 10
	stormSize = 8 << 20
	// templateAud is the `audience template` of the edge sites that do
	// not measure the keyed audience.
	templateAud = "aud:{partition}"
)

var scopeDigest = hex.EncodeToString(bytes.Repeat([]byte{0xaa}, 32))

// env is what every scenario shares: keys, the S3 server and its
// segments, the SQLite store and its segment, and the file_server tree.
type env struct {
	dir string
	// key is the segment-token key, audKey the audience hmac_sha256 key;
	// each is 32 random bytes, configured as "hex:..." (keyText, audKeyText)
	// through environment variables of the Caddy processes.
	key, audKey         []byte
	keyText, audKeyText string
	audHMAC             string // hex(HMAC-SHA256(audKey, partition))

	gw    *s3test.Server
	s3    *s3.Client
	redir struct{ id string }
	storm struct {
		id    string
		bytes []byte
	}
	dbPath  string
	www     string // file_server root: www/sync/segments/<serve id>
	serveID string
}

func newEnv(dir string) (*env, error) {
	e := &env{dir: dir}
	var err error
	if e.key, e.keyText, err = newKey(); err != nil {
		return nil, err
	}
	if e.audKey, e.audKeyText, err = newKey(); err != nil {
		return nil, err
	}
	aud, err := token.HMACAudience(e.audKey, "hex")
	if err != nil {
		return nil, err
	}
	e.audHMAC = aud.Derive(partition)
	if err := e.setupS3(); err != nil {
		e.close()
		return nil, err
	}
	if err := e.setupSQLite(); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	if e.gw != nil {
		e.gw.Stop()
	}
}

// newKey is 32 random bytes and their configuration text.
func newKey() ([]byte, string, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, "", err
	}
	return k, "hex:" + hex.EncodeToString(k), nil
}

// flagS3KeepAlive: versitygw closes every connection after one response
// unless told otherwise, which S3 services do not: each store read of an
// edge would then be a dial, an accept and a close on the same cores as
// the edge (a storm of scenario (m) dialled 1,300 connections per round).
var flagS3KeepAlive = flag.Bool("s3-keepalive", true, "run versitygw with --keep-alive, as S3 services keep connections open (false: one connection per store request, versitygw's default)")

// setupS3 starts versitygw (the set-up the tests use) and writes the
// redirect and storm segments.
func (e *env) setupS3() error {
	if *flagGW != "" {
		abs, err := filepath.Abs(*flagGW)
		if err != nil {
			return err
		}
		os.Setenv("VERSITYGW", abs) // how s3test is told which binary to run
	}
	var gwOpts []s3test.Option
	if *flagS3KeepAlive {
		gwOpts = append(gwOpts, s3test.WithKeepAlive())
	}
	gw, err := s3test.Launch(filepath.Join(e.dir, "s3"), gwOpts...)
	if err != nil {
		return err
	}
	e.gw = gw
	e.s3 = gw.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return fmt.Errorf("create bucket: %w", err)
	}
	redir := bytes.Repeat([]byte("redirect"), redirSize/8)
	if e.redir.id, err = e.put(ctx, redir); err != nil {
		return err
	}
	e.storm.bytes = make([]byte, stormSize)
	if _, err := rand.Read(e.storm.bytes); err != nil {
		return err
	}
	e.storm.id, err = e.put(ctx, e.storm.bytes)
	return err
}

// put writes b as the reference S3SegmentStore does, with its record in
// x-amz-meta-syncular-record.
func (e *env) put(ctx context.Context, b []byte) (string, error) {
	return e.putFor(ctx, partition, b)
}

// putFor is put with a record granting part (a tenant of its own).
func (e *env) putFor(ctx context.Context, part string, b []byte) (string, error) {
	id := segmentID(b)
	now := time.Now().UnixMilli()
	// As current reference writers do: the bytes without metadata, the
	// record in its own object (a legacy header would make a redirect
	// edge stream instead of redirect).
	rec := seed.S3Record(id, store.Publication{
		Partition: part, LogEpoch: "e1", Table: "tasks", SchemaVersion: 1, MediaType: "rows",
		ScopeDigest: scopeDigest, AsOfCommitSeq: 1, RowCount: 1, ByteLength: int64(len(b)),
		CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
	})
	for _, put := range []*s3.PutObjectInput{
		{Bucket: aws.String(bucket), Key: aws.String(s3store.ObjectKey("", id)), Body: bytes.NewReader(b),
			ContentLength: aws.Int64(int64(len(b))), ContentType: aws.String("application/octet-stream")},
		{Bucket: aws.String(bucket), Key: aws.String(s3store.RecordKey("", id)), Body: bytes.NewReader(rec),
			ContentLength: aws.Int64(int64(len(rec))), ContentType: aws.String("application/json")},
	} {
		if _, err := e.s3.PutObject(ctx, put); err != nil {
			return "", fmt.Errorf("put %s: %w", aws.ToString(put.Key), err)
		}
	}
	return id, nil
}

// setupSQLite seeds the 256 KiB segment, and writes the same bytes where
// file_server finds them under the same URL path.
func (e *env) setupSQLite() error {
	body := make([]byte, serveSize)
	if _, err := rand.Read(body); err != nil {
		return err
	}
	e.dbPath = filepath.Join(e.dir, "sync.db")
	w, err := seed.Create(e.dbPath, 3)
	if err != nil {
		return err
	}
	defer w.Close()
	now := time.Now().UnixMilli()
	id, err := w.Put(seed.SegmentInput{Bytes: body, Publication: store.Publication{
		Partition: partition, LogEpoch: "e1", Table: "tasks", ScopeDigest: scopeDigest,
		AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
	}})
	if err != nil {
		return err
	}
	if err := w.SetEpoch(partition, "e1", now); err != nil {
		return err
	}
	e.serveID = id
	e.www = filepath.Join(e.dir, "www")
	segDir := filepath.Join(e.www, "sync", "segments")
	if err := os.MkdirAll(segDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(segDir, id), body, 0o644)
}

func segmentID(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// token is a token for segment id with the template audience of
// partition, valid until exp.
func (e *env) token(id string, exp time.Time) string {
	return token.Sign(e.key, id, scopeDigest, "aud:"+partition, exp.Unix())
}

// hmacToken is a token for segment id with the keyed audience
// (audience hmac_sha256), as the sync server mints it in production.
func (e *env) hmacToken(id string, exp time.Time) string {
	return token.Sign(e.key, id, scopeDigest, e.audHMAC, exp.Unix())
}

// segURL is the signed URL of id on the site at port.
func segURL(port int, id, tok string) string {
	return fmt.Sprintf("http://127.0.0.1:%d/sync/segments/%s?st=%s", port, id, url.QueryEscape(tok))
}

// writeTargets writes a vegeta targets file of n GET requests, the i-th
// for the URL urlOf(i).
func writeTargets(path string, n int, urlOf func(i int) string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for i := range n {
		fmt.Fprintf(w, "GET %s\n\n", urlOf(i))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// globalOpts: admin on its own port, loopback only, the default (INFO,
// production) log level spelled out.
const globalOpts = `{
	admin 127.0.0.1:%d
	default_bind 127.0.0.1
	persist_config off
	auto_https off
	log {
		level INFO
	}
}
`

func (e *env) s3Block() string {
	return fmt.Sprintf(`store s3 {
			bucket %s
			region %s
			endpoint %s
			access_key_id {env.BENCH_S3_AK}
			secret_access_key {env.BENCH_S3_SK}
		}`, bucket, e.gw.Region, e.gw.Endpoint)
}

// Audience lines of an edge site.
const (
	audTemplate = "audience template " + templateAud
	audHMAC     = "audience hmac_sha256 {env.BENCH_AUDIENCE_KEY} hex"
)

// edgeSite is a site on port with the module on /sync/segments/*.
func edgeSite(port int, audience, storeBlock, extra string) string {
	return fmt.Sprintf(`
http://127.0.0.1:%d {
	syncular_segments /sync/segments/* {
		key {env.BENCH_SEGMENT_KEY}
		%s
		%s
		untokened reject
		%s
	}
}
`, port, audience, storeBlock, extra)
}

// startCaddy writes cfg and runs bin (Caddy) on it, with the keys and S3
// credentials in its environment. The process stops when the scenario
// ends.
func (e *env) startCaddy(name, bin, cfg string) (*proc, error) {
	path := filepath.Join(e.dir, name+".Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	home := filepath.Join(e.dir, name+"-home")
	return start(name, bin, []string{"run", "--config", path, "--adapter", "caddyfile"}, []string{
		"BENCH_SEGMENT_KEY=" + e.keyText, "BENCH_AUDIENCE_KEY=" + e.audKeyText,
		"BENCH_S3_AK=" + e.gw.AccessKey, "BENCH_S3_SK=" + e.gw.SecretKey,
		"XDG_CONFIG_HOME=" + home, "XDG_DATA_HOME=" + home, "HOME=" + home,
	}, e.dir)
}

// notesMarker starts the hand-written part of the results file.
const notesMarker = "<!-- notes: kept across runs -->"
