#!/usr/bin/env bash
# Runs every fuzz target for a short bounded time (default 8s each).
# A crash is saved by go test under testdata/fuzz and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-8s}
for pkg in $(go list ./... ); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz: $pkg $f ($t)"
		go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" "$pkg"
	done
done
