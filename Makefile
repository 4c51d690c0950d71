# llmlb: `make demo` shows it working, `make test` is what CI runs.

GO        ?= go
BIN       ?= bin/llmlb
# An execution count, not a duration: a duration -fuzztime can fail with a
# spurious "context deadline exceeded" under CPU contention (golang/go#75804).
FUZZTIME  ?= 50000x
# make test's count: the fuzzing there is a smoke test, the seed corpora
# already ran in the race suite.
TEST_FUZZTIME ?= 10000x
BENCHTIME ?= 1s
STATICCHECK ?= v0.8.2

.PHONY: all build test check fuzz soak soak-short demo run sim bench lint clean

# make soak's length and concurrency.
SOAK         ?= 10m
SOAK_STREAMS ?= 2000

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) .

# What CI runs: go vet, the whole suite once with the race detector, a
# 30-second soak of the race-built binary, then every fuzz target briefly
# through its race-built test binary. All of it builds with -race, so that
# vet, the soak and the fuzzing reuse the test run's compiled packages:
# with cold caches each build configuration costs minutes here.
#
# A race-built process sleeps a second as it exits (the race runtime's
# atexit_sleep_ms) to catch races at exit, in C destructors; make test's
# test binaries exit once their tests have returned, and its fuzzing
# starts three such processes a target, each of which would wait it out.
test:
	$(GO) vet -race ./...
	GORACE="atexit_sleep_ms=0 $(GORACE)" $(GO) test -race -count=1 ./...
	$(MAKE) soak-short
	GORACE="atexit_sleep_ms=0 $(GORACE)" $(MAKE) fuzz FUZZTIME=$(TEST_FUZZTIME) FUZZ_BUILD=-race

# The inner loop, under a minute with warm caches: formatting, vet,
# staticcheck and the tests that -short keeps, the checks of the docs and
# examples (internal/doccheck) among them; it skips the long virtual-time
# replays and the real-time end-to-end runs.
check:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK) ./...
	$(GO) test -short -count=1 ./...

# Runs each Fuzz* function of every package for FUZZTIME, one at a time
# (a fuzzing run takes one target, and fuzzes on every core). Each
# package's test binary is built once, with FUZZ_BUILD's flags, and run
# per target from the package's directory with go test's corpus cache.
# By default the binary is built with -fuzz, which instruments every
# package it links for coverage guidance, as `go test -fuzz` does; make
# test builds it with -race instead, reusing the race suite's packages:
# its fuzzing mutates the corpus without guidance, under the race detector.
FUZZ_BUILD ?= -fuzz .
fuzz:
	@cache=$$($(GO) env GOCACHE); mkdir -p bin/fuzz; \
	for d in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		pkg=$$($(GO) list $$d) && bin=$(abspath bin/fuzz)/$$(echo $${d#./} | tr / _).test && \
		$(GO) test -c $(FUZZ_BUILD) -o $$bin $$d || exit 1; \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$d/*_test.go); do \
			echo "fuzz $$d $$t ($(FUZZTIME))"; \
			(cd $$d && $$bin -test.run '^$$' -test.fuzz "^$$t\$$" -test.fuzztime $(FUZZTIME) -test.fuzzcachedir "$$cache/fuzz/$$pkg") || exit 1; \
		done; \
	done

# SOAK_STREAMS concurrent streams for SOAK through the llmlb binary against
# five emulated servers, one killed halfway and started again, one ending a
# fifth of its streams early; prints requests completed, failed, broken,
# silently truncated and lost, and llmlb's memory, goroutines and
# file descriptors before, during and after. The test is a package of its
# own, built with build's flags, so that it compiles little beyond what
# build already compiled.
soak: build
	LLMLBTEST_SOAK=$(SOAK) LLMLBTEST_SOAK_STREAMS=$(SOAK_STREAMS) LLMLBTEST_BIN=$(abspath $(BIN)) CGO_ENABLED=0 $(GO) test -trimpath -count=1 -vet=off -run '^TestSoak$$' -v -timeout 0 ./e2e/soak

# 30 seconds of 500 streams through a binary built with the race detector
# (it allows 8,128 live goroutines, fewer than 2,000 streams need), which
# halts on the first race it finds.
soak-short:
	$(GO) build -race -o bin/llmlb-race .
	LLMLBTEST_SOAK=30s LLMLBTEST_SOAK_STREAMS=500 LLMLBTEST_BIN=$(abspath bin/llmlb-race) GORACE=halt_on_error=1 $(GO) test -race -count=1 -vet=off -run '^TestSoak$$' -v -timeout 0 ./e2e/soak

# Four emulated vLLM servers (one slower, ending a tenth of its streams
# early), the balancer, 24 streaming clients and a live per-backend view
# for 20 seconds.
demo:
	$(GO) run . demo

# The balancer on ./config.yaml; start `make sim` first in another terminal.
run:
	$(GO) run . serve --config config.yaml

sim:
	$(GO) run . sim --count 3 --listen 127.0.0.1:8001

# The micro-benchmarks; the routing benchmark at every load level (results
# in sweep.json and sweep-<workload>.png), with 8 replicas against one (the
# synthetic workloads: the traces at 8 replicas take 20 minutes more), and
# the two published experiments; then the proxy's cost against Go's bare
# reverse proxy, HAProxy and nginx.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...
	$(GO) run . bench --sweep --json sweep.json --plot sweep.png
	$(GO) run . bench --replicas 8 --workload shared-prefix,multi-turn,lora,burst --json replicas.json
	$(GO) run . bench --scenario llm-d-kv-cache-wins --json llm-d-kv-cache-wins.json
	$(GO) run . bench --scenario sglang-v04-shared-prefix --json sglang-v04-shared-prefix.json
	$(GO) run . bench --prefill 2 --backends 4 --slow -1 --json pd.json
	$(GO) run . bench --scenario vllm-chunked-vs-disagg --scale 10 --json vllm-chunked-vs-disagg.json
	$(GO) run . overhead --json overhead.json

lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

clean:
	rm -rf bin
