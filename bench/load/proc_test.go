package main

import "testing"

// TestCPUCount: -pin's CPU lists as nginx's worker count reads them.
func TestCPUCount(t *testing.T) {
	for list, want := range map[string]int{
		"": 0, "0": 1, "0-1": 2, "2-15": 14, "0-1,4": 3, "1,3,5-7": 5,
		"x": 0, "3-1": 0, "1-": 0, "-1": 0,
	} {
		if got := cpuCount(list); got != want {
			t.Errorf("cpuCount(%q) = %d, want %d", list, got, want)
		}
	}
}
