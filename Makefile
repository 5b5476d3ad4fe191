# embcache — the project's commands. `make test` is what CI runs (.ci/run).
GO        ?= go
BIN       := bin
PKGS      := ./...
FUZZTIME  ?= 60s
BENCHTIME ?= 1s

.PHONY: all build test vet test-go test-mooncake bench lint fuzz demo clean

all: build

build:
	$(GO) build $(PKGS)

## test: vet (with and without the mooncake tag) and every test under -race.
test: vet test-go test-mooncake

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags mooncake $(PKGS)

test-go:
	$(GO) test -race -count=1 $(PKGS)

# The Mooncake transport is cgo behind a build tag; its tests build a fake
# libmooncake_store with gcc (on every machine of this project's kind).
test-mooncake:
	$(GO) test -race -count=1 -tags mooncake ./payload/mooncake/...

bench:
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./cachekey/ ./localcache/ ./payload/...

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff

# Each fuzz target for FUZZTIME (go test -fuzz takes one target at a time).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzKeys$$' -fuzztime $(FUZZTIME) ./cachekey/

demo:
	@echo "embcache demo: not built yet. It will start an embedded NATS server, a reconciler,"
	@echo "one encoder and four prefill workers as processes, and print the dedup table."
	@echo "Today: 'make test' runs keys, the local cache and the payload plane."

clean:
	rm -rf $(BIN)
