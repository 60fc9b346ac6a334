# lockbroker — `make run` to try it, `make test` to check everything.
# Both install what a fresh machine lacks: the pinned Consul build
# (bin/consul), npm tools, Debian packages for the Python tests.

SHELL := /bin/bash
export GOTOOLCHAIN := local
GO ?= go
GOTOOL := $(GO) tool -modfile=tools/go/go.mod
BUF := npx --no-install buf
PYTHON := /usr/bin/python3
DEB_PACKAGES := protobuf-compiler protobuf-compiler-grpc python3-grpcio python3-protobuf python3-pytest python3-venv

.PHONY: all run test test-go test-install test-race test-clients test-java test-conformance-go test-python test-node lint generate check-generate breaking \
	consul broker lockctl test-deploy deps deps-npm deps-deb deps-node bench bench-profile bench-profile-handoff chaos clean

all: broker lockctl

## Binaries ---------------------------------------------------------------

# The version `broker --version`, `lockctl --version`, the broker's start-up
# log line and lockbroker_build_info report: the nearest tag, else the
# commit, "-dirty" with uncommitted changes (VERSION=v1.2.3 make broker to
# set it).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X github.com/lockbroker/lockbroker/internal/buildinfo.version=$(VERSION) \
	-X github.com/lockbroker/lockbroker/internal/buildinfo.revision=$(REVISION)

# The same commands as the Dockerfile's build stage.
broker:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags '$(LDFLAGS)' -o bin/broker ./cmd/broker

lockctl:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags '$(LDFLAGS)' -o bin/lockctl ./cmd/lockctl

# Consul v1.20.6, built from the Go module proxy (first build ~8 min).
CONSUL_VERSION := 1.20.6
consul: bin/consul
bin/consul: tools/consul/go.mod tools/consul/go.sum
	cd tools/consul && $(GO) build -o ../../bin/consul github.com/hashicorp/consul
	@touch bin/consul

## Dependencies -----------------------------------------------------------

deps: deps-npm deps-deb deps-node

# `npm install` (from the committed lock file) rather than `npm ci`: the
# registry here lacks buf's optional packages for other platforms, which
# `npm ci` insists on.
node_modules/.package-lock.json: package.json package-lock.json
	npm install --no-audit --no-fund --loglevel=error
deps-npm: node_modules/.package-lock.json

deps-deb:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

test/node/node_modules/.package-lock.json: test/node/package.json test/node/package-lock.json
	npm ci --prefix test/node --no-audit --no-fund --loglevel=error
deps-node: test/node/node_modules/.package-lock.json

## Code generation and lint ----------------------------------------------

generate: deps-npm deps-deb
	$(BUF) generate
	$(PYTHON) client/python/tools/sync_gen.py
	node client/node/tools/sync-gen.mjs

# Fails when gen/ differs from what buf generates.
check-generate: generate
	@if [ -n "$$(git status --porcelain -- gen)" ]; then \
		echo "gen/ is out of date with proto/: run make generate and commit"; git status --porcelain -- gen; exit 1; fi

breaking: deps-npm
	@if git rev-parse --verify -q main >/dev/null && git ls-tree -r --name-only main | grep -q '^proto/'; then \
		$(BUF) breaking --against '.git#branch=main'; else echo "no proto on main yet: skipping buf breaking"; fi

lint: deps-npm
	$(BUF) lint
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$unformatted" ]; then \
		echo "not gofmt-clean:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GOTOOL) staticcheck ./...

## Tests ------------------------------------------------------------------

test: consul deps check-generate breaking lint broker lockctl test-go test-race test-python test-node test-clients test-java test-conformance-go test-install test-deploy chaos-short

# Every Go test but test/install, which test-install runs.
test-go: consul
	$(GO) test -count=1 -timeout 25m $$($(GO) list ./... | grep -v '/test/install$$')

# The README's install blocks, as written, each from an empty temporary
# directory, then a program using the installed library against a real
# broker (test/install): Python (a venv over Debian's grpcio), Node (the
# packed tarball, from the npm registry; TypeScript's `await using` on this
# Node), Go (a replace line, modules from the Go module proxy) and Java
# (the jar). client/node's packages bring the TypeScript compiler.
test-install: consul deps-deb client/node/node_modules/.package-lock.json
	$(GO) test -count=1 -timeout 15m -v -run 'TestInstall' ./test/install/

# The end-to-end suite and the domain under the race detector (the long
# tests scale down when it is on).
test-race: consul
	$(GO) test -race -count=1 -timeout 25m ./internal/broker/ ./test/e2e/

# The Python and Node client libraries and the conformance scenarios
# (test/conformance/scenarios.md) against real broker processes.
client/node/node_modules/.package-lock.json: client/node/package.json client/node/package-lock.json
	npm ci --prefix client/node --no-audit --no-fund --loglevel=error
test-clients: consul broker deps-deb client/node/node_modules/.package-lock.json
	LOCKBROKER_BIN=$(CURDIR)/bin/broker $(PYTHON) -m pytest -q client/python/tests test/conformance/python
	LOCKBROKER_BIN=$(CURDIR)/bin/broker node --test client/node/test/ test/conformance/node/

