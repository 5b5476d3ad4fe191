# embcache — the project's commands. `make test` is what CI runs (.ci/run).
SHELL     := /bin/bash
GO        ?= go
BIN       := bin
PKGS      := ./...
FUZZTIME  ?= 60s
BENCHTIME ?= 1s

VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
DEMO_FLAGS ?=

.PHONY: demo-live mooncake build-mooncake build-bench check-tracked bench-go debs test-debs test-python bench-vllm bench-agent-hit bench-agent-key test-faults all build tools test vet test-go test-mooncake bench lint fuzz demo clean image compose-up compose-down compose-test

all: build

# A static binary (no cgo): what the demo runs and the images are built from.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/embcache ./cmd/embcache

# The benchmark harness is a module of its own (bench/go.mod), so that its
# peers (go-redis, groupcache) stay out of the library's go.mod and the
# embcache binary; it builds against this checkout (a replace directive).
BENCH_MOD := bench
build-bench:
	cd $(BENCH_MOD) && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(abspath $(BIN))/embcache-bench ./cmd/embcache-bench

NATSCLI   := github.com/nats-io/natscli/nats@v0.5.0

## test: vet (with and without the mooncake tag), every Go test under -race (bench/'s module too), the Python client's tests.
test: check-tracked tools test-debs vet test-go test-mooncake test-python

## check-tracked: no tracked file over 1 MiB, no tracked executable (build outputs go to bin/).
check-tracked:
	scripts/check-tracked.sh

## tools: the nats CLI (for the inspection test and docs/operations.md), in bin/.
tools: $(BIN)/nats

$(BIN)/nats:
	GOBIN=$(abspath $(BIN)) $(GO) install $(NATSCLI)

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags mooncake $(PKGS)
	cd $(BENCH_MOD) && $(GO) vet ./...
	cd $(BENCH_MOD) && $(GO) vet -tags mooncake ./...

test-go:
	$(GO) test -race -count=1 $(PKGS)
	cd $(BENCH_MOD) && $(GO) test -race -count=1 ./...

# The Mooncake transport is cgo behind a build tag. Its tests run against a
# real Mooncake Store (a mooncake_master and a segment holder they start on
# free loopback ports): MOONCAKE_DIR, a Mooncake install of yours (lib/
# libmooncake_store.so, bin/mooncake_master), or the bundle in ../shared/
# mooncake, unpacked into build/ with its runtime Debian packages. A fake C
# store, built with gcc, injects the error codes a real one cannot be made
# to return. cmd/embcache's other tests run in test-go: here only its
# tagged ones.
MOONCAKE_BUNDLE ?= ../shared/mooncake/mooncake-3b5a594-tcp-debian12-amd64.tar.gz
MOONCAKE_DEBS := libibverbs1 libgoogle-glog0v6 libgflags2.2 libjsoncpp25 libyaml-cpp0.7 liburing2 libxxhash0 libnuma1 libcurl4 libzstd1 libunwind8
MOONCAKE_DIR ?= $(if $(wildcard $(MOONCAKE_BUNDLE)),$(abspath build/mooncake),)

## mooncake: unpack ../shared/mooncake's Mooncake Store into build/mooncake and install its runtime packages.
mooncake: build/mooncake/lib/libmooncake_store.so
build/mooncake/lib/libmooncake_store.so: $(MOONCAKE_BUNDLE)
	scripts/install-debs.sh $(MOONCAKE_DEBS)
	mkdir -p build
	tar -xzf $(MOONCAKE_BUNDLE) -C build
	touch $@

test-mooncake: $(if $(wildcard $(MOONCAKE_BUNDLE)),mooncake,)
	EMBCACHE_MOONCAKE_DIR=$(MOONCAKE_DIR) $(GO) test -race -count=1 -tags mooncake ./payload/mooncake/... ./node/
	EMBCACHE_MOONCAKE_DIR=$(MOONCAKE_DIR) $(GO) test -race -count=1 -tags mooncake -run Mooncake ./cmd/embcache/ ./coordinator/
	cd $(BENCH_MOD) && EMBCACHE_MOONCAKE_DIR=$(MOONCAKE_DIR) $(GO) test -race -count=1 -tags mooncake -run Mooncake ./cmd/embcache-bench/

## build-mooncake: bin/embcache-mooncake, the command with the Mooncake transport (cgo; it opens libmooncake_store.so at run time).
build-mooncake:
	CGO_ENABLED=1 $(GO) build -trimpath -tags mooncake -ldflags '$(LDFLAGS)' -o $(BIN)/embcache-mooncake ./cmd/embcache

