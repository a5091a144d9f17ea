package token

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/maphash"
	"io"
	"strings"
	"sync"
	"sync/atomic"
)

// Audience derives the opaque audience string a token carries from a
// partition id (protocol §3). The host chooses the function; the edge
// must be configured with the same one. Implementations are safe for
// concurrent use.
type Audience interface {
	Derive(partition string) string
}

// TemplateAudience returns the audience rule that replaces every
// "{partition}" in tmpl with the partition id, e.g. "aud:{partition}" (the
// reference conformance harness). Nothing else in tmpl is interpreted: it
// is not a Caddy placeholder and must not pass through a replacer.
func TemplateAudience(tmpl string) Audience { return templateAudience(tmpl) }

type templateAudience string

func (t templateAudience) Derive(partition string) string {
	return strings.ReplaceAll(string(t), "{partition}", partition)
}

// HMACAudience returns the keyed audience rule
// HMAC-SHA256(key, UTF-8 partition id), rendered per encoding: "hex"
// (lowercase; also the default for "") or "base64url" (unpadded). Any
// other encoding, or an empty key, is an error. The key is copied.
//
// The rule remembers the audiences of up to audienceCacheSize partitions,
// so a partition's HMAC is computed once, not once per request. The cache
// belongs to the returned value: a configuration reload builds a new one.
func HMACAudience(key []byte, encoding string) (Audience, error) {
	if len(key) == 0 {
		return nil, errors.New("token: audience key is empty")
	}
	a := &hmacAudience{key: append([]byte(nil), key...), seed: maphash.MakeSeed()}
	switch encoding {
	case "", "hex":
		a.encode = hex.AppendEncode
	case "base64url":
		a.encode = base64.RawURLEncoding.AppendEncode
	default:
		return nil, fmt.Errorf("token: unknown audience encoding %q (want hex or base64url)", encoding)
	}
	a.macs.New = func() any { return hmac.New(sha256.New, a.key) }
	return a, nil
}

const (
	// audienceCacheSize bounds the partitions whose audience an
	// hmacAudience remembers (audienceShards shards of equal size).
	audienceCacheSize = 4096
	audienceShards    = 64
)

// hmacAudience caches derived audiences in sharded copy-on-write maps
// rather than an LRU: a hit is an atomic load and a map read, writing no
// shared memory (an LRU's recency update, or even a read lock, would make
// every request write a cache line the other cores read). A miss copies
// its shard's map (at most audienceCacheSize/audienceShards entries) under
// the shard's mutex; a full shard drops a random entry (map iteration
// order is random), which bounds memory; a partition dropped too early
// costs one HMAC.
type hmacAudience struct {
	key    []byte
	encode func(dst, src []byte) []byte
	macs   sync.Pool // hash.Hash: HMAC-SHA256 keyed with key
	seed   maphash.Seed
	shards [audienceShards]audienceShard
}

type audienceShard struct {
	m  atomic.Pointer[map[string]string] // partition -> audience; never modified once stored
	mu sync.Mutex                        // serializes writers
}

// len is the number of audiences the shard holds.
func (sh *audienceShard) len() int {
	if m := sh.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}

func (a *hmacAudience) Derive(partition string) string {
	sh := &a.shards[maphash.String(a.seed, partition)%audienceShards]
	if m := sh.m.Load(); m != nil {
		if aud, ok := (*m)[partition]; ok {
			return aud
		}
	}
	aud := a.derive(partition)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old := sh.m.Load()
	if old != nil {
		if _, ok := (*old)[partition]; ok {
			return aud
		}
	}
	next := make(map[string]string, sh.len()+1)
	if old != nil {
		drop := len(*old) >= audienceCacheSize/audienceShards
		for k, v := range *old {
			if drop {
				drop = false
				continue
			}
			next[k] = v
		}
	}
	// Cloned: the partition may be a slice of a larger record buffer.
	next[strings.Clone(partition)] = aud
	sh.m.Store(&next)
	return aud
}

// derive computes the audience of partition.
func (a *hmacAudience) derive(partition string) string {
	h := a.macs.Get().(hash.Hash)
	defer a.macs.Put(h)
	h.Reset()
	io.WriteString(h, partition)
	var sum [sha256.Size]byte
	var out [2 * sha256.Size]byte // either encoding of a SHA-256 sum fits
	return string(a.encode(out[:0], h.Sum(sum[:0])))
}
