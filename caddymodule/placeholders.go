package caddymodule

import (
	"context"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The handler publishes these placeholders for logs and headers (known
// from the moment the request's handling decides them, before the response
// is written):
//
//	{http.syncular.segment_id}  the requested segment id (once well-formed)
//	{http.syncular.outcome}     granted, not_modified, next, or the error code
//	{http.syncular.delivery}    serve, redirect, proxy or stream_legacy (granted requests)
//	{http.syncular.key_slot}    1, 2, ...: the key whose MAC matched, or none
//	{http.syncular.reason}      the refusal message, fixed text without secrets
//	{http.syncular.cache}       memory, disk, fill, follower, stream, redirect or record (granted answers)
//	{http.syncular.tenant}      16 hex digits: a keyed hash of the verified audience (computed when read)
//
// None of them holds a token, a key, an audience or a partition id.
const placeholderPrefix = "http.syncular."

// placeholder names one {http.syncular.*} value.
type placeholder uint8

const (
	phSegmentID placeholder = iota
	phOutcome
	phDelivery
	phKeySlot
	phReason
	phCache
	phTenant
	numPlaceholders
)

var placeholderNames = [numPlaceholders]string{
	phSegmentID: "segment_id",
	phOutcome:   "outcome",
	phDelivery:  "delivery",
	phKeySlot:   "key_slot",
	phReason:    "reason",
	phCache:     "cache",
	phTenant:    "tenant",
}

// placeholderState is the key under which a request's placeholders are
// kept in its vars, and under which their provider answers with itself,
// so a second pass through the handler on the same request (an error
// route, say) finds them instead of adding another provider. A NUL cannot
// be written in a Caddyfile placeholder ({http.vars.*} included).
const placeholderState = placeholderPrefix + "\x00state"

// placeholders holds the {http.syncular.*} values of one request and
// answers for them as a provider of the request's replacer, so that
// publishing a value is a field store: nothing is formatted, boxed or put
// in the replacer's map unless a log or header reads it. A value reads as
// unknown until it is published; a later pass overwrites it, as
// Replacer.Set would.
type placeholders struct {
	vals [numPlaceholders]string
	set  [numPlaceholders]bool
	slot int // the key_slot value, formatted when read
	// The tenant value is hashed from aud under tenantKey when first
	// read (cachestatus.go), and kept in vals.
	aud       string
	tenantKey []byte
}

// placeholdersFor returns the placeholders of the request whose replacer
// is repl, adding the provider on first use; nil without a replacer.
//
// The request's placeholders are found again through its vars (the map
// Caddy's server puts in every request's context), under the same key the
// provider answers: one map read, where asking the replacer would run
// every provider it has (the http one included) for a key none of them
// knows, on every request. A request without vars (outside Caddy's
// server) asks the replacer.
func placeholdersFor(ctx context.Context, repl *caddy.Replacer) *placeholders {
	if repl == nil {
		return nil
	}
	vars, _ := ctx.Value(caddyhttp.VarsCtxKey).(map[string]any)
	if vars != nil {
		if p, ok := vars[placeholderState].(*placeholders); ok {
			return p
		}
	} else if v, ok := repl.Get(placeholderState); ok {
		if p, ok := v.(*placeholders); ok {
			return p
		}
	}
	p := new(placeholders)
	repl.Map(p.get)
	if vars != nil {
		vars[placeholderState] = p
	}
	return p
}

// publish sets {http.syncular.<name>} to value.
func (p *placeholders) publish(name placeholder, value string) {
	if p != nil {
		p.vals[name], p.set[name] = value, true
	}
}

// publishSlot sets {http.syncular.key_slot} to the label of slot.
func (p *placeholders) publishSlot(slot int) {
	if p != nil {
		p.slot, p.set[phKeySlot] = slot, true
	}
}

// publishTenant sets {http.syncular.tenant} to the keyed hash of aud,
// computed only if a log or header reads it.
func (p *placeholders) publishTenant(aud string, key []byte) {
	if p != nil {
		p.aud, p.tenantKey, p.vals[phTenant], p.set[phTenant] = aud, key, "", true
	}
}

// get is the replacer provider: the value of a published placeholder.
func (p *placeholders) get(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	if key == placeholderState {
		return p, true
	}
	for i, n := range placeholderNames {
		if n != name {
			continue
		}
		if !p.set[i] {
			return nil, false
		}
		switch placeholder(i) {
		case phKeySlot:
			return slotLabel(p.slot), true
		case phTenant:
			if p.vals[i] == "" {
				p.vals[i] = tenantOf(p.tenantKey, p.aud)
			}
		}
		return p.vals[i], true
	}
	return nil, false
}

// replString reads a string placeholder.
func replString(repl *caddy.Replacer, key string) string {
	v, _ := repl.Get(key)
	s, _ := v.(string)
	return s
}