## test-faults: 200 fault schedules, 3 at a time, on a random base seed (make test runs 20, one at a time);
## FAULT_SCHEDULES=N, FAULT_PARALLEL=P to change, FAULT_FLAGS for more (-faults.shards N fixes the shards each schedule draws, -faults.nomarkers); a failed schedule prints the -faults.seed that replays it.
FAULT_SCHEDULES ?= 200
FAULT_PARALLEL  ?= 3
FAULT_FLAGS     ?=
FAULT_TIMEOUT   ?= 180m
test-faults:
	set -o pipefail; $(GO) test -race -count=1 -timeout $(FAULT_TIMEOUT) -run '^TestFaults$$' ./integration/ \
		-faults.schedules $(FAULT_SCHEDULES) -faults.parallel $(FAULT_PARALLEL) $(FAULT_FLAGS) -v \
		| grep -E '^(fault schedules|--- |ok|FAIL)|^ +--- FAIL|faults_test'

## bench: every suite of bin/embcache-bench (the Redis peer's redis-server is installed first); JSON in bench.json.
BENCH_FLAGS ?=
bench: build-bench debs
	$(BIN)/embcache-bench --out bench.json $(BENCH_FLAGS)

.PHONY: build-bench-mooncake bench-mooncake bench-get

## build-bench-mooncake: bin/embcache-bench-mooncake, the bench with the Mooncake transport (cgo, -tags mooncake): its workload suite runs embcache-r1-mooncake.
build-bench-mooncake:
	cd $(BENCH_MOD) && CGO_ENABLED=1 $(GO) build -trimpath -tags mooncake -ldflags '-s -w' -o $(abspath $(BIN))/embcache-bench-mooncake ./cmd/embcache-bench

## bench-mooncake: the dedup workload, every system, embcache-r1-mooncake beside the others, against a real Mooncake Store (MOONCAKE_DIR or build/mooncake); JSON in bench.json.
MOONCAKE_BENCH_FLAGS ?=
bench-mooncake: build-bench-mooncake debs $(if $(wildcard $(MOONCAKE_BUNDLE)),mooncake,)
	EMBCACHE_MOONCAKE_DIR=$(MOONCAKE_DIR) $(BIN)/embcache-bench-mooncake --suites workload --out bench.json $(MOONCAKE_BENCH_FLAGS)

## bench-get: a cross-process get of 1, 8 and 100 MiB through shm, httppull and Mooncake, each against bare loopback TCP in the same run (GET_BENCHTIME rounds).
GET_BENCHTIME ?= 10x
bench-get: $(if $(wildcard $(MOONCAKE_BUNDLE)),mooncake,)
	$(GO) test -run '^$$' -bench '^BenchmarkCrossProcessGet$$' -benchtime $(GET_BENCHTIME) ./payload/shm/ ./payload/httppull/
	EMBCACHE_MOONCAKE_DIR=$(MOONCAKE_DIR) $(GO) test -tags mooncake -run '^$$' -bench '^BenchmarkRealMooncakeGet$$' -benchtime $(GET_BENCHTIME) ./payload/mooncake/

## bench-go: the go test benchmarks of each package.
bench-go:
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./cachekey/ ./localcache/ ./payload/... ./coordinator/ ./events/ ./agent/

## debs: Debian packages the bench and tests use (redis-server, python3-numpy, python3-torch for the
## Python client's tensor views and the vLLM connector's tests, python3-yaml for the vLLM-Omni deploy example's, python3-msgpack for the event vectors' Python reader, mypy to type-check the client).
DEBS := redis-server python3-numpy python3-torch python3-msgpack python3-yaml mypy
debs:
	scripts/install-debs.sh $(DEBS)

# For make test the packages are a bonus: without them the Redis peer of the
# bench smoke test and the numpy tests skip, and say so.
test-debs:
	-scripts/install-debs.sh $(DEBS)
	-scripts/install-debs.sh $(UI_DEBS)

# The live view's tests run embcache top in a real terminal (tmux) and
# serve's page in headless Chromium; without them they skip, and say so
# (EMBCACHE_REQUIRE_UI=1, which .ci/run sets, makes that a failure).
UI_DEBS := tmux chromium

# Debian's python3 sees Debian's python3-numpy; a python3 earlier on PATH
# (pyenv, a venv) may not.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)

