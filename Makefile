# sandboxd: see README.md. Everything builds with cgo and -tags seccomp
# (libseccomp-dev at build time, libseccomp2 at run time).

GO        ?= go
GOFLAGS   ?=
TAGS      := seccomp
BIN       := bin/sandboxd
BUILD     := build
PKGS      := ./...
export CGO_ENABLED := 1

.PHONY: all build test test-short bench lint run clean

all: build

build:
	$(GO) build -tags $(TAGS) -o $(BIN) ./cmd/sandboxd

# The default suite: real sandboxes on the real kernel (as root).
test: build
	$(GO) test -tags $(TAGS) -count=1 -timeout 20m $(PKGS)

# Unprivileged, no image: what runs without root.
test-short:
	$(GO) test -tags $(TAGS) -short -count=1 $(PKGS)

bench: build
	$(GO) test -tags $(TAGS) -run '^$$' -bench . -benchtime 200x -count 1 ./nsjail/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet -tags $(TAGS) $(PKGS)

run: build
	$(BIN) serve

clean:
	rm -rf bin $(BUILD)

# --- runtime image and rootfs cache (rootfs/, tools/runtime-image) ---

# --- seccomp audit artifacts (seccomp/) ---

# --- cgroup v2 VM harness (tools/v2vm) ---

# --- benchmarks (tools/bench) ---
# tools/bench drives `sandboxd serve` over loopback (pool off and on) and runs
# the same workloads cold with sandboxd run, runc, crun, bubblewrap and docker
# on the same rootfs; it writes build/bench/{report.md,results.json,latency.png}
# and copies the report to tools/bench/RESULTS.md. Root only. The rootfs is
# $(BENCH_ROOTFS): by default the one `make runtime-rootfs` unpacked.
#   bench-full   everything (~10 min on 2 cores): the numbers for the README
#   bench-quick  few samples of everything (~3 min): a smoke run
#   bench-api    the HTTP API matrix only;  bench-peers  the cold launchers only
# BENCH_FLAGS adds flags (go run ./tools/bench -h lists them).
BENCH_ROOTFS ?= $(or $(SANDBOXD_RUNTIME_ROOTFS),$(shell cat $(BUILD)/runtime-rootfs.path 2>/dev/null))
BENCH_FLAGS  ?=
BENCH_RUN     = $(GO) run -tags $(TAGS) ./tools/bench -sandboxd $(BIN) -rootfs "$(BENCH_ROOTFS)" -image-tar $(BUILD)/python-runtime.tar

.PHONY: bench-full bench-quick bench-api bench-peers bench-rootfs-check

bench-rootfs-check:
	@test -n "$(BENCH_ROOTFS)" || { echo "bench: no runtime rootfs: run 'make runtime-rootfs' (or set BENCH_ROOTFS=DIR)"; exit 1; }

bench-full: build bench-rootfs-check
	$(BENCH_RUN) $(BENCH_FLAGS)

bench-quick: build bench-rootfs-check
	$(BENCH_RUN) -quick -results "" $(BENCH_FLAGS)

bench-api: build bench-rootfs-check
	$(BENCH_RUN) -skip-peers -results "" $(BENCH_FLAGS)

bench-peers: build bench-rootfs-check
	$(BENCH_RUN) -skip-api -results "" $(BENCH_FLAGS)
