package presign

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/testkit"
	"github.com/syncular/caddy-syncular/segid"
	s3store "github.com/syncular/caddy-syncular/store/s3"
)

const (
	s3tSeg    = "sha256:e4bf042fcff1b465955855b452050305804d76e8990c41c16dd291c1f05ca748"
	s3tHex    = "e4bf042fcff1b465955855b452050305804d76e8990c41c16dd291c1f05ca748"
	s3tAK     = "AKIDEXAMPLE"
	s3tSecret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
)

// s3tBase is a unix second aligned to 60 s (so to every window dividing it).
var s3tBase = time.Unix(1750000000-1750000000%60, 0)

func s3tAt(sec float64) time.Time {
	return s3tBase.Add(time.Duration(sec * float64(time.Second)))
}

func s3tStore(t testing.TB, cfg s3store.Options) *s3store.Store {
	t.Helper()
	if cfg.Bucket == "" {
		cfg.Bucket = "syncular-segments"
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = "https://s3.us-east-1.amazonaws.com"
	}
	if cfg.AccessKeyID == "" {
		cfg.AccessKeyID, cfg.SecretAccessKey = s3tAK, s3tSecret
	}
	cfg.PathStyle = true
	st, err := s3store.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// s3tPresigner builds a signer on st's client; api adds SDK middleware to
// every presign (through a copy of the client, as an operator's client
// options would).
func s3tPresigner(t testing.TB, st *s3store.Store, opts S3Options, api ...func(*middleware.Stack) error) *S3Signer {
	t.Helper()
	client := st.Client()
	if len(api) > 0 {
		client = s3.New(client.Options(), func(o *s3.Options) { o.APIOptions = append(o.APIOptions, api...) })
	}
	p, err := NewS3Signer(client, st.Bucket(), st.ObjectKey, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type s3tParsed struct {
	u       *url.URL
	q       url.Values
	date    time.Time
	expires int64
}

func s3tParse(t testing.TB, raw string) s3tParsed {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for k, v := range q {
		if len(v) != 1 {
			t.Fatalf("query parameter %s repeated: %s", k, raw)
		}
	}
	d, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil {
		t.Fatalf("X-Amz-Date: %v", err)
	}
	e, err := strconv.ParseInt(q.Get("X-Amz-Expires"), 10, 64)
	if err != nil {
		t.Fatalf("X-Amz-Expires: %v", err)
	}
	return s3tParsed{u: u, q: q, date: d, expires: e}
}

func TestS3PresignURLShape(t *testing.T) {
	for _, prefix := range []string{"", "syncular/"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			st := s3tStore(t, s3store.Options{Prefix: prefix})
			p := s3tPresigner(t, st, S3Options{})
			raw, _, err := p.URL(context.Background(), idOf(s3tSeg), s3tAt(7), s3tAt(3600))
			if err != nil {
				t.Fatal(err)
			}
			u := s3tParse(t, raw)
			if u.u.Scheme != "https" || u.u.Host != "s3.us-east-1.amazonaws.com" ||
				u.u.EscapedPath() != "/syncular-segments/"+prefix+"seg/sha256/"+s3tHex {
				t.Errorf("url %s", raw)
			}
			want := map[string]string{
				"X-Amz-Algorithm":     "AWS4-HMAC-SHA256",
				"X-Amz-Credential":    s3tAK + "/" + s3tBase.UTC().Format("20060102") + "/us-east-1/s3/aws4_request",
				"X-Amz-SignedHeaders": "host",
				"x-id":                "GetObject",
			}
			for k, v := range want {
				if got := u.q.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if sig := u.q.Get("X-Amz-Signature"); len(sig) != 64 {
				t.Errorf("signature %q", sig)
			}
			if len(u.q) != 7 {
				t.Errorf("unexpected query parameters: %v", u.q)
			}
			if strings.Contains(raw, s3tSecret) || strings.Contains(raw, url.QueryEscape(s3tSecret)) {
				t.Error("URL contains the secret")
			}
		})
	}
}

func TestS3PresignBounds(t *testing.T) {
	type c struct {
		name          string
		ttl, window   int64 // seconds; 0: default
		now, notAfter float64
		start, exp    float64 // expected X-Amz-Date (s after base), X-Amz-Expires
		err           error
	}
	cases := []c{
		{name: "far grant, start of window", ttl: 60, now: 0, notAfter: 1e6, start: 0, exp: 60},
		{name: "far grant, inside window", ttl: 60, now: 7.3, notAfter: 1e6, start: 0, exp: 60},
		{name: "far grant, end of window", ttl: 60, now: 14.999, notAfter: 1e6, start: 0, exp: 60},
		{name: "next window", ttl: 60, now: 15, notAfter: 1e6, start: 15, exp: 60},
		{name: "grant ends first", ttl: 60, now: 7.3, notAfter: 30.5, start: 0, exp: 30},
		// The URL ends strictly before notAfter (stores accept it at
		// date+expires itself), and must still be valid after now.
		{name: "grant ends on a second", ttl: 60, now: 7.3, notAfter: 9, start: 0, exp: 8},
		{name: "grant ends on the next second", ttl: 60, now: 7.3, notAfter: 8, err: ErrS3GrantTooShort},
		{name: "grant ends within the second", ttl: 60, now: 7.3, notAfter: 7.9, err: ErrS3GrantTooShort},
		{name: "grant ends 1ms after now", ttl: 60, now: 7.999, notAfter: 8.0, err: ErrS3GrantTooShort},
		{name: "grant ends 1ms after now, mid second", ttl: 60, now: 7.5, notAfter: 7.501, err: ErrS3GrantTooShort},
		{name: "now on a second, +300ms", ttl: 60, now: 7, notAfter: 7.3, err: ErrS3GrantTooShort},
		{name: "now on a second, +999ms", ttl: 60, now: 7, notAfter: 7.999, err: ErrS3GrantTooShort},
		{name: "now on a second, +1000ms", ttl: 60, now: 7, notAfter: 8, err: ErrS3GrantTooShort},
		{name: "now on a second, +1001ms", ttl: 60, now: 7, notAfter: 8.001, start: 0, exp: 8},
		{name: "mid second, next second fits", ttl: 60, now: 7.5, notAfter: 8.4, start: 0, exp: 8},
		{name: "at a window start, +1001ms", ttl: 60, now: 15, notAfter: 16.001, start: 15, exp: 1},
		{name: "at a window start, +1000ms", ttl: 60, now: 15, notAfter: 16, err: ErrS3GrantTooShort},
		{name: "window end, grant ends at next window", ttl: 60, now: 14.999, notAfter: 15, err: ErrS3GrantTooShort},
		{name: "window end, grant ends after next window", ttl: 60, now: 14.5, notAfter: 15.001, start: 0, exp: 15},
		{name: "grant ended at now", ttl: 60, now: 7.3, notAfter: 7.3, err: ErrS3GrantEnded},
		{name: "grant ended before now", ttl: 60, now: 7.3, notAfter: 2, err: ErrS3GrantEnded},
		{name: "ttl 1s", ttl: 1, now: 0.5, notAfter: 1e6, start: 0, exp: 1},
		{name: "ttl 900 window 1 (reference)", ttl: 900, window: 1, now: 0.123, notAfter: 1e6, start: 0, exp: 900},
		{name: "window 60 of ttl 60", ttl: 60, window: 60, now: 59.9, notAfter: 1e6, start: 0, exp: 60},
		{name: "window 60, grant ends before now+ttl", ttl: 60, window: 60, now: 59.9, notAfter: 70, start: 0, exp: 60},
		{name: "window 60, short grant", ttl: 60, window: 60, now: 59.9, notAfter: 60.2, start: 0, exp: 60},
		{name: "window 60, grant to the next second", ttl: 60, window: 60, now: 59.9, notAfter: 61.2, start: 0, exp: 60},
		{name: "window 60, grant ends on the next second", ttl: 60, window: 60, now: 59.9, notAfter: 60, err: ErrS3GrantTooShort},
		{name: "window 60, grant within second", ttl: 60, window: 60, now: 59.1, notAfter: 59.8, err: ErrS3GrantTooShort},
		{name: "default ttl", now: 3, notAfter: 1e6, start: 0, exp: 60},
		{name: "grant in year 9999", ttl: 60, now: 3, notAfter: -1, start: 0, exp: 60},
	}
	st := s3tStore(t, s3store.Options{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := s3tPresigner(t, st, S3Options{TTL: time.Duration(tc.ttl) * time.Second, Window: time.Duration(tc.window) * time.Second})
			now, notAfter := s3tAt(tc.now), s3tAt(tc.notAfter)
			if tc.notAfter == -1 {
				notAfter = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
			}
			raw, exp, err := p.URL(context.Background(), idOf(s3tSeg), now, notAfter)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || raw != "" {
					t.Fatalf("URL = %q, %v; want %v", raw, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			u := s3tParse(t, raw)
			if want := s3tAt(tc.start); !u.date.Equal(want) || u.expires != int64(tc.exp) {
				t.Errorf("X-Amz-Date %v (+%v), X-Amz-Expires %d; want +%v, %v",
					u.date, u.date.Sub(s3tBase), u.expires, tc.start, tc.exp)
			}
			end := u.date.Add(time.Duration(u.expires) * time.Second)
			if !exp.Equal(end) {
				t.Errorf("expiresAt %v, URL ends %v", exp, end)
			}
			s3tCheckInvariants(t, p, now, notAfter, u)
		})
	}
}

// s3tCheckInvariants: the URL is signed no later than now, lives at least
// 1 s, is still valid after now, ends no later than now+TTL and strictly
// before notAfter (a store accepts it at date+expires itself).
func s3tCheckInvariants(t testing.TB, p *S3Signer, now, notAfter time.Time, u s3tParsed) {
	t.Helper()
	end := u.date.Add(time.Duration(u.expires) * time.Second)
	if u.date.After(now) || u.expires < 1 || !end.After(now) {
		t.Fatalf("now %v notAfter %v: date %v expires %d", now, notAfter, u.date, u.expires)
	}
	if end.After(now.Add(p.TTL())) {
		t.Fatalf("now %v: URL ends %v, after now+TTL", now, end)
	}
	if !end.Before(notAfter) {
		t.Fatalf("now %v notAfter %v: URL ends %v (date %v, expires %d), not before the grant", now, notAfter, end, u.date, u.expires)
	}
}

func TestS3PresignBoundsRandom(t *testing.T) {
	st := s3tStore(t, s3store.Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 300; i++ {
		ttl := int64(1 + rng.IntN(900))
		window := int64(1 + rng.IntN(int(ttl)))
		p := s3tPresigner(t, st, S3Options{TTL: time.Duration(ttl) * time.Second, Window: time.Duration(window) * time.Second})
		now := s3tBase.Add(time.Duration(rng.Int64N(int64(2 * time.Hour))))
		var notAfter time.Time
		switch rng.IntN(3) {
		case 0:
			notAfter = now.Add(time.Duration(1 + rng.Int64N(int64(2*time.Second))))
		case 1:
			notAfter = now.Add(time.Duration(1 + rng.Int64N(int64(ttl)*int64(time.Second))))
		default:
			notAfter = now.Add(24 * time.Hour)
		}
		raw, _, err := p.URL(context.Background(), idOf(s3tSeg), now, notAfter)
		// Too short exactly when no whole second lies strictly between
		// now and notAfter.
		last := notAfter.Add(-1).Truncate(time.Second) // last whole second < notAfter
		if fits := last.After(now); !fits {
			if !errors.Is(err, ErrS3GrantTooShort) {
				t.Fatalf("now %v notAfter %v: URL %q, %v; want ErrS3GrantTooShort", now, notAfter, raw, err)
			}
			if _, _, ok := p.CachedURL(idOf(s3tSeg), now, notAfter); ok {
				t.Fatal("CachedURL answered a grant too short for a URL")
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		s3tCheckInvariants(t, p, now, notAfter, s3tParse(t, raw))
	}
}

func TestS3PresignOptionsValidation(t *testing.T) {
	st := s3tStore(t, s3store.Options{})
	for _, o := range []S3Options{
		{TTL: 500 * time.Millisecond},
		{TTL: 1500 * time.Millisecond},
		{TTL: 8 * 24 * time.Hour},
		{TTL: -time.Second},
		{TTL: 60 * time.Second, Window: 61 * time.Second},
		{TTL: 60 * time.Second, Window: 1500 * time.Millisecond},
		{TTL: 60 * time.Second, Window: -time.Second},
	} {
		if _, err := NewS3Signer(st.Client(), st.Bucket(), st.ObjectKey, o); err == nil {
			t.Errorf("accepted %+v", o)
		}
	}
	p, err := NewS3Signer(st.Client(), st.Bucket(), st.ObjectKey, S3Options{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if p.TTL() != 2*time.Second || p.Window() != time.Second {
		t.Errorf("ttl %v window %v", p.TTL(), p.Window())
	}
	if _, _, err := p.URL(context.Background(), idOf("sha256:ABC"), s3tAt(0), s3tAt(10)); err == nil {
		t.Error("malformed id accepted")
	}
}

// s3tCountSigns counts presign operations the SDK runs.
func s3tCountSigns(n *atomic.Int64) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("s3tCount",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				n.Add(1)
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	}
}

func TestS3PresignCache(t *testing.T) {
	st := s3tStore(t, s3store.Options{Prefix: "syncular/"})
	var signs atomic.Int64
	p := s3tPresigner(t, st, S3Options{TTL: 60 * time.Second, Window: 15 * time.Second}, s3tCountSigns(&signs))
	ctx := context.Background()
	far := s3tAt(1e6)
	url := func(id string, now, notAfter float64) string {
		t.Helper()
		u, _, err := p.URL(ctx, idOf(id), s3tAt(now), s3tAt(notAfter))
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	a := url(s3tSeg, 1, 1e6)
	if b := url(s3tSeg, 14.9, 1e6); b != a {
		t.Errorf("same window, different URL:\n%s\n%s", a, b)
	}
	if b := url(s3tSeg, 9, 2e6); b != a {
		t.Errorf("same window and bound, different URL")
	}
	if p.Len() != 1 || signs.Load() != 1 {
		t.Errorf("Len %d, %d signings after one distinct URL", p.Len(), signs.Load())
	}
	if b := url(s3tSeg, 15, 1e6); b == a {
		t.Error("next window, same URL")
	}
	other := "sha256:" + strings.Repeat("0", 64)
	if b := url(other, 1, 1e6); b == a || !strings.Contains(b, strings.Repeat("0", 64)) {
		t.Error("another segment, same URL")
	}
	// A bound shorter than the TTL is another entry with its own expiry.
	if b := url(s3tSeg, 1, 40.5); b == a || s3tParse(t, b).expires != 40 {
		t.Errorf("bounded URL %s", b)
	}
	// The sweep drops entries of past windows.
	url(s3tSeg, 600, 1e6)
	if n := p.Len(); n > 2 {
		t.Errorf("Len %d after moving on 40 windows", n)
	}
	// Concurrent callers in one window all get the same URL.
	var wg sync.WaitGroup
	urls := make([]string, 64)
	for i := range urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, _, err := p.URL(ctx, idOf(s3tSeg), s3tAt(1200+float64(i%10)/10), far)
			if err != nil {
				t.Error(err)
			}
			urls[i] = u
		}()
	}
	wg.Wait()
	for _, u := range urls {
		if u != urls[0] {
			t.Fatal("concurrent callers got different URLs")
		}
	}
	before := signs.Load()
	for i := 0; i < 100; i++ {
		url(s3tSeg, 1201+float64(i)/10, 1e6)
	}
	if n := signs.Load() - before; n != 0 {
		t.Errorf("%d signings for cached URLs", n)
	}
}

func TestS3PresignCacheBounded(t *testing.T) {
	st := s3tStore(t, s3store.Options{})
	p := s3tPresigner(t, st, S3Options{TTL: 60 * time.Second, MaxEntries: 32})
	for i := 0; i < 1000; i++ {
		sum := sha256.Sum256([]byte(strconv.Itoa(i)))
		if _, _, err := p.URL(context.Background(), idOf("sha256:"+hex.EncodeToString(sum[:])), s3tAt(1), s3tAt(1e6)); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.Len(); n > 32 {
		t.Errorf("cache holds %d entries, bound 32", n)
	}
}

// TestS3PresignCredentialExpiry: temporary credentials that expire before
// the URL would cut it short, and expiresAt says so.
func TestS3PresignCredentialExpiry(t *testing.T) {
	credEnd := s3tAt(20)
	client := s3.New(s3.Options{
		Region:       "auto",
		BaseEndpoint: aws.String("https://acct.r2.cloudflarestorage.com"),
		UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "ASIATEMP", SecretAccessKey: "s", SessionToken: "tok",
				CanExpire: true, Expires: credEnd}, nil
		}),
	})
	p, err := NewS3Signer(client, "segments", func(id segid.ID) string { return s3store.ObjectKey("", id.String()) }, S3Options{TTL: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	raw, exp, err := p.URL(context.Background(), idOf(s3tSeg), s3tAt(3), s3tAt(1e6))
	if err != nil {
		t.Fatal(err)
	}
	u := s3tParse(t, raw)
	if !exp.Equal(credEnd) || u.expires != 60 || u.q.Get("X-Amz-Security-Token") != "tok" {
		t.Errorf("expiresAt %v (want %v), url %s", exp, credEnd, raw)
	}
	if !strings.Contains(u.q.Get("X-Amz-Credential"), "/auto/s3/aws4_request") {
		t.Errorf("credential scope %s", u.q.Get("X-Amz-Credential"))
	}
}

// ---- cross-check with the reference's presigns ------------------------

type s3tVecPresign struct {
	Name   string `json:"name"`
	Config struct {
		Endpoint        string `json:"endpoint"`
		Region          string `json:"region"`
		Bucket          string `json:"bucket"`
		AccessKeyID     string `json:"accessKeyId"`
		SecretAccessKey string `json:"secretAccessKey"`
		SessionToken    string `json:"sessionToken"`
		KeyPrefix       string `json:"keyPrefix"`
	} `json:"config"`
	SegmentID string `json:"segmentId"`
	Options   struct {
		NowMs      int64 `json:"nowMs"`
		TTLSeconds int64 `json:"ttlSeconds"`
	} `json:"options"`
	Result struct {
		URL            string `json:"url"`
		URLExpiresAtMs int64  `json:"urlExpiresAtMs"`
	} `json:"result"`
	URLPathname      string `json:"urlPathname"`
	CanonicalRequest string `json:"canonicalRequest"`
}

func s3tVectors(t testing.TB) []s3tVecPresign {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testkit.VectorsDir(t), "s3-objects.json"))
	if err != nil {
		t.Fatalf("vectors: %v (set SYNCULAR_VECTORS)", err)
	}
	var v struct {
		Presigns []s3tVecPresign `json:"presigns"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Presigns) == 0 {
		t.Fatal("vectors: no presigns")
	}
	return v.Presigns
}

// s3tDropXID removes the SDK's x-id=GetObject before signing, so the
// canonical request can be compared with the reference's byte for byte.
func s3tDropXID(stack *middleware.Stack) error {
	return stack.Build.Add(middleware.BuildMiddlewareFunc("s3tDropXID",
		func(ctx context.Context, in middleware.BuildInput, next middleware.BuildHandler) (middleware.BuildOutput, middleware.Metadata, error) {
			if req, ok := in.Request.(*smithyhttp.Request); ok {
				q := req.URL.Query()
				q.Del("x-id")
				req.URL.RawQuery = q.Encode()
			}
			return next.HandleBuild(ctx, in)
		}), middleware.After)
}

// TestS3PresignVectors compares with the reference presignSegmentGet.
// Same: path (for keys S3 does not escape), algorithm, credential scope
// (incl. region "auto"), X-Amz-Date, X-Amz-Expires, SignedHeaders=host,
// security token, UNSIGNED-PAYLOAD, and so the signature once the SDK's
// extra x-id=GetObject is dropped. Different: the SDK adds x-id (another
// signature), orders parameters differently, and escapes "+()" in a key
// per SigV4 where the reference signs them literally.
func TestS3PresignVectors(t *testing.T) {
	for _, v := range s3tVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			st := s3tStore(t, s3store.Options{
				Bucket: v.Config.Bucket, Region: v.Config.Region, Endpoint: v.Config.Endpoint,
				Prefix: v.Config.KeyPrefix, AccessKeyID: v.Config.AccessKeyID,
				SecretAccessKey: v.Config.SecretAccessKey, SessionToken: v.Config.SessionToken,
			})
			ttl := v.Options.TTLSeconds
			if ttl == 0 {
				ttl = 900 // the reference default
			}
			opts := S3Options{TTL: time.Duration(ttl) * time.Second, Window: time.Second}
			now := time.UnixMilli(v.Options.NowMs)
			ref := s3tParse(t, v.Result.URL)
			escapes := strings.ContainsAny(v.Config.KeyPrefix, "+()")

			for _, variant := range []string{"sdk", "without x-id"} {
				var api []func(*middleware.Stack) error
				if variant == "without x-id" {
					api = append(api, s3tDropXID)
				}
				p := s3tPresigner(t, st, opts, api...)
				raw, exp, err := p.URL(context.Background(), idOf(v.SegmentID), now, now.Add(24*time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				got := s3tParse(t, raw)
				if exp.UnixMilli() != v.Result.URLExpiresAtMs {
					t.Errorf("%s: expiresAt %d, reference %d", variant, exp.UnixMilli(), v.Result.URLExpiresAtMs)
				}
				if got.u.Scheme+"://"+got.u.Host != ref.u.Scheme+"://"+ref.u.Host {
					t.Errorf("%s: origin %s", variant, raw)
				}
				if escapes {
					// Same key, escaped per SigV4 by the SDK.
					if got.u.EscapedPath() == v.URLPathname || got.u.Path != ref.u.Path {
						t.Errorf("%s: path %s vs reference %s", variant, got.u.EscapedPath(), v.URLPathname)
					}
				} else if got.u.EscapedPath() != v.URLPathname {
					t.Errorf("%s: path %s, reference %s", variant, got.u.EscapedPath(), v.URLPathname)
				}
				for k := range ref.q {
					if k == "X-Amz-Signature" {
						continue
					}
					if got.q.Get(k) != ref.q.Get(k) {
						t.Errorf("%s: %s = %q, reference %q", variant, k, got.q.Get(k), ref.q.Get(k))
					}
				}
				sameSig := got.q.Get("X-Amz-Signature") == ref.q.Get("X-Amz-Signature")
				switch {
				case variant == "sdk":
					if got.q.Get("x-id") != "GetObject" || len(got.q) != len(ref.q)+1 || sameSig {
						t.Errorf("sdk: expected exactly one extra parameter x-id and another signature: %s", raw)
					}
				case escapes:
					if sameSig {
						t.Errorf("without x-id: same signature despite a differently escaped path")
					}
				default:
					if len(got.q) != len(ref.q) || !sameSig {
						t.Errorf("without x-id: signature %s, reference %s", got.q.Get("X-Amz-Signature"), ref.q.Get("X-Amz-Signature"))
					}
				}
			}
			if !strings.Contains(v.CanonicalRequest, "\nhost\nUNSIGNED-PAYLOAD") {
				t.Errorf("reference canonical request layout changed")
			}
		})
	}
}

// ---- against a real versitygw -----------------------------------------

func TestS3PresignVersitygw(t *testing.T) {
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, "segments")
	body := []byte("bytes behind a presigned redirect")
	id := s3test.PutSegment(t, srv.Client(), "segments", "syncular/", body, "")
	st := s3tStore(t, s3store.Options{
		Bucket: "segments", Region: srv.Region, Endpoint: srv.Endpoint, Prefix: "syncular/",
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey,
	})
	ctx := context.Background()
	get := func(u string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}

	t.Run("fetch", func(t *testing.T) {
		p, err := NewS3Signer(st.Client(), st.Bucket(), st.ObjectKey, S3Options{})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		u, exp, err := p.URL(ctx, idOf(id), now, now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if exp.After(now.Add(60*time.Second)) || !exp.After(now.Add(44*time.Second)) {
			t.Errorf("expiresAt %v for now %v", exp, now)
		}
		status, b := get(u)
		sum := sha256.Sum256(b)
		if status != 200 || "sha256:"+hex.EncodeToString(sum[:]) != id {
			t.Fatalf("GET presigned: %d %q", status, b)
		}
		if n := srv.CountRequests(t, "s3_GetObject", "syncular/seg/sha256/"+id[7:]); n != 1 {
			t.Errorf("server logged %d GETs of the object", n)
		}
	})

	t.Run("expired URL is refused", func(t *testing.T) {
		p, err := NewS3Signer(st.Client(), st.Bucket(), st.ObjectKey, S3Options{TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		// Start early in a second so the 1 s URL is usable at once.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
		now := time.Now()
		u, exp, err := p.URL(ctx, idOf(id), now, now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if s3tParse(t, u).expires != 1 {
			t.Fatalf("url %s", u)
		}
		if status, _ := get(u); status != 200 {
			t.Errorf("fresh 1 s URL: %d", status)
		}
		time.Sleep(time.Until(exp.Add(1200 * time.Millisecond)))
		status, b := get(u)
		if status != 403 {
			t.Errorf("expired URL: %d %s", status, b)
		}
		t.Logf("after expiry: %d %s", status, b)
	})

	t.Run("grant bound", func(t *testing.T) {
		p, err := NewS3Signer(st.Client(), st.Bucket(), st.ObjectKey, S3Options{TTL: 60 * time.Second, Window: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		notAfter := now.Add(1500 * time.Millisecond)
		u, exp, err := p.URL(ctx, idOf(id), now, notAfter)
		if err != nil {
			t.Fatal(err)
		}
		if exp.After(notAfter) {
			t.Fatalf("URL outlives the grant: %v > %v", exp, notAfter)
		}
		time.Sleep(time.Until(exp.Add(1200 * time.Millisecond)))
		if status, _ := get(u); status != 403 {
			t.Errorf("URL past its grant: %d", status)
		}
	})
}

// ---- benchmarks -------------------------------------------------------

func BenchmarkS3PresignCached(b *testing.B) {
	st := s3tStore(b, s3store.Options{Prefix: "syncular/"})
	p := s3tPresigner(b, st, S3Options{})
	ctx := context.Background()
	now, notAfter := s3tAt(1), s3tAt(1e6)
	if _, _, err := p.URL(ctx, idOf(s3tSeg), now, notAfter); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := p.URL(ctx, idOf(s3tSeg), now, notAfter); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkS3PresignUncached(b *testing.B) {
	st := s3tStore(b, s3store.Options{Prefix: "syncular/"})
	p := s3tPresigner(b, st, S3Options{})
	ctx := context.Background()
	now := s3tAt(0)
	w := p.Window()
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(w) // every call in a new window: a miss
		if _, _, err := p.URL(ctx, idOf(s3tSeg), now, now.Add(time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
}
