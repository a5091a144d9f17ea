package presign

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
)

// Defaults and limits of S3PresignOptions.
const (
	// DefaultS3PresignTTL is the longest life of a presigned URL.
	DefaultS3PresignTTL = 60 * time.Second
	// MaxS3PresignTTL is SigV4's limit on X-Amz-Expires (7 days).
	MaxS3PresignTTL = 7 * 24 * time.Hour
	// DefaultS3PresignMaxEntries bounds the URL cache.
	DefaultS3PresignMaxEntries = 16384
)

// ErrS3GrantEnded is returned for a notAfter that is not after now: there is
// no grant left to hand out a URL for.
var ErrS3GrantEnded = errors.New("presign: s3: grant already ended")

// ErrS3GrantTooShort is returned when the grant ends so soon that no
// presigned URL (whole seconds, SigV4) can be valid now and expire before
// the grant does. The grant itself is still live: serve the bytes.
var ErrS3GrantTooShort = errors.New("presign: s3: grant ends too soon for a presigned URL")

// S3PresignOptions configures an S3Presigner.
type S3PresignOptions struct {
	// TTL is the longest a URL may stay valid after the request it answers
	// (presign_ttl). Whole seconds, 1 s to 7 days. Default 60 s.
	TTL time.Duration
	// Window is the signing-time granularity: every request within one
	// window (aligned on the unix epoch) for the same segment and the same
	// validity gets the identical URL, signed at the window's start. Whole
	// seconds, 1 s to TTL. Default TTL/4 rounded down to whole seconds
	// (at least 1 s): a URL then has between 3/4 of TTL and TTL left when
	// it is handed out.
	Window time.Duration
	// MaxEntries bounds the URL cache. Default DefaultS3PresignMaxEntries.
	MaxEntries int
}

// S3Presigner issues SigV4 presigned GETs of segment objects
// ({prefix}seg/sha256/{hex}) through aws-sdk-go-v2, on aligned time windows,
// and caches them so repeated requests get the identical URL. It is safe
// for concurrent use.
//
// Credentials come from the client (and its credentials cache), so rotated
// credentials are picked up on the next signing. A URL already handed out
// stays valid at the store until its own expiry even if the credentials
// that signed it rotate (temporary credentials that expire earlier cut it
// short; expiresAt says so).
type S3Presigner struct {
	pc        *s3.PresignClient
	api       []func(*middleware.Stack) error // extra SDK middleware (tests)
	bucket    string
	objectKey func(string) string // segment id → object key (the store's layout)
	ttl       int64               // seconds
	window    int64               // seconds
	perShrd   int
	shards    [s3Shards]s3Shard
}

const s3Shards = 16

type s3Key struct {
	id      string
	start   int64 // signing time, unix seconds
	expires int64 // X-Amz-Expires, seconds
}

type s3Entry struct {
	url   string
	until int64 // unix ns after which the URL is no longer valid
}

type s3Shard struct {
	mu    sync.RWMutex
	m     map[s3Key]s3Entry
	swept int64 // window start of the last sweep
	_     [32]byte
}

// NewS3Presigner builds a presigner on client (its region, endpoint,
// path style and credentials) for objects in bucket; objectKey maps a
// segment id to its key (the store's layout, e.g. store.(*S3).ObjectKey),
// so this package knows nothing of how a store lays out its bucket.
func NewS3Presigner(client *s3.Client, bucket string, objectKey func(segmentID string) string, opts S3PresignOptions) (*S3Presigner, error) {
	return newS3Presigner(client, bucket, objectKey, opts)
}

func newS3Presigner(client *s3.Client, bucket string, objectKey func(string) string, opts S3PresignOptions,
	apiOptions ...func(*middleware.Stack) error) (*S3Presigner, error) {
	if client == nil || bucket == "" || objectKey == nil {
		return nil, errors.New("presign: s3: client, bucket and object key layout are required")
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultS3PresignTTL
	}
	if ttl < time.Second || ttl > MaxS3PresignTTL || ttl%time.Second != 0 {
		return nil, errors.New("presign: s3: ttl must be whole seconds between 1s and 7 days")
	}
	window := opts.Window
	if window == 0 {
		window = (ttl / 4).Truncate(time.Second)
		if window < time.Second {
			window = time.Second
		}
	}
	if window < time.Second || window > ttl || window%time.Second != 0 {
		return nil, errors.New("presign: s3: window must be whole seconds between 1s and the ttl")
	}
	max := opts.MaxEntries
	if max <= 0 {
		max = DefaultS3PresignMaxEntries
	}

	logOpts := client.Options()
	signer := &s3TimedSigner{v4: v4.NewSigner(func(so *v4.SignerOptions) {
		// As the SDK's own S3 presigner: S3 paths are not escaped twice.
		so.Logger = logOpts.Logger
		so.LogSigning = logOpts.ClientLogMode.IsSigning()
		so.DisableURIPathEscaping = true
	})}
	pc := s3.NewPresignClient(client, func(po *s3.PresignOptions) {
		po.Presigner = signer
		// Applied at construction and again per operation: idempotent only.
		po.ClientOptions = append(po.ClientOptions, func(o *s3.Options) {
			// No x-amz-checksum-mode on a GET a browser will follow.
			o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		})
	})

	p := &S3Presigner{
		pc:        pc,
		api:       apiOptions,
		bucket:    bucket,
		objectKey: objectKey,
		ttl:       int64(ttl / time.Second),
		window:    int64(window / time.Second),
		perShrd:   (max + s3Shards - 1) / s3Shards,
	}
	for i := range p.shards {
		p.shards[i].m = make(map[s3Key]s3Entry)
	}
	return p, nil
}

