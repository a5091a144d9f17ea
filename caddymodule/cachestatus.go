package caddymodule

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"regexp"

	"github.com/caddyserver/caddy/v2"
)

// Per-request cache outcome ({http.syncular.cache}, the Cache-Status
// header of RFC 9211, the cache label of the storm metrics) and the
// tenant placeholder ({http.syncular.tenant}).

// cacheKind is how a granted answer was made. Its names are the values
// of {http.syncular.cache} and of the metrics' cache label.
type cacheKind uint8

const (
	cacheNone     cacheKind = iota // not a granted answer: nothing is published
	cacheMemory                    // a segment (or variant) held in memory
	cacheDisk                      // a complete, verified file of the disk tier
	cacheFill                      // this request's store read filled a tier (memory or disk)
	cacheFollower                  // joined a fill another request had started
	cacheStream                    // streamed from the store, not kept
	cacheRedirect                  // 302 to a presigned URL: the bytes bypass the edge
	cacheRecord                    // answered from the record alone: HEAD, 304
	numCacheKinds
)

var cacheNames = [numCacheKinds]string{
	cacheMemory:   "memory",
	cacheDisk:     "disk",
	cacheFill:     "fill",
	cacheFollower: "follower",
	cacheStream:   "stream",
	cacheRedirect: "redirect",
	cacheRecord:   "record",
}

// cacheStatusParams is the Cache-Status member after the cache's name,
// per kind (RFC 9211): a hit, or how the request went forward. A fill
// and a follower name the tier in detail.
var cacheStatusParams = [numCacheKinds]string{
	cacheMemory:   "; hit; detail=memory",
	cacheDisk:     "; hit; detail=disk",
	cacheFill:     "; fwd=uri-miss; stored",
	cacheFollower: "; fwd=uri-miss; collapsed",
	cacheStream:   "; fwd=bypass",
	cacheRedirect: "; fwd=bypass; detail=redirect",
	cacheRecord:   "; hit; detail=record",
}

// DefaultCacheStatusName is the cache's name in Cache-Status when
// cache_status_name is unset.
const DefaultCacheStatusName = "caddy-syncular"

// cacheStatusNameRe is an sf-token (RFC 8941) of a sensible length: what
// RFC 9211 allows as a cache's name without quoting.
var cacheStatusNameRe = regexp.MustCompile(`^[A-Za-z*][A-Za-z0-9:/!#$%&'*+\-.^_` + "`" + `|~]{0,63}$`)

// observe is the handler's resolved cache_status and tenant settings: what
// an operator sees of a request besides the metrics (Cache-Status and
// {http.syncular.tenant}), as store/observe.go is what it sees of the store.
type observe struct {
	// status holds the Cache-Status value per kind; nil: cache_status off.
	status *[numCacheKinds]string
	// tenantKey keys {http.syncular.tenant}.
	tenantKey []byte
}

// tenantLabel is the fixed label under which the tenant key is derived
// from the first token key when tenant_key is unset.
const tenantLabel = "caddy-syncular tenant v1"

// tenantHexDigits is the length of {http.syncular.tenant}: 64 bits.
const tenantHexDigits = 16

// buildObserve resolves cache_status and the tenant key (firstKey is the
// first token key, decoded). Called by buildAuth.
func (h *Handler) buildObserve(repl *caddy.Replacer, firstKey []byte) error {
	if h.CacheStatus {
		name := h.CacheStatusName
		if !cacheStatusNameRe.MatchString(name) {
			return fmt.Errorf("cache_status_name %q is not a token (letters, digits and -._:/ etc., starting with a letter, at most 64)", name)
		}
		var st [numCacheKinds]string
		for k := cacheMemory; k < numCacheKinds; k++ {
			st[k] = name + cacheStatusParams[k]
		}
		h.obs.status = &st
	} else if h.CacheStatusName != "" {
		return fmt.Errorf("cache_status_name needs cache_status on")
	}
	if h.TenantKey != "" {
		k, err := secret(repl, h.TenantKey, "tenant_key", h.weakKeysOK)
		if err != nil {
			return err
		}
		h.obs.tenantKey = k
		return nil
	}
	m := hmac.New(sha256.New, firstKey)
	m.Write([]byte(tenantLabel))
	h.obs.tenantKey = m.Sum(nil)
	return nil
}

// tenantOf is {http.syncular.tenant} for an audience: the first 16 hex
// digits of HMAC-SHA256(tenant key, aud).
func tenantOf(key []byte, aud string) string {
	m := hmac.New(sha256.New, key)
	io.WriteString(m, aud)
	var sum [sha256.Size]byte
	return hex.EncodeToString(m.Sum(sum[:0])[:tenantHexDigits/2])
}
