package presign

import (
	"errors"
	"strings"
	"sync"
	"time"
)

// Defaults and limits of every signer's options (S3Options,
// CloudFrontOptions).
const (
	// DefaultTTL is the longest life of a signed URL.
	DefaultTTL = 60 * time.Second
	// MaxTTL is SigV4's limit on X-Amz-Expires (7 days), applied to
	// CloudFront's Expires too.
	MaxTTL = 7 * 24 * time.Hour
	// DefaultMaxEntries bounds a signer's URL cache.
	DefaultMaxEntries = 16384
)

// ErrGrantEnded is wrapped by every signer's "grant already ended" error
// (ErrS3GrantEnded, ErrCloudFrontGrantEnded): errors.Is(err,
// ErrGrantEnded) asks it whatever the signer.
var ErrGrantEnded = errors.New("grant already ended")

// ErrGrantTooShort is wrapped by every signer's "no whole-second URL fits
// before the grant ends" error (ErrS3GrantTooShort,
// ErrCloudFrontGrantTooShort). The grant is still live: serve the bytes.
var ErrGrantTooShort = errors.New("grant ends too soon for a signed URL")

// windowCache is the signing-window rule and URL cache every signer of
// this package shares. A URL is signed at the start of an aligned window
// (unix epoch, whole seconds) and expires at
//
//	start   = floor(now/W)*W                 (≤ now)
//	end     = ceil(notAfter) - 1             (the last whole second < notAfter)
//	expires = min(T, end-start)              (seconds after start)
//
// so it is the same for every request of a segment within a window and
// the same bound, whatever the edge, and it is over strictly before the
// grant is. When end is not after now no whole-second URL is both valid
// now and over before the grant: the caller streams instead. URLs are
// cached per (segment, start, expires).
type windowCache struct {
	ttl     int64 // seconds
	window  int64 // seconds
	perShrd int
	shards  [windowShards]windowShard
}

const windowShards = 16

// windowKey identifies one signed URL: the segment, the signing start
// (unix seconds) and its life after the start (seconds).
type windowKey struct {
	id      string
	start   int64
	expires int64
}

type windowEntry struct {
	url   string
	until int64 // unix ns after which the URL is no longer valid
}

type windowShard struct {
	mu    sync.RWMutex
	m     map[windowKey]windowEntry
	swept int64 // window start of the last sweep
	_     [32]byte
}

// newWindowCache checks ttl and window (window 0: TTL/4 rounded down to
// whole seconds, at least 1 s) and builds the cache. what names the
// signer in errors ("presign: s3").
func newWindowCache(what string, ttl, window time.Duration, maxEntries int) (*windowCache, error) {
	if ttl < time.Second || ttl > MaxTTL || ttl%time.Second != 0 {
		return nil, errors.New(what + ": ttl must be whole seconds between 1s and 7 days")
	}
	if window == 0 {
		window = (ttl / 4).Truncate(time.Second)
		if window < time.Second {
			window = time.Second
		}
	}
	if window < time.Second || window > ttl || window%time.Second != 0 {
		return nil, errors.New(what + ": window must be whole seconds between 1s and the ttl")
	}
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	c := &windowCache{
		ttl:     int64(ttl / time.Second),
		window:  int64(window / time.Second),
		perShrd: (maxEntries + windowShards - 1) / windowShards,
	}
	for i := range c.shards {
		c.shards[i].m = make(map[windowKey]windowEntry)
	}
	return c, nil
}

