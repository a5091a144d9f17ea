package caddymodule

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// This file holds what the commands (syncular-token, syncular-store)
// share: reading a config the way `caddy run --config` does, and finding
// its syncular_segments handlers.

// loadConfig reads a config file and adapts it to JSON (adapter "json":
// as is), then decodes it.
func loadConfig(path, adapterName string) (any, error) {
	body, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if adapterName != "json" {
		a := caddyconfig.GetAdapter(adapterName)
		if a == nil {
			return nil, fmt.Errorf("--adapter: unknown config adapter %q", adapterName)
		}
		if body, _, err = a.Adapt(body, map[string]any{"filename": path}); err != nil {
			return nil, fmt.Errorf("--config: adapting: %w", err)
		}
	}
	var cfg any
	if err := json.Unmarshal(body, &cfg); err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return cfg, nil
}

// configHandler is one syncular_segments handler of a config, with where
// it sits: its server, and the host and path matchers of the routes
// around it (the innermost route that names them).
type configHandler struct {
	raw    json.RawMessage
	server string   // the server's name in apps.http.servers
	listen []string // the server's listen addresses
	hosts  []string
	paths  []string
}

// site describes where h sits, for listings and notes.
func (h configHandler) site() string {
	var b strings.Builder
	if len(h.hosts) > 0 {
		b.WriteString(strings.Join(h.hosts, ", "))
	} else {
		b.WriteString("(any host)")
	}
	if len(h.paths) > 0 {
		b.WriteString(" " + strings.Join(h.paths, ", "))
	}
	if h.server != "" {
		fmt.Fprintf(&b, " (server %s", h.server)
		if len(h.listen) > 0 {
			b.WriteString(" on " + strings.Join(h.listen, ", "))
		}
		b.WriteString(")")
	}
	return b.String()
}

// findHandlers returns every syncular_segments handler of an adapted
// config, in document order (object keys sorted).
func findHandlers(cfg any) []configHandler {
	return walkHandlers(cfg, configHandler{}, nil)
}

func walkHandlers(v any, at configHandler, out []configHandler) []configHandler {
	switch x := v.(type) {
	case map[string]any:
		if x["handler"] == "syncular_segments" {
			if b, err := json.Marshal(x); err == nil {
				h := at
				h.raw = b
				return append(out, h)
			}
		}
		if hosts, paths := routeMatchers(x["match"]); len(hosts)+len(paths) > 0 {
			if len(hosts) > 0 {
				at.hosts = hosts
			}
			if len(paths) > 0 {
				at.paths = paths
			}
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			in := at
			if k == "servers" {
				// apps.http.servers: name each server for the handlers
				// under it.
				if servers, ok := x[k].(map[string]any); ok {
					for _, n := range slices.Sorted(maps.Keys(servers)) {
						s := at
						s.server, s.listen = n, stringList(servers[n], "listen")
						out = walkHandlers(servers[n], s, out)
					}
					continue
				}
			}
			out = walkHandlers(x[k], in, out)
		}
	case []any:
		for _, e := range x {
			out = walkHandlers(e, at, out)
		}
	}
	return out
}

// routeMatchers collects the host and path matchers of a route's match
// list (every matcher set).
func routeMatchers(match any) (hosts, paths []string) {
	sets, _ := match.([]any)
	for _, s := range sets {
		hosts = append(hosts, stringList(s, "host")...)
		paths = append(paths, stringList(s, "path")...)
	}
	return hosts, paths
}

// stringList is the string array v[key] (v an object), or nil.
func stringList(v any, key string) []string {
	m, _ := v.(map[string]any)
	l, _ := m[key].([]any)
	var out []string
	for _, e := range l {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