// TTL is the configured longest URL life.
func (p *S3Presigner) TTL() time.Duration { return time.Duration(p.ttl) * time.Second }

// Window is the configured signing window.
func (p *S3Presigner) Window() time.Duration { return time.Duration(p.window) * time.Second }

// URL returns a presigned GET of segmentID's object that expires strictly
// before notAfter and no later than now+TTL. notAfter not after now is
// ErrS3GrantEnded; a grant too close to its end for any URL to fit is
// ErrS3GrantTooShort (the caller serves the bytes itself instead).
//
// With W the window, T the TTL (whole seconds) and times in seconds:
//
//	start   = floor(now/W)*W                 (≤ now: X-Amz-Date)
//	end     = ceil(notAfter) - 1             (the last whole second < notAfter)
//	expires = min(T, end-start)              (X-Amz-Expires)
//	start+expires ≤ now+T (as start ≤ now) and < notAfter
//
// The URL's end is strictly before notAfter because stores count a
// presigned URL valid up to and including date+expires (versitygw rejects
// only when date+expires is before its clock): a URL ending exactly at
// notAfter would still fetch at the instant the grant is over. When end is
// not after now, no whole-second URL is both still valid at now and over
// before the grant: that is ErrS3GrantTooShort (at most the last second of
// a grant, or the last two when it ends on a whole second). URLs are
// cached per (segment, start, expires): every call in a window with the
// same bound gets the same URL.
func (p *S3Presigner) URL(ctx context.Context, segmentID string, now, notAfter time.Time) (string, time.Time, error) {
	if !s3ValidID(segmentID) {
		return "", time.Time{}, errors.New("presign: s3: malformed segment id")
	}
	if !notAfter.After(now) {
		return "", time.Time{}, ErrS3GrantEnded
	}
	k, aligned, nowNs, ok := p.key(segmentID, now, notAfter)
	if !ok {
		return "", time.Time{}, ErrS3GrantTooShort
	}
	if e, hit := p.cached(k, nowNs); hit {
		return e.url, time.Unix(0, e.until), nil
	}
	sh := &p.shards[s3HexVal(segmentID[7])]

	url, credUntil, err := p.sign(ctx, segmentID, k.start, k.expires)
	if err != nil {
		return "", time.Time{}, err
	}
	until := (k.start + k.expires) * 1e9
	if credUntil != 0 && credUntil < until {
		until = credUntil
	}
	k.id = strings.Clone(segmentID) // do not pin the caller's buffer
	sh.mu.Lock()
	if cur, ok := sh.m[k]; ok && nowNs < cur.until {
		// A concurrent caller signed first: hand out its URL, so every
		// caller in the window sees the same one.
		url, until = cur.url, cur.until
	} else {
		p.insert(sh, k, s3Entry{url: url, until: until}, aligned, nowNs)
	}
	sh.mu.Unlock()
	if until <= nowNs {
		return "", time.Time{}, errors.New("presign: s3: credentials expire before the URL could be used")
	}
	return url, time.Unix(0, until), nil
}

// CachedURL is URL answered from the cache only: ok is false when the URL
// for this request is not cached yet (call URL then). It does no I/O and
// needs no context.
func (p *S3Presigner) CachedURL(segmentID string, now, notAfter time.Time) (url string, expires time.Time, ok bool) {
	if !s3ValidID(segmentID) || !notAfter.After(now) {
		return "", time.Time{}, false
	}
	k, _, nowNs, fits := p.key(segmentID, now, notAfter)
	if !fits {
		return "", time.Time{}, false
	}
	e, hit := p.cached(k, nowNs)
	if !hit {
		return "", time.Time{}, false
	}
	return e.url, time.Unix(0, e.until), true
}

// cached is the still-valid cache entry for k at nowNs, if any.
func (p *S3Presigner) cached(k s3Key, nowNs int64) (s3Entry, bool) {
	sh := &p.shards[s3HexVal(k.id[7])]
	sh.mu.RLock()
	e, ok := sh.m[k]
	sh.mu.RUnlock()
	return e, ok && nowNs < e.until
}

