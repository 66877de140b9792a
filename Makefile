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
# SECCOMP.md, profile.json and pfc/<arch>.pfc are generated from
# seccomp/rules.go; seccomp-check fails when the committed ones are stale.
.PHONY: seccomp seccomp-check
seccomp:
	$(GO) run -tags $(TAGS) ./tools/seccompgen -dir seccomp

seccomp-check:
	$(GO) run -tags $(TAGS) ./tools/seccompgen -dir seccomp -check

# --- cgroup v2 VM harness (tools/v2vm) ---
# Boots Debian's kernel in qemu with cgroup v2 only and runs the privileged
# tests of tools/v2vm, cgroup/ and nsjail/ there (tools/v2vm/README.md).
# Needs what tools/v2vm/deps.sh installs; fails when a test fails or the VM
# does not finish within V2VM_TIMEOUT seconds (default 600).
.PHONY: test-v2vm
test-v2vm:
	GO="$(GO)" tools/v2vm/run.sh

# --- benchmarks (tools/bench) ---