# Conformance S5 with every language at once (Go, Python, Node, Java),
# and each library's W3C trace context reaching the broker's spans: needs
# client/node's packages and the Java CLI's build.
test-conformance-go: consul deps-deb client/node/node_modules/.package-lock.json
	$(MAKE) -C client/java build test-compile examples
	LOCKBROKER_S5_REQUIRE=all $(GO) test -count=1 -v -run 'TestS5CrossLanguage|TestTraceContextCrossLanguage' ./test/conformance/go/

# The Java client (client/java: Debian's OpenJDK and jars, installed on
# first use).
test-java: consul broker
	$(MAKE) -C client/java test LOCKBROKER_BIN=$(CURDIR)/bin/broker LOCKBROKER_CONSUL=$(CURDIR)/bin/consul

test-python: consul broker deps-deb
	PYTHONPATH=gen/python $(PYTHON) -m pytest -q test/python

test-node: consul broker deps-npm deps-node
	node --test test/node/

# Benchmarks, the shared-queue rows (three replicas) and the scale run
# (10,000 holds, 1,000 watchers on one replica): they print figures and
# assert none.
bench: consul
	set -o pipefail; $(GO) test -count=1 -timeout 30m -run 'TestBenchTable|TestBenchQueue|TestBenchRWMulti|TestBenchLossNotice|TestScale' -v ./test/bench/ -args -table -queue -rwmulti -loss -scale \
		| grep -E '^(#|\||SCALE|ok|FAIL|--- |panic)|^    [a-z_]+_test\.go:'

# A CPU profile of the uncontended cycle (broker side, in process).
bench-profile: consul
	$(GO) test -count=1 -run '^$$' -bench 'Cycle/broker' -benchtime 3000x -cpuprofile bin/cpu.out -o bin/bench.test ./test/bench/
	$(GO) tool pprof -top -nodecount=40 bin/bench.test bin/cpu.out

# The same for the local hand-off (BenchmarkHandOff: a waiter queued, the
# holder's Release hands it the lock), with allocations per hand-off,
# which a loaded machine does not change (compare those across changes).
bench-profile-handoff: consul
	$(GO) test -count=1 -run '^$$' -bench 'HandOff' -benchtime 300x -benchmem -cpuprofile bin/cpu-handoff.out -o bin/bench.test ./test/bench/
	$(GO) tool pprof -top -nodecount=40 bin/bench.test bin/cpu-handoff.out

# deploy/: the Kubernetes manifests decoded strictly into the Kubernetes
# API's Go types and checked against the broker's and lockctl's flags
# (deploy/validate, a module of its own so that the broker's module does
# not depend on Kubernetes).
test-deploy: bin/promtool
	cd deploy/validate && $(GO) vet ./... && $(GO) test -count=1 ./...
	bin/promtool check rules deploy/prometheus/lockbroker-alerts.yaml
	cd deploy/prometheus && ../../bin/promtool test rules lockbroker-alerts_test.yaml

# Prometheus's promtool, pinned in tools/promtool and built once into bin/
# (like Consul): without service discovery (-tags remove_all_sd), which the
# rule tests do not use and which is most of the build.
bin/promtool: tools/promtool/go.mod tools/promtool/go.sum
	cd tools/promtool && $(GO) build -tags remove_all_sd -o ../../bin/promtool github.com/prometheus/prometheus/cmd/promtool
	@touch bin/promtool

## Running it -------------------------------------------------------------

# The Consul it runs: bin/consul, else a consul on PATH, if it is
# v$(CONSUL_VERSION); only without one does it build bin/consul (make consul).
run: broker
	@bin=""; for c in bin/consul "$$(command -v consul)"; do \
		if [ -n "$$c" ] && [ -x "$$c" ] && [ "$$("$$c" version 2>/dev/null | head -n 1)" = "Consul v$(CONSUL_VERSION)" ]; then bin="$$c"; break; fi; \
	done; \
	if [ -z "$$bin" ]; then \
		echo "no Consul v$(CONSUL_VERSION) in bin/ or on PATH: building bin/consul (make consul)"; \
		$(MAKE) --no-print-directory $$([ -e bin/consul ] && echo -B) consul || exit 1; bin=bin/consul; \
	fi; \
	echo "consul: $$bin"; \
	exec bin/broker --dev --consul-bin "$$bin"

clean:
	rm -rf bin node_modules test/node/node_modules client/node/node_modules
	$(MAKE) -C client/java clean

## Chaos suite and fuzzing (docs/chaos.md) --------------------------

.PHONY: chaos-short fuzz
CHAOS := $(GO) run ./test/chaos/cmd/chaos
FUZZTIME ?= 30s
FUZZ_TARGETS := FuzzRequests FuzzSemaphoreLock FuzzHoldStateMachine FuzzAcquireKinds

# About 3 minutes: faults against race-built brokers, then each mutant on
# a short focused schedule (every mutant must be caught by the checker
# paired with it, docs/chaos.md "Mutants"). MUTANT=name runs only that
# mutant, and fails naming the checker that caught it. SEED=n replays a
# schedule.
chaos-short: consul
	$(CHAOS) -profile short $(if $(MUTANT),-mutant $(MUTANT),-mutants)

# The full run (~20 minutes, ≥50 clients, ≥200 faults), every mutant, and
# the fuzz targets.
chaos: consul fuzz
	$(CHAOS) -profile full $(if $(MUTANT),-mutant $(MUTANT),-mutants)

# Each fuzz target for FUZZTIME (default 30s), one worker each.
fuzz: consul
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s -parallel 1 ./test/fuzz/ || exit 1; \
	done
