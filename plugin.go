// Package caddysyncular plugs caddy-syncular into a custom Caddy build:
// xcaddy imports this package for its side effect, which registers the
// http.handlers.syncular_segments module and the syncular_segments
// Caddyfile directive. The code lives in ./caddymodule.
package caddysyncular

import _ "github.com/syncular/caddy-syncular/caddymodule"