// key is the cache key of a request at now for a grant ending at notAfter
// (the signing start and expires described at URL), the window start, and
// now in nanoseconds. ok is false when no URL fits (ErrS3GrantTooShort).
func (p *S3Presigner) key(segmentID string, now, notAfter time.Time) (k s3Key, aligned, nowNs int64, ok bool) {
	nowNs = now.UnixNano()
	naNs := nowNs + (p.ttl+p.window+1)*1e9 // beyond any bound: no overflow for far-future grants
	if d := notAfter.Sub(now); d < time.Duration(p.ttl+p.window+1)*time.Second {
		naNs = nowNs + int64(d)
	}
	nowS := s3FloorDiv(nowNs, 1e9)
	aligned = nowS - s3Mod(nowS, p.window)
	end := s3FloorDiv(naNs-1, 1e9) // the last whole second strictly before notAfter
	if end*1e9 <= nowNs {
		return s3Key{}, aligned, nowNs, false
	}
	expires := end - aligned // ≥ 1: end > now ≥ aligned
	if expires > p.ttl {
		expires = p.ttl
	}
	return s3Key{id: segmentID, start: aligned, expires: expires}, aligned, nowNs, true
}

// insert adds e under k; sh.mu is held. The first insert of a window drops
// the shard's entries of past windows (and any expired early); a full shard
// then drops an arbitrary entry.
func (p *S3Presigner) insert(sh *s3Shard, k s3Key, e s3Entry, aligned, nowNs int64) {
	if aligned > sh.swept {
		for ck, ce := range sh.m {
			if ck.start < aligned || ce.until <= nowNs {
				delete(sh.m, ck)
			}
		}
		sh.swept = aligned
	}
	if len(sh.m) >= p.perShrd {
		for ck := range sh.m {
			delete(sh.m, ck)
			break
		}
	}
	sh.m[k] = e
}

// Len is the number of cached URLs.
func (p *S3Presigner) Len() int {
	n := 0
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

// sign presigns through the SDK with X-Amz-Date = start and X-Amz-Expires =
// expires. credUntil is the signing credentials' expiry (unix ns), 0 when
// they do not expire.
func (p *S3Presigner) sign(ctx context.Context, segmentID string, start, expires int64) (string, int64, error) {
	st := &s3SignState{at: time.Unix(start, 0).UTC()}
	ctx = context.WithValue(ctx, s3SignStateKey{}, st)
	key := p.objectKey(segmentID)
	optFns := []func(*s3.PresignOptions){s3.WithPresignExpires(time.Duration(expires) * time.Second)}
	if len(p.api) > 0 {
		optFns = append(optFns, s3.WithPresignClientFromClientOptions(func(o *s3.Options) {
			o.APIOptions = append(o.APIOptions, p.api...)
		}))
	}
	req, err := p.pc.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: &p.bucket, Key: &key}, optFns...)
	if err != nil {
		// SDK presign errors come from credential resolution or endpoint
		// rules; they carry no URL (none exists yet) and no secret.
		return "", 0, errors.New("presign: s3: " + err.Error())
	}
	if !st.used {
		return "", 0, errors.New("presign: s3: signing time was not applied")
	}
	if req.Method != http.MethodGet {
		return "", 0, errors.New("presign: s3: unexpected method " + req.Method)
	}
	return req.URL, st.credUntil, nil
}

type s3SignStateKey struct{}

// s3SignState carries the chosen signing time into the SDK's presign
// middleware, and the credentials' expiry back out.
type s3SignState struct {
	at        time.Time
	used      bool
	credUntil int64
}

// s3TimedSigner is the SDK's v4 signer with the signing time taken from the
// context instead of the clock (the SDK passes sdk.NowTime()).
type s3TimedSigner struct{ v4 *v4.Signer }

func (s *s3TimedSigner) PresignHTTP(ctx context.Context, creds aws.Credentials, r *http.Request,
	payloadHash, service, region string, signingTime time.Time, optFns ...func(*v4.SignerOptions),
) (string, http.Header, error) {
	if st, ok := ctx.Value(s3SignStateKey{}).(*s3SignState); ok {
		signingTime = st.at
		st.used = true
		if creds.CanExpire {
			st.credUntil = creds.Expires.UnixNano()
		}
	}
	return s.v4.PresignHTTP(ctx, creds, r, payloadHash, service, region, signingTime, optFns...)
}

func s3ValidID(id string) bool {
	if len(id) != 71 || id[:7] != "sha256:" {
		return false
	}
	for i := 7; i < 71; i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func s3HexVal(c byte) int {
	if c <= '9' {
		return int(c - '0')
	}
	return int(c-'a') + 10
}

func s3FloorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func s3Mod(a, b int64) int64 { return a - s3FloorDiv(a, b)*b }
