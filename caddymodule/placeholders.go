package caddymodule

import "github.com/caddyserver/caddy/v2"

// The handler publishes these placeholders for logs and headers (set as
// the request is decided, before the response is written):
//
//	{http.syncular.segment_id}  the requested segment id (once well-formed)
//	{http.syncular.outcome}     granted, not_modified, next, or the error code
//	{http.syncular.delivery}    serve, redirect, proxy or stream_legacy (granted requests)
//	{http.syncular.key_slot}    1, 2, ...: the key whose MAC matched, or none
//	{http.syncular.reason}      the refusal message, fixed text without secrets
//
// None of them holds a token, a key, an audience or a partition id.
const placeholderPrefix = "http.syncular."

// publish sets {http.syncular.<name>} on the request's replacer.
func (d *decision) publish(name, value string) {
	if d.repl != nil {
		d.repl.Set(placeholderPrefix+name, value)
	}
}

// replString reads a string placeholder.
func replString(repl *caddy.Replacer, key string) string {
	v, _ := repl.Get(key)
	s, _ := v.(string)
	return s
}
