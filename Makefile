# caddy-syncular. The two set-up commands: `make demo` and `make test`.
SHELL := /bin/bash
GO    ?= go
export GOFLAGS := -buildvcs=false
# Tests build and find binaries through these.
export SYNCULAR_CADDY     := $(CURDIR)/bin/caddy
export VERSITYGW          := $(CURDIR)/.tools/bin/versitygw
export SYNCULAR_CADDY_PLAIN := $(CURDIR)/bin/caddy-plain

UNIT_PKGS := ./token/... ./segid/... ./presign/... ./store/... ./caddymodule/... ./compress/... ./internal/... ./cmd/... ./bench/...

.PHONY: all caddy caddy-plain tools demo demo-s3 test vet lint unit race vectors integration fuzz bench soak clean FORCE

all: caddy

tools:
	scripts/tools.sh xcaddy versitygw

## caddy: build bin/caddy from xcaddy.json (Caddy + this module from the working tree),
## only when an input changed: a Go source, go.mod/go.sum, xcaddy.json or the version
caddy: bin/caddy

# The inputs of bin/caddy: every non-test Go file of the module (the
# module has no embedded files), the module files, the manifest, and
# bin/.version, which is rewritten only when scripts/version.sh's answer
# changes (a commit, a tag, a tree turning dirty), so the stamped version
# never lags behind the checkout.
CADDY_INPUTS := $(shell find . -name '*.go' ! -name '*_test.go' ! -path './.tools/*' ! -path './bin/*' ! -path './.demo/*') go.mod go.sum xcaddy.json

bin/.version: FORCE
	@mkdir -p bin; v=$$(scripts/version.sh); [[ "$$(cat $@ 2>/dev/null)" == "$$v" ]] || echo "$$v" >$@

bin/caddy: $(CADDY_INPUTS) bin/.version
	scripts/tools.sh xcaddy
	$(GO) run ./internal/tools/buildcaddy -manifest xcaddy.json -version "$$(cat bin/.version)" -o $@
	@touch $@

## caddy-plain: stock Caddy of the same version, for side-by-side benchmarks
caddy-plain: bin/caddy-plain

bin/caddy-plain: xcaddy.json
	scripts/tools.sh xcaddy
	$(GO) run ./internal/tools/buildcaddy -manifest xcaddy.json -plain -o $@
	@touch $@

## demo: seed a SQLite store, run Caddy with the example config, print signed
## URLs, the metrics URL and an inspect command; keys in .demo/keys.env
# The demo runs as a built binary, not under `go run`, so that Ctrl-C
# ends it with status 0 (`go run` reports an interrupted child as failed).
demo: caddy
	$(GO) build -o bin/syncular-demo ./cmd/syncular-demo
	bin/syncular-demo

## demo-s3: the same with segments in a versitygw bucket (redirect and proxy sites)
demo-s3: caddy
	scripts/tools.sh versitygw
	$(GO) build -o bin/syncular-demo ./cmd/syncular-demo
	bin/syncular-demo -s3

## test: everything CI runs: vet, lint (staticcheck, go mod tidy), unit (with -race), vectors, fuzz smoke, integration
test: vet lint unit fuzz integration

vet:
	$(GO) vet ./...

# staticcheck, pinned in scripts/tools.sh; exceptions are //lint:ignore
# comments that say why. go mod tidy -diff fails when go.mod or go.sum is
# not what tidy would write.
lint:
	scripts/tools.sh staticcheck
	.tools/bin/staticcheck ./...
	$(GO) mod tidy -diff

# Unit tests of the S3 store run against a real versitygw, and the bench's nginx
# peer is tested against a real nginx (Debian's, installed when missing).
unit:
	scripts/tools.sh versitygw nginx
	$(GO) test -race -count=1 $(UNIT_PKGS)
	# Allocation counts (sync.Pool drops items under -race, so these skip there).
	$(GO) test -count=1 -run 'Alloc' ./token/ ./caddymodule/ ./compress/

# The vector tests are part of `unit`; this target runs only them.
vectors:
	$(GO) test -count=1 -run 'Vector' -v $(UNIT_PKGS) | grep -E '^(=== RUN|--- FAIL|ok|FAIL)' | grep -v '=== RUN' 

# An execution count, not a duration: Go 1.26's fuzz coordinator can fail
# a target with a spurious "context deadline exceeded" when a duration
# -fuzztime expires mid-exec (golang/go#75804, fixed in Go 1.27). 10000
# inputs per target keeps the smoke run (7 targets) near a minute here.
FUZZTIME ?= 10000x
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

# caddy-plain: the reload test compares connection resets with stock Caddy;
# chromium (Debian's package, installed only when missing) runs the browser test;
# strace (the same) counts the edge's system calls in the sendfile test;
# prometheus (the same, with promtool) runs examples/monitoring.
integration: caddy caddy-plain
	scripts/tools.sh versitygw chromium strace prometheus
	$(GO) test -count=1 -timeout 20m ./integration/...

# nginx (Debian's package, installed only when missing) is the peer of (a) and (e).
bench: caddy caddy-plain
	scripts/tools.sh versitygw hey vegeta nginx
	$(GO) run ./bench/load -o bench/RESULTS.md

## soak: the real edge under mixed traffic for SOAK_DURATION (two reloads, a
## store freeze, a corrupted disk-tier file), then idle; fails when a body
## is wrong or fds, goroutines or memory are not back within bounds
## (docs/operations.md). Not part of `make test`.
SOAK_DURATION ?= 10m
SOAK_IDLE ?= 60s
soak: caddy
	scripts/tools.sh versitygw
	$(GO) run ./bench/soak -caddy bin/caddy -duration $(SOAK_DURATION) -idle $(SOAK_IDLE)

clean:
	rm -rf bin .demo