// get is the URL of segmentID (a valid id) for a request at now and a
// grant ending at notAfter: from the cache, else from sign, which signs
// for k and returns the URL and until it is valid (unix ns). Errors are
// ErrGrantEnded, ErrGrantTooShort or sign's.
func (c *windowCache) get(segmentID string, now, notAfter time.Time,
	sign func(k windowKey) (url string, until int64, err error)) (string, time.Time, error) {
	if !notAfter.After(now) {
		return "", time.Time{}, ErrGrantEnded
	}
	k, aligned, nowNs, ok := c.key(segmentID, now, notAfter)
	if !ok {
		return "", time.Time{}, ErrGrantTooShort
	}
	if e, hit := c.cached(k, nowNs); hit {
		return e.url, time.Unix(0, e.until), nil
	}
	url, until, err := sign(k)
	if err != nil {
		return "", time.Time{}, err
	}
	sh := c.shard(segmentID)
	k.id = strings.Clone(segmentID) // do not pin the caller's buffer
	sh.mu.Lock()
	if cur, ok := sh.m[k]; ok && nowNs < cur.until {
		// A concurrent caller signed first: hand out its URL, so every
		// caller in the window sees the same one.
		url, until = cur.url, cur.until
	} else {
		c.insert(sh, k, windowEntry{url: url, until: until}, aligned, nowNs)
	}
	sh.mu.Unlock()
	if until <= nowNs {
		return "", time.Time{}, errUnusable
	}
	return url, time.Unix(0, until), nil
}

// errUnusable: the signer's URL ends before now (S3 credentials that
// expire before the URL could be used).
var errUnusable = errors.New("credentials expire before the URL could be used")

// getCached is get answered from the cache only.
func (c *windowCache) getCached(segmentID string, now, notAfter time.Time) (string, time.Time, bool) {
	if !notAfter.After(now) {
		return "", time.Time{}, false
	}
	k, _, nowNs, fits := c.key(segmentID, now, notAfter)
	if !fits {
		return "", time.Time{}, false
	}
	e, hit := c.cached(k, nowNs)
	if !hit {
		return "", time.Time{}, false
	}
	return e.url, time.Unix(0, e.until), true
}

// shard is the shard of segmentID, a segment id (segid.Valid, checked by
// every caller): its first hex digit.
func (c *windowCache) shard(segmentID string) *windowShard {
	return &c.shards[hexVal(segmentID[7])]
}

// cached is the still-valid cache entry for k at nowNs, if any.
func (c *windowCache) cached(k windowKey, nowNs int64) (windowEntry, bool) {
	sh := c.shard(k.id)
	sh.mu.RLock()
	e, ok := sh.m[k]
	sh.mu.RUnlock()
	return e, ok && nowNs < e.until
}

// key is the cache key of a request at now for a grant ending at notAfter
// (the signing start and expires described at windowCache), the window
// start, and now in nanoseconds. ok is false when no URL fits
// (ErrGrantTooShort).
func (c *windowCache) key(segmentID string, now, notAfter time.Time) (k windowKey, aligned, nowNs int64, ok bool) {
	nowNs = now.UnixNano()
	naNs := nowNs + (c.ttl+c.window+1)*1e9 // beyond any bound: no overflow for far-future grants
	if d := notAfter.Sub(now); d < time.Duration(c.ttl+c.window+1)*time.Second {
		naNs = nowNs + int64(d)
	}
	nowS := floorDiv(nowNs, 1e9)
	aligned = nowS - mod(nowS, c.window)
	end := floorDiv(naNs-1, 1e9) // the last whole second strictly before notAfter
	if end*1e9 <= nowNs {
		return windowKey{}, aligned, nowNs, false
	}
	expires := end - aligned // ≥ 1: end > now ≥ aligned
	if expires > c.ttl {
		expires = c.ttl
	}
	return windowKey{id: segmentID, start: aligned, expires: expires}, aligned, nowNs, true
}

// insert adds e under k; sh.mu is held. The first insert of a window drops
// the shard's entries of past windows (and any expired early); a full shard
// then drops an arbitrary entry.
func (c *windowCache) insert(sh *windowShard, k windowKey, e windowEntry, aligned, nowNs int64) {
	if aligned > sh.swept {
		for ck, ce := range sh.m {
			if ck.start < aligned || ce.until <= nowNs {
				delete(sh.m, ck)
			}
		}
		sh.swept = aligned
	}
	if len(sh.m) >= c.perShrd {
		for ck := range sh.m {
			delete(sh.m, ck)
			break
		}
	}
	sh.m[k] = e
}

// len is the number of cached URLs.
func (c *windowCache) len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

func hexVal(c byte) int {
	if c <= '9' {
		return int(c - '0')
	}
	return int(c-'a') + 10
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func mod(a, b int64) int64 { return a - floorDiv(a, b)*b }
