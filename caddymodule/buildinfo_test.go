package caddymodule

import (
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestBuildInfo: one series, value 1, labelled with this module's
// version ("(devel)" in a test binary), Caddy's and Go's.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newBuildInfo("caddy", "syncular"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "caddy_syncular_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("families %v", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["version"] != moduleVersion() || labels["version"] == "" ||
		labels["go_version"] != runtime.Version() || labels["caddy_version"] == "" {
		t.Fatalf("build_info %v = %v", labels, m.GetGauge().GetValue())
	}
}
