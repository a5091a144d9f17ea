package caddymodule

import (
	"runtime"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// newBuildInfo is caddy_syncular_build_info: one series, value 1, whose
// labels say what runs (the convention of Prometheus's own build_info).
func newBuildInfo(ns, sub string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "build_info",
		Help: "Always 1; the labels say what runs: version (this module, as moduleVersion reports it), caddy_version and go_version.",
	}, []string{"version", "caddy_version", "go_version"})
	caddyVersion, _ := caddy.Version()
	g.WithLabelValues(moduleVersion(), caddyVersion, runtime.Version()).Set(1)
	return g
}
