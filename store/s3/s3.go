// Package s3 reads segment records and bytes from an S3-compatible bucket
// as the reference S3SegmentStore writes it (protocol §5.2). New returns a
// *Store, which implements store.Store; an *Error that is an answer
// refusing the request matches store.ErrRefused, so the cache above it
// never names this package.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// Defaults of Options.
const (
	// s3MaxAttempts is the SDK retry budget per call: one try and one retry.
	// Both run inside the call's timeout, so a fault surfaces within it.
	s3MaxAttempts = 2
	// s3MaxBackoff caps the wait before the retry.
	s3MaxBackoff = 250 * time.Millisecond
)

// Options configures an S3-compatible segment store (protocol §5.2):
// AWS S3, Cloudflare R2, MinIO, versitygw.
type Options struct {
	// Bucket holds the segment objects. Required.
	Bucket string
	// Region signs requests. "auto" for R2. When empty, the SDK's chain
	// (AWS_REGION, shared config) must supply one.
	Region string
	// Endpoint is the service origin, e.g. https://<account>.r2.cloudflarestorage.com
	// or http://127.0.0.1:9000. Empty: the AWS endpoint for Region.
	Endpoint string
	// Prefix is prepended to every key, e.g. "syncular/". Default none.
	Prefix string
	// AccessKeyID and SecretAccessKey select static credentials (with an
	// optional SessionToken). When both are empty the SDK's default chain
	// is used: environment, shared config/profile, web identity, container
	// and instance roles, refreshed through the SDK's credentials cache.
	AccessKeyID     string
	SecretAccessKey string
	// SessionToken accompanies temporary static credentials (STS); it
	// needs AccessKeyID and SecretAccessKey.
	SessionToken string
	// PathStyle addresses objects as {endpoint}/{bucket}/{key} (the
	// reference layout). The zero value is virtual-hosted style; callers
	// default it to true.
	PathStyle bool
	// Timeout bounds each Lookup, and each Open until the response headers
	// arrive (the body then streams under the caller's context only).
	// Default: DefaultTimeout (the one store-wide default).
	Timeout time.Duration
	// HTTPClient overrides the HTTP client. Default: a client of its own
	// with dial and response-header timeouts of Timeout, no redirects.
	HTTPClient *http.Client
}

// Store reads segment records and bytes from an S3-compatible bucket the
// reference S3SegmentStore writes. It is safe for concurrent use.
type Store struct {
	client  *awss3.Client
	bucket  string
	prefix  string
	timeout time.Duration
	owned   *http.Transport // closed by Close when we built it
	errs    s3ErrorCounts   // faults met, by class (ErrorStats)
}

