package presign

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/segid"
)

// ErrS3GrantEnded is returned for a notAfter that is not after now: there is
// no grant left to hand out a URL for. It wraps ErrGrantEnded.
var ErrS3GrantEnded = fmt.Errorf("presign: s3: %w", ErrGrantEnded)

// ErrS3GrantTooShort is returned when the grant ends so soon that no
// presigned URL (whole seconds, SigV4) can be valid now and expire before
// the grant does. The grant itself is still live: serve the bytes. It
// wraps ErrGrantTooShort.
var ErrS3GrantTooShort = fmt.Errorf("presign: s3: %w", ErrGrantTooShort)

// S3Options configures an S3Signer.
type S3Options struct {
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
	// MaxEntries bounds the URL cache. Default DefaultMaxEntries.
	MaxEntries int
}

// S3Signer issues SigV4 presigned GETs of segment objects
// ({prefix}seg/sha256/{hex}) through aws-sdk-go-v2, on aligned time windows,
// and caches them so repeated requests get the identical URL. It is safe
// for concurrent use.
//
// Credentials come from the client (and its credentials cache), so rotated
// credentials are picked up on the next signing. A URL already handed out
// stays valid at the store until its own expiry even if the credentials
// that signed it rotate (temporary credentials that expire earlier cut it
// short; expiresAt says so).
type S3Signer struct {
	pc        *s3.PresignClient
	bucket    string
	objectKey func(segid.ID) string // segment id → object key (the store's layout)
	cache     *windowCache
}

// NewS3Signer builds a presigner on client (its region, endpoint,
// path style and credentials) for objects in bucket; objectKey maps a
// segment id to its key (the store's layout, e.g. s3.(*Store).ObjectKey in store/s3),
// so this package knows nothing of how a store lays out its bucket.
func NewS3Signer(client *s3.Client, bucket string, objectKey func(segid.ID) string, opts S3Options) (*S3Signer, error) {
	if client == nil || bucket == "" || objectKey == nil {
		return nil, errors.New("presign: s3: client, bucket and object key layout are required")
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	cache, err := newWindowCache("presign: s3", ttl, opts.Window, opts.MaxEntries)
	if err != nil {
		return nil, err
	}

	logOpts := client.Options()
	signer := &sigV4TimedSigner{v4: v4.NewSigner(func(so *v4.SignerOptions) {
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

	p := &S3Signer{
		pc:        pc,
		bucket:    bucket,
		objectKey: objectKey,
		cache:     cache,
	}
	return p, nil
}

// TTL is the configured longest URL life.
func (p *S3Signer) TTL() time.Duration { return time.Duration(p.cache.ttl) * time.Second }

// Window is the configured signing window.
func (p *S3Signer) Window() time.Duration { return time.Duration(p.cache.window) * time.Second }

// URL returns a presigned GET of id's object that expires strictly
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
func (p *S3Signer) URL(ctx context.Context, id segid.ID, now, notAfter time.Time) (string, time.Time, error) {
	if id.IsZero() {
		return "", time.Time{}, errors.New("presign: s3: the zero segment id")
	}
	u, exp, err := p.cache.get(id.String(), now, notAfter, func(k windowKey) (string, int64, error) {
		url, credUntil, err := p.sign(ctx, id, k.start, k.expires)
		if err != nil {
			return "", 0, err
		}
		until := (k.start + k.expires) * 1e9
		if credUntil != 0 && credUntil < until {
			until = credUntil
		}
		return url, until, nil
	})
	switch err {
	case nil:
		return u, exp, nil
	case ErrGrantEnded:
		return "", time.Time{}, ErrS3GrantEnded
	case ErrGrantTooShort:
		return "", time.Time{}, ErrS3GrantTooShort
	case errUnusable:
		return "", time.Time{}, errors.New("presign: s3: " + errUnusable.Error())
	}
	return "", time.Time{}, err
}

// CachedURL is URL answered from the cache only: ok is false when the URL
// for this request is not cached yet (call URL then). It does no I/O and
// needs no context.
func (p *S3Signer) CachedURL(id segid.ID, now, notAfter time.Time) (url string, expires time.Time, ok bool) {
	if id.IsZero() {
		return "", time.Time{}, false
	}
	return p.cache.getCached(id.String(), now, notAfter)
}

// Len is the number of cached URLs.
func (p *S3Signer) Len() int { return p.cache.len() }

// sign presigns through the SDK with X-Amz-Date = start and X-Amz-Expires =
// expires. credUntil is the signing credentials' expiry (unix ns), 0 when
// they do not expire.
func (p *S3Signer) sign(ctx context.Context, id segid.ID, start, expires int64) (string, int64, error) {
	st := &sigV4State{at: time.Unix(start, 0).UTC()}
	ctx = context.WithValue(ctx, sigV4StateKey{}, st)
	key := p.objectKey(id)
	req, err := p.pc.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: &p.bucket, Key: &key}, s3.WithPresignExpires(time.Duration(expires)*time.Second))
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

type sigV4StateKey struct{}

// sigV4State carries the chosen signing time into the SDK's presign
// middleware, and the credentials' expiry back out.
type sigV4State struct {
	at        time.Time
	used      bool
	credUntil int64
}

// sigV4TimedSigner is the SDK's v4 signer with the signing time taken from the
// context instead of the clock (the SDK passes sdk.NowTime()).
type sigV4TimedSigner struct{ v4 *v4.Signer }

func (s *sigV4TimedSigner) PresignHTTP(ctx context.Context, creds aws.Credentials, r *http.Request,
	payloadHash, service, region string, signingTime time.Time, optFns ...func(*v4.SignerOptions),
) (string, http.Header, error) {
	if st, ok := ctx.Value(sigV4StateKey{}).(*sigV4State); ok {
		signingTime = st.at
		st.used = true
		if creds.CanExpire {
			st.credUntil = creds.Expires.UnixNano()
		}
	}
	return s.v4.PresignHTTP(ctx, creds, r, payloadHash, service, region, signingTime, optFns...)
}