## test-python: mypy --strict on the Python client, and its tests against real agents (stdlib unittest).
test-python: build
	cd clients/python && $(PYTHON) -m mypy --strict embcache
	cd clients/python && EMBCACHE_BIN=$(abspath $(BIN))/embcache $(PYTHON) -m unittest discover -s tests -t .

## bench-agent-key: key construction from Python through a real agent (200 KiB, 2 MiB, 8 MiB), the Go floor beside it.
bench-agent-key: build
	PYTHON=$(PYTHON) scripts/bench-agent-key.sh

## bench-vllm: the vLLM connector's cost per item (the scheduler's check, a worker's load of 8 MiB bf16) vs a file read and a stand-in encoder.
bench-vllm: build
	PYTHON=$(PYTHON) BENCH_SCRIPT=clients/python/bench_vllm.py scripts/bench-agent-hit.sh

## bench-agent-hit: a Python hit of an 8 MiB tensor through a real agent vs reading it from a file.
bench-agent-hit: build
	PYTHON=$(PYTHON) scripts/bench-agent-hit.sh

lint: vet check-tracked
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff
	cd $(BENCH_MOD) && $(GO) mod tidy -diff

# Each fuzz target for FUZZTIME (go test -fuzz takes one target at a time).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzKeys$$' -fuzztime $(FUZZTIME) ./cachekey/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./payload/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./events/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) ./lease/
	$(GO) test -run '^$$' -fuzz '^FuzzServePath$$' -fuzztime $(FUZZTIME) ./payload/httppull/

## demo: the main job, on an embedded NATS server (DEMO_FLAGS="--json" etc.).
demo: build
	$(BIN)/embcache demo $(DEMO_FLAGS)

## demo-live: the demo, kept up with its workload going until Ctrl-C: watch it at the page it prints, or with bin/embcache top.
demo-live: build
	$(BIN)/embcache demo --hold $(DEMO_FLAGS)

## image: the FROM-scratch image of the static binary (no image is pulled).
image: build
	docker build -q -t embcache:dev .

COMPOSE := $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

compose-up: image
	$(COMPOSE) -p embcache up -d

compose-down:
	$(COMPOSE) -p embcache down -v --remove-orphans

## compose-test: the cluster, a workload, a NATS node killed on the way.
compose-test: build
	scripts/compose-test.sh

# The compose cluster with its payloads in Mooncake: docker-compose.mooncake.yml
# over docker-compose.yml, the image embcache-mooncake:dev (bin/embcache-mooncake,
# the Mooncake install of MOONCAKE_DIR, the shared libraries they load).
.PHONY: image-mooncake compose-up-mooncake compose-test-mooncake
COMPOSE_MOONCAKE := -f docker-compose.yml -f docker-compose.mooncake.yml
MOONCAKE_IF_BUNDLE := $(if $(wildcard $(MOONCAKE_BUNDLE)),mooncake,)

## image-mooncake: the FROM-scratch image of bin/embcache-mooncake and the Mooncake Store (its master, its libraries and what they load, from ldd).
image-mooncake: build-mooncake $(MOONCAKE_IF_BUNDLE)
	MOONCAKE_DIR=$(MOONCAKE_DIR) scripts/mooncake-image-context.sh build/image-mooncake
	docker build -q -t embcache-mooncake:dev build/image-mooncake

## compose-up-mooncake: the compose cluster with its workers writing through a Mooncake Store (make compose-down stops it).
compose-up-mooncake: image image-mooncake
	$(COMPOSE) -p embcache $(COMPOSE_MOONCAKE) up -d

## compose-test-mooncake: that cluster, a workload through Mooncake, its bytes checked on the master and the workers.
compose-test-mooncake: build build-mooncake $(MOONCAKE_IF_BUNDLE)
	MOONCAKE_DIR=$(MOONCAKE_DIR) scripts/compose-test.sh mooncake

# make compose-test covers the Mooncake cluster too when there is a Mooncake
# (../shared/mooncake's bundle, or MOONCAKE_DIR); integration/compose_test.go,
# run by test-go, needs it unpacked.
compose-test: $(if $(MOONCAKE_DIR),compose-test-mooncake,)
test-go: $(MOONCAKE_IF_BUNDLE)
test-go: export EMBCACHE_MOONCAKE_DIR = $(MOONCAKE_DIR)

clean:
	rm -rf $(BIN)