// New builds the store. It performs no network I/O: credentials from the
// default chain are fetched on first use.
func New(ctx context.Context, cfg Options) (*Store, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("store: s3 bucket is required")
	}
	if (cfg.AccessKeyID == "") != (cfg.SecretAccessKey == "") {
		return nil, errors.New("store: s3 access key id and secret access key must be given together")
	}
	if cfg.SessionToken != "" && cfg.AccessKeyID == "" {
		return nil, errors.New("store: s3 session token given without an access key id")
	}
	endpoint := strings.TrimRight(cfg.Endpoint, "/")
	if endpoint != "" {
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return nil, errors.New("store: s3 endpoint must be an http(s) origin such as https://host[:port]")
		}
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = store.DefaultTimeout
	}

	s := &Store{bucket: cfg.Bucket, prefix: cfg.Prefix, timeout: timeout}
	opts := []func(*config.LoadOptions) error{
		// A buildable client lets the SDK apply AWS_CA_BUNDLE and the like;
		// it is frozen into a client of our own below.
		config.WithHTTPClient(awshttp.NewBuildableClient().
			WithDialerOptions(func(d *net.Dialer) {
				d.Timeout = timeout
				d.KeepAlive = 30 * time.Second
			}).
			WithTransportOptions(func(tr *http.Transport) {
				tr.MaxIdleConns = 256
				tr.MaxIdleConnsPerHost = 128
				tr.IdleConnTimeout = 90 * time.Second
				tr.TLSHandshakeTimeout = timeout
				tr.ResponseHeaderTimeout = timeout
			})),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = s3MaxAttempts
				o.MaxBackoff = s3MaxBackoff
			})
		}),
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		// The SDK's configuration errors name files and profiles, not
		// credential values.
		return nil, fmt.Errorf("store: s3 configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return nil, errors.New("store: s3 region is required (set region, or AWS_REGION for the default chain)")
	}
	if cfg.HTTPClient != nil {
		awsCfg.HTTPClient = cfg.HTTPClient
	} else if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
		// Own the transport (Close releases its idle connections); no
		// client-wide timeout, which would cut long body streams.
		s.owned = bc.GetTransport()
		awsCfg.HTTPClient = &http.Client{
			Transport: s.owned,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		}
	}
	s.client = awss3.NewFromConfig(awsCfg, func(o *awss3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// The edge never writes, and clients hash what they receive: skip
		// the SDK's optional checksum headers and body validation, which
		// some S3-compatible services do not support.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return s, nil
}

// Client is the SDK client the store uses (a presigner shares it, and with
// it the credentials cache).
func (s *Store) Client() *awss3.Client { return s.client }

// Bucket is the configured bucket.
func (s *Store) Bucket() string { return s.bucket }

// Prefix is the configured key prefix.
func (s *Store) Prefix() string { return s.prefix }

// ObjectKey is the object key of id: {prefix}seg/sha256/{hex}.
func (s *Store) ObjectKey(id segid.ID) string { return s.prefix + "seg/sha256/" + id.Hex() }

// ObjectKey is the object key of segmentID under prefix:
// {prefix}seg/sha256/{hex} (the id's first ":" replaced by "/").
func ObjectKey(prefix, segmentID string) string { return segid.ObjectKey(prefix, segmentID) }

// RecordKey is the record object key of id:
// {prefix}rec/sha256/{hex}.json.
func (s *Store) RecordKey(id segid.ID) string { return s.prefix + "rec/sha256/" + id.Hex() + ".json" }

// RecordKey is the record object key of segmentID under prefix:
// {prefix}rec/sha256/{hex}.json (the id's first ":" replaced by "/").
func RecordKey(prefix, segmentID string) string { return segid.RecordKey(prefix, segmentID) }

// maxRecordObject bounds the body of a record object read by Lookup
// (about 2,500 publications). A larger one is a corrupt record.
const maxRecordObject = 1 << 20

// Lookup reads the record of id (protocol §5.2) with two
// requests run concurrently: a GET of the record object
// ({prefix}rec/sha256/{hex}.json) and a HEAD of the bytes object
// ({prefix}seg/sha256/{hex}). Every layout needs both: the record object,
// when it exists, is the whole record; the HEAD proves the bytes exist,
// gives their length (checked against byteLength), tells whether the
// object carries a legacy x-amz-meta-syncular-record header
// (Record.LegacyHeader) and carries that header, read only when there is
// no record object (the two are never merged). Running them together makes
// a cold lookup cost one round trip rather than two.
//
// A missing bytes object is
// ErrNotFound; bytes with neither a record object nor a header are
// ErrNotFound (a record that is gone). A record object or header that
// cannot be parsed, or an object whose length is not the record's
// byteLength, is a fault wrapping ErrCorruptRecord.
func (s *Store) Lookup(ctx context.Context, id segid.ID) (*store.Record, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("store: s3 lookup: %w", store.ErrNotFound)
	}
	segmentID := id.String()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	type recResult struct {
		body []byte
		err  error
	}
	recCh := make(chan recResult, 1)
	go func() {
		body, err := s.getRecordObject(ctx, id)
		recCh <- recResult{body, err}
	}()
	key := s.ObjectKey(id)
	head, err := s.client.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		cancel()
		<-recCh
		return nil, s.errs.count(s3MapError("HeadObject", key, err))
	}
	ro := <-recCh

	header, legacy := head.Metadata[RecordMetaKey]
	var rec *store.Record
	switch {
	case ro.err == nil:
		rec, err = decodeRecordJSON(ro.body, segmentID, "record object")
	case !errors.Is(ro.err, store.ErrNotFound):
		return nil, ro.err
	case strings.TrimSpace(header) == "":
		// Bytes without a record: an entry whose record is gone.
		return nil, store.ErrNotFound
	default:
		rec, err = decodeRecordHeader(header, segmentID)
	}
	if err != nil {
		return nil, err
	}
	if head.ContentLength == nil || *head.ContentLength != rec.ByteLength {
		return nil, fmt.Errorf("store: s3 record of %s: %w: object length is not byteLength", segmentID, store.ErrCorruptRecord)
	}
	rec.LegacyHeader = legacy
	return rec, nil
}

