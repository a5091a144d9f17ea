#!/usr/bin/env bash
# Runs every fuzz target for a bounded budget (default 10000 inputs each;
# a count, since a duration budget trips golang/go#75804 on Go 1.26).
# A crash is saved by go test under testdata/fuzz and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-10000x}
for pkg in $(go list ./... ); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz: $pkg $f ($t)"
		go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" "$pkg"
	done
done
