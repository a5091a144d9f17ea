package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	s3store "github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/token"
)

// The bucket the demo writes and examples/demo-s3.Caddyfile reads.
const (
	demoBucket = "syncular-demo"
	demoPrefix = "syncular/"
	demoRegion = "auto" // as R2; the examples default to it
)

// writeLegacyHeader would also put the record on the bytes object as the
// x-amz-meta-syncular-record header (base64url of the same JSON), the
// layout of older writers. It stays off: this edge reads record objects,
// and by default it streams (does not redirect) a bytes object that
// carries the legacy header (protocol §5.2), so with it the redirect
// site would answer 200 instead of 302.
const writeLegacyHeader = false

// gateway is a versitygw started by the demo on 127.0.0.1.
type gateway struct {
	*proc
	endpoint, accessKey, secretKey, dataDir string
}

// startS3 runs versitygw (posix backend) with a fresh data directory
// under dir and random root credentials, and creates the demo bucket.
func startS3(ctx context.Context, bin, dir string) (*gateway, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s missing: run `scripts/tools.sh versitygw` (or `make demo-s3`, which installs it)", bin)
	}
	g := &gateway{accessKey: "demo" + randomHex(8), secretKey: randomHex(32), dataDir: filepath.Join(dir, "s3")}
	if err := os.RemoveAll(g.dataDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(g.dataDir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "versitygw.log")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child holds its own descriptor
	port := freePort()
	g.endpoint = fmt.Sprintf("http://127.0.0.1:%d", port)
	cmd := exec.Command(bin, "--port", fmt.Sprintf("127.0.0.1:%d", port), "--region", demoRegion, "--quiet", "posix", g.dataDir)
	for _, kv := range os.Environ() {
		// versitygw reads these as configuration: only ours.
		if !strings.HasPrefix(kv, "VGW_") && !strings.HasPrefix(kv, "ROOT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "ROOT_ACCESS_KEY="+g.accessKey, "ROOT_SECRET_KEY="+g.secretKey)
	cmd.Stdout, cmd.Stderr = out, out
	if g.proc, err = startProc(cmd); err != nil {
		return nil, err
	}
	if err := waitListening(ctx, port, 10*time.Second, g.exited); err != nil {
		g.stop()
		return nil, fmt.Errorf("versitygw did not start (see %s): %w", logPath, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := g.client().CreateBucket(cctx, &s3.CreateBucketInput{Bucket: aws.String(demoBucket)}); err != nil {
		g.stop()
		return nil, fmt.Errorf("creating bucket %s: %w", demoBucket, err)
	}
	return g, nil
}

// client is path-style with the root credentials and without the SDK's
// optional checksums (the reference writer sends none).
func (g *gateway) client() *s3.Client {
	return s3.New(s3.Options{
		Region:                     demoRegion,
		Credentials:                credentials.NewStaticCredentialsProvider(g.accessKey, g.secretKey, ""),
		BaseEndpoint:               aws.String(g.endpoint),
		UsePathStyle:               true,
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// seedS3 writes the demo's segments the way current reference writers
// do: the bytes at {prefix}seg/sha256/{hex} without metadata, the record
// as a plain JSON object at {prefix}rec/sha256/{hex}.json.
func seedS3(ctx context.Context, g *gateway, dir string) ([]demoSegment, error) {
	image, err := sqliteImage(filepath.Join(dir, "image.tmp.db"))
	if err != nil {
		return nil, err
	}
	now := time.Now().UnixMilli()
	c := g.client()
	var segs []demoSegment
	for _, in := range demoInputs(image) {
		id := segmentID(in.body)
		digest := token.ScopeDigest(in.scopes)
		rec := seed.S3Record(id, store.Publication{
			Partition: in.partition, LogEpoch: "e1", Table: in.table, SchemaVersion: 1,
			MediaType: in.media, ScopeDigest: digest, AsOfCommitSeq: 42, RowCount: 3,
			ByteLength: int64(len(in.body)), CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
		})
		hexID := strings.TrimPrefix(id, "sha256:")
		seg := &s3.PutObjectInput{
			Bucket:        aws.String(demoBucket),
			Key:           aws.String(demoPrefix + "seg/sha256/" + hexID),
			Body:          bytes.NewReader(in.body),
			ContentLength: aws.Int64(int64(len(in.body))),
			ContentType:   aws.String("application/octet-stream"),
		}
		if writeLegacyHeader {
			seg.Metadata = map[string]string{s3store.RecordMetaKey: base64.RawURLEncoding.EncodeToString(rec)}
		}
		recObj := &s3.PutObjectInput{
			Bucket:        aws.String(demoBucket),
			Key:           aws.String(demoPrefix + "rec/sha256/" + hexID + ".json"),
			Body:          bytes.NewReader(rec),
			ContentLength: aws.Int64(int64(len(rec))),
			ContentType:   aws.String("application/json"),
		}
		for _, put := range []*s3.PutObjectInput{seg, recObj} {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := c.PutObject(pctx, put)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("put %s: %w", aws.ToString(put.Key), err)
			}
		}
		segs = append(segs, demoSegment{id: id, partition: in.partition, digest: digest, media: in.media})
	}
	return segs, nil
}