// getRecordObject reads the record object of id whole (at most
// maxRecordObject bytes). A missing object is ErrNotFound.
func (s *Store) getRecordObject(ctx context.Context, id segid.ID) ([]byte, error) {
	key := s.RecordKey(id)
	out, err := s.client.GetObject(ctx, &awss3.GetObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return nil, s.errs.count(s3MapError("GetObject", key, err))
	}
	defer out.Body.Close()
	body, err := io.ReadAll(io.LimitReader(out.Body, maxRecordObject+1))
	if err != nil {
		e, _ := s3Classify("GetObject", key, err)
		return nil, s.errs.count(e)
	}
	if len(body) > maxRecordObject {
		return nil, fmt.Errorf("store: s3 record of %s: %w: record object larger than %d bytes", id, store.ErrCorruptRecord, maxRecordObject)
	}
	return body, nil
}

// Check probes bucket, credentials and permissions with ranged GETs of a
// segment key and a record key that are never written
// ({prefix}seg/sha256/000…0 and {prefix}rec/sha256/000…0.json; the edge
// reads both prefixes). Only the service's NoSuchKey answers pass: they are
// what a lifecycle-deleted object will look like, so Lookup can then tell a
// missing object (ErrNotFound) from a configuration fault. A HEAD cannot: its 404 has no body, so a
// wrong bucket name, or on versitygw an unknown access key id, reads as
// "not found" there. On AWS, a 403 here usually means the credentials lack
// s3:ListBucket, without which S3 answers 403 instead of 404 for a missing
// object (every lifecycle-deleted segment would then be a store fault).
// Meant for startup, bounded by the store's timeout.
func (s *Store) Check(ctx context.Context) error {
	never := segid.Digest{}.ID()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	for _, key := range []string{s.ObjectKey(never), s.RecordKey(never)} {
		out, err := s.client.GetObject(ctx, &awss3.GetObjectInput{Bucket: &s.bucket, Key: &key, Range: aws.String("bytes=0-0")})
		if err == nil {
			out.Body.Close()
			continue
		}
		var nsk *types.NoSuchKey
		if errors.As(err, &nsk) {
			continue
		}
		e, _ := s3Classify("GetObject", key, err)
		return s.errs.count(e)
	}
	return nil
}

// HasSegments reports whether the prefix holds any segment object
// ({prefix}seg/, written by both record layouts): one ListObjectsV2 of at
// most one key, bounded by the store timeout. It needs s3:ListBucket,
// which read-only credentials may lack; the error then says so (an
// *Error) and the caller should not conclude anything.
func (s *Store) HasSegments(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	prefix := s.prefix + "seg/"
	out, err := s.client.ListObjectsV2(ctx, &awss3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix, MaxKeys: aws.Int32(1)})
	if err != nil {
		e, _ := s3Classify("ListObjectsV2", prefix, err)
		return false, e
	}
	return len(out.Contents) > 0, nil
}

// Close releases idle connections of the store's own HTTP client.
func (s *Store) Close() error {
	if s.owned != nil {
		s.owned.CloseIdleConnections()
	}
	return nil
}

// Interface guards
var (
	_ store.Store    = (*Store)(nil)
	_ store.Reporter = (*Store)(nil)
	_ error          = (*Error)(nil)
)
