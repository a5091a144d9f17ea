package caddymodule

import (
	"runtime"
	"runtime/debug"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// modulePath is this module's import path, as a dependency of the Caddy
// binary that embeds it.
const modulePath = "github.com/syncular/caddy-syncular"

// moduleVersion is the version of this module built into the running
// binary: its entry in the binary's build information (a tagged
// version, or a pseudo-version), "(devel)" when built from a working
// tree without one. The one place the version is read from.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	if bi.Main.Path == modulePath && bi.Main.Version != "" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path != modulePath {
			continue
		}
		if d.Replace != nil {
			if d.Replace.Version != "" {
				return d.Replace.Version
			}
			return "(devel)" // replaced by a directory: a working tree
		}
		if d.Version != "" {
			return d.Version
		}
	}
	return "(devel)"
}

// newBuildInfo is caddy_syncular_build_info: one series, value 1, whose
// labels say what runs (the convention of Prometheus's own build_info).
func newBuildInfo(ns, sub string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "build_info",
		Help: "Always 1; the labels say what runs: version (this module), caddy_version and go_version.",
	}, []string{"version", "caddy_version", "go_version"})
	caddyVersion, _ := caddy.Version()
	g.WithLabelValues(moduleVersion(), caddyVersion, runtime.Version()).Set(1)
	return g
}
