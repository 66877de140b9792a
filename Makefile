# sandboxd: see README.md. Everything builds with cgo and -tags seccomp
# (libseccomp-dev at build time, libseccomp2 at run time).
#
# Targets install the Debian packages they need first (tools/deps/install.sh
# GROUP: as root with apt-get when missing, else it names the command; a few
# ms when nothing is missing), so a fresh Debian 12 VM with Go, git and make
# goes straight to `make run` / `make test`.

GO        ?= go
GOFLAGS   ?=
TAGS      := seccomp
BIN       := bin/sandboxd
BUILD     := build
# tools/bench is its own module (its chart and OCI dependencies stay out of
# the product's go.mod); go.work puts both in one workspace, where ./... is
# the root module only, so the bench's packages are named too.
PKGS      := ./... ./tools/bench/...
DEPS      := tools/deps/install.sh
export CGO_ENABLED := 1

.PHONY: all build test test-short bench lint run clean

all: build

build:
	@$(DEPS) build
	$(GO) build -tags $(TAGS) -o $(BIN) ./cmd/sandboxd

# The default suite: real sandboxes on the real kernel (as root), including
# the end-to-end tests on the python-runtime image (built or reused first).
test: build runtime-rootfs
	@$(DEPS) test
	SANDBOXD_RUNTIME_ROOTFS=$$(cat $(RUNTIME_ROOTFS_OUT)) $(GO) test -tags $(TAGS) -count=1 -timeout 20m $(PKGS)

# Unprivileged, no image: what runs without root.
test-short:
	@$(DEPS) build test
	$(GO) test -tags $(TAGS) -short -count=1 $(PKGS)

# The Go benchmarks (cold /bin/true sandbox, warm and cold print(1) through
# the pool, cached unpack), then the whole harness (tools/bench, below).
bench: build runtime-rootfs
	SANDBOXD_RUNTIME_ROOTFS=$$(cat $(RUNTIME_ROOTFS_OUT)) $(GO) test -tags $(TAGS) -run '^$$' \
		-bench 'ExecTrue|WarmPrint|ColdPrint|UnpackCached' -benchtime 100x -count 1 ./nsjail/ ./server/warmpool/ ./rootfs/
	$(MAKE) bench-full

lint:
	@$(DEPS) build
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet -tags $(TAGS) $(PKGS)

# Build, build or reuse the runtime image, serve on 127.0.0.1:3100 with the
# defaults (EXECUTION_* variables override them): the image is serve's
# default python_image, oci-layout:build/python-runtime.oci (relative to this
# directory), unpacked into RUNTIME_CACHE, the cache `make test` uses too.
run: build $(RUNTIME_OCI)/index.json
	EXECUTION_ROOTFS_CACHE="$${EXECUTION_ROOTFS_CACHE:-$(RUNTIME_CACHE)}" $(BIN) serve

clean:
	rm -rf bin $(BUILD)

# --- runtime image and rootfs cache (rootfs/, tools/runtime-image) ---
# runtime-image: build/python-runtime.oci (OCI layout) and .tar (docker-archive)
# from Debian forky (testing) with mmdebstrap (root; ~3 min, ~330 MB download);
# a no-op while both are newer than tools/runtime-image/* and
# RUNTIME_IMAGE_SUITE is the one of the last build (RUNTIME_IMAGE_SUITE=trixie:
# Debian 13, no pyarrow). VARIANT=geo builds build/python-runtime-geo.{oci,tar}
# instead (plus geopandas, shapely, pyproj, pyogrio); VARIANT=tests is
# `make runtime-image-tests`. Its package snapshot (lists and versions) is kept
# in build/NAME.snapshot. RUNTIME_IMAGE_* variables (tools/runtime-image/build.sh)
# pass through; RUNTIME_IMAGE_MAX_LIST_AGE_DAYS (120) bounds how old the
# mirror's package lists may be (tools/runtime-image/README.md).
# runtime-rootfs: unpacks the default image into RUNTIME_CACHE (a no-op, ~ms,
# once done) and writes the rootfs path to build/runtime-rootfs.path, so that
#   SANDBOXD_RUNTIME_ROOTFS=$$(cat build/runtime-rootfs.path)
VARIANT            ?= default
ifeq ($(filter default geo tests,$(VARIANT)),)
$(error VARIANT must be default, geo or tests, got '$(VARIANT)')
endif
RUNTIME_NAME       := $(if $(filter default,$(VARIANT)),python-runtime,python-runtime-$(VARIANT))
RUNTIME_OCI        := $(BUILD)/python-runtime.oci
RUNTIME_TAR        := $(BUILD)/python-runtime.tar
# The sandbox's root maps to an unprivileged host uid, and libcontainer's init
# bind-mounts the rootfs by path from inside the user namespace: that uid must
# search every directory above it. So the cache is not under the checkout
# (which may sit in a 0700 home such as /root) but serve's own default
# rootfs_cache: `make run` and `make test` share one unpack.
RUNTIME_CACHE      ?= /var/lib/sandboxd/rootfs
RUNTIME_ROOTFS_OUT := $(BUILD)/runtime-rootfs.path
RUNTIME_IMAGE_SRC  := $(filter-out %.md %/repro.sh,$(wildcard tools/runtime-image/*))
# RUNTIME_IMAGE_SUITE of an image's last build (empty: build.sh's default),
# rewritten only when it changes: switching suites rebuilds that image.
RUNTIME_IMAGE_SUITE_STAMP = $(BUILD)/$(1).suite

.PHONY: runtime-image runtime-rootfs bench-rootfs

runtime-image: $(BUILD)/$(RUNTIME_NAME).oci/index.json $(BUILD)/$(RUNTIME_NAME).tar

# The default image and each variant (one rule each: make knows which
# outputs a build writes). tests is built from the default's snapshot below.
define runtime_image_rule
$$(BUILD)/$(1).oci/index.json $$(BUILD)/$(1).tar &: $$(RUNTIME_IMAGE_SRC) $$(call RUNTIME_IMAGE_SUITE_STAMP,$(1))
	@$$(DEPS) image
	RUNTIME_IMAGE_VARIANT=$(2) tools/runtime-image/build.sh $$(BUILD)
endef
$(eval $(call runtime_image_rule,python-runtime,default))
$(eval $(call runtime_image_rule,python-runtime-geo,geo))

$(BUILD)/%.suite: FORCE
	@mkdir -p $(BUILD)
	@printf '%s\n' "$$RUNTIME_IMAGE_SUITE" | cmp -s - $@ || printf '%s\n' "$$RUNTIME_IMAGE_SUITE" >$@
.PHONY: FORCE
FORCE:

runtime-rootfs: $(RUNTIME_OCI)/index.json $(RUNTIME_TAR) build
	test -e $(BUILD)/go.mod || printf 'module sandboxd.invalid/build-output\n' >$(BUILD)/go.mod
	@# The sandbox's mapped root must traverse every directory above the
	@# cache: create missing ones 0755 whatever the caller's umask.
	(umask 022 && mkdir -p $(RUNTIME_CACHE))
	$(BIN) image unpack --image oci-layout:$(RUNTIME_OCI) --cache $(RUNTIME_CACHE) >$(RUNTIME_ROOTFS_OUT).out
	awk '/^rootfs /{print $$2}' $(RUNTIME_ROOTFS_OUT).out >$(RUNTIME_ROOTFS_OUT).tmp
	test -s $(RUNTIME_ROOTFS_OUT).tmp
	mv $(RUNTIME_ROOTFS_OUT).tmp $(RUNTIME_ROOTFS_OUT)
	rm -f $(RUNTIME_ROOTFS_OUT).out
	@echo "SANDBOXD_RUNTIME_ROOTFS=$$(cat $(RUNTIME_ROOTFS_OUT))"

# runtime-image-repro: builds the image twice from one package snapshot into
# build/repro/{1,2} and compares the digests (~5 min; tools/runtime-image/repro.sh),
# reusing the .debs `make runtime-image` downloaded.
.PHONY: runtime-image-repro
runtime-image-repro:
	@$(DEPS) image
	RUNTIME_IMAGE_DEB_CACHE="$${RUNTIME_IMAGE_DEB_CACHE:-$(abspath $(BUILD))/apt-archives}" \
		tools/runtime-image/repro.sh $(BUILD)/repro

# upstream-tests: a selection of numpy, pandas, scipy, scikit-learn and
# pyarrow's own tests (pyarrow only where the image has it: not on the
# trixie option), run outside and inside `sandboxd run` on the python-runtime-tests
# image (the default image's package snapshot plus python3-pytest and
# python3-hypothesis, test suites kept); fails when a test that passes
# outside does not pass inside. Root; ~3 min image + ~12 min tests. Not part
# of `make test`. Report: build/upstream-tests/report.md.
RUNTIME_TESTS_OCI := $(BUILD)/python-runtime-tests.oci
.PHONY: upstream-tests runtime-image-tests
runtime-image-tests: $(RUNTIME_TESTS_OCI)/index.json

$(RUNTIME_TESTS_OCI)/index.json $(BUILD)/python-runtime-tests.tar &: $(RUNTIME_OCI)/index.json $(RUNTIME_IMAGE_SRC)
	@$(DEPS) image
	RUNTIME_IMAGE_VARIANT=tests RUNTIME_IMAGE_SNAPSHOT=$(BUILD)/python-runtime.snapshot tools/runtime-image/build.sh $(BUILD)

upstream-tests: build runtime-image-tests
	@$(DEPS) test
	(umask 022 && mkdir -p $(RUNTIME_CACHE))
	$(BIN) image unpack --image oci-layout:$(RUNTIME_TESTS_OCI) --cache $(RUNTIME_CACHE) >$(BUILD)/upstream-tests.rootfs
	$(GO) run -tags $(TAGS) ./tools/upstreamtests -sandboxd $(BIN) -out $(BUILD)/upstream-tests \
		-rootfs $$(awk '/^rootfs /{print $$2}' $(BUILD)/upstream-tests.rootfs) $(UPSTREAM_FLAGS)

# Second unpack of a cached digest (target < 50 ms), busybox and python-runtime.
bench-rootfs:
	$(GO) test -tags $(TAGS) -run '^$$' -bench UnpackCached -benchtime 200x -count 1 ./rootfs/

# --- seccomp audit artifacts (seccomp/) ---
# SECCOMP.md, profile.json and pfc/<arch>.pfc are generated from
# seccomp/rules.go; seccomp-check fails when the committed ones are stale.
.PHONY: seccomp seccomp-check
seccomp:
	@$(DEPS) build
	$(GO) run -tags $(TAGS) ./tools/seccompgen -dir seccomp

seccomp-check:
	@$(DEPS) build
	$(GO) run -tags $(TAGS) ./tools/seccompgen -dir seccomp -check

# --- cgroup v2 VM harness (tools/v2vm) ---
# Boots Debian's kernel in qemu with cgroup v2 only and runs the privileged
# tests of tools/v2vm, cgroup/ and nsjail/ there, and with the python-runtime
# rootfs (build/runtime-rootfs.path, or SANDBOXD_RUNTIME_ROOTFS) the template
# forks' tests of nsjail/ and server/warmpool/ (tools/v2vm/README.md).
# Installs qemu, cpio and busybox-static (and refreshes the apt lists when
# they cannot resolve the kernel package it downloads); fails when a test
# fails or the VM does not finish within V2VM_TIMEOUT seconds (default 600,
# 2400 with the runtime rootfs).
.PHONY: test-v2vm
test-v2vm:
	@$(DEPS) build v2vm
	GO="$(GO)" tools/v2vm/run.sh

# --- benchmarks (tools/bench) ---
# tools/bench drives `sandboxd serve` over loopback (pool off and on) and runs
# the same workloads cold with sandboxd run, runc, crun, bubblewrap and docker
# run (Docker only as a peer to measure against) on the same rootfs; it writes
# build/bench/{report.md,results.json,latency.png}. Root only.
#   bench-full   everything (3-5 min on 2 cores); also copies the report and
#                chart to tools/bench/RESULTS.md and latency.png (committed)
#   bench-quick  few samples of everything (~1-2 min): a smoke run
#   bench-api    the HTTP API matrix only;  bench-peers  the cold launchers only
# The rootfs is the one `make runtime-rootfs` unpacked (BENCH_ROOTFS=DIR
# overrides it); BENCH_FLAGS adds flags (go run ./tools/bench -h lists them).
BENCH_ROOTFS ?= $(or $(SANDBOXD_RUNTIME_ROOTFS),$(shell cat $(RUNTIME_ROOTFS_OUT) 2>/dev/null))
BENCH_FLAGS  ?=
BENCH_RUN     = $(GO) run -tags $(TAGS) ./tools/bench -sandboxd $(BIN) -rootfs "$(BENCH_ROOTFS)" -image-tar $(RUNTIME_TAR)

.PHONY: bench-full bench-quick bench-api bench-peers bench-rootfs-check

bench-rootfs-check: build runtime-rootfs
	@test -n "$(BENCH_ROOTFS)" || { echo "bench: no runtime rootfs (make runtime-rootfs, or BENCH_ROOTFS=DIR)"; exit 1; }

bench-full: bench-rootfs-check
	$(BENCH_RUN) $(BENCH_FLAGS)

bench-quick: bench-rootfs-check
	$(BENCH_RUN) -quick -results "" $(BENCH_FLAGS)

bench-api: bench-rootfs-check
	$(BENCH_RUN) -skip-peers -results "" $(BENCH_FLAGS)

bench-peers: bench-rootfs-check
	$(BENCH_RUN) -skip-api -results "" $(BENCH_FLAGS)

# --- the worker image and the Kubernetes manifests (tools/deploy) ---
# worker-image: build/sandboxd-worker.oci (OCI layout) and .tar
# (docker-archive: `ctr -n k8s.io images import build/sandboxd-worker.tar`),
# no Docker: sandboxd built as `make build` does plus -trimpath (the
# checkout's path stays out of the binary), on a base layer unpacked from
# this host's Debian packages (libc6, libseccomp2, e2fsprogs' tools and
# their libraries); tools/deploy/image/README.md. SOURCE_DATE_EPOCH
# (default: HEAD's commit time) fixes every timestamp.
# worker-image-repro: the image step twice into build/worker-repro/{1,2},
# digests compared.
WORKER_BIN := bin/sandboxd-worker
.PHONY: worker-image worker-image-repro
worker-image:
	@$(DEPS) build
	$(GO) build -tags $(TAGS) -trimpath -buildvcs=false -o $(WORKER_BIN) ./cmd/sandboxd
	tools/deploy/image/build.sh $(BUILD) $(WORKER_BIN)

worker-image-repro: worker-image
	rm -rf $(BUILD)/worker-repro && mkdir -p $(BUILD)/worker-repro/1 $(BUILD)/worker-repro/2
	for i in 1 2; do \
		mkdir -p $(BUILD)/worker-repro/$$i/worker-image && cp -a $(BUILD)/worker-image/debs $(BUILD)/worker-repro/$$i/worker-image/; \
		tools/deploy/image/build.sh $(BUILD)/worker-repro/$$i $(WORKER_BIN) | awk '/^manifest digest/{print $$3}' >$(BUILD)/worker-repro/$$i.digest; \
		test -s $(BUILD)/worker-repro/$$i.digest || exit 1; \
	done
	cmp $(BUILD)/worker-repro/1.digest $(BUILD)/worker-repro/2.digest
	cmp $(BUILD)/worker-repro/1/sandboxd-worker.tar $(BUILD)/worker-repro/2/sandboxd-worker.tar
	@echo "worker image reproducible: $$(cat $(BUILD)/worker-repro/1.digest)"

# --- Kubernetes components for the test cluster (tools/deploy/kubernetes/cluster) ---
# k8s-components: build/k8s/bin/kube (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy and kubectl in one binary, with a
# symlink by each name), build/k8s/bin/etcd, build/k8s/bin/pause and
# build/k8s/pause.tar (docker-archive, `ctr -n k8s.io images import`; also
# build/k8s/pause.oci), all from the Go module proxy: the versions are
# tools/deploy/kubernetes/cluster/components/go.mod's. That module is not in
# go.work (its 266 modules would join the product's build list), hence
# GOWORK=off. Cold: ~7 min on 2 cores, 800 CPU-s, 3.2 GB RAM; a relink
# (~7 s) when main.go changes, a no-op when nothing did (README.md there,
# Components).
K8S_MOD      := tools/deploy/kubernetes/cluster/components
K8S_OUT      := $(BUILD)/k8s
K8S_BIN      := $(K8S_OUT)/bin
K8S_MOD_SRC  := $(K8S_MOD)/go.mod $(K8S_MOD)/go.sum
K8S_COMMANDS := kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
# The version stamped into the binaries is the module's own (go.mod).
K8S_VERSION   = $$(cd $(K8S_MOD) && GOWORK=off $(GO) list -m -f '{{.Version}}' k8s.io/kubernetes)
K8S_GO        = cd $(K8S_MOD) && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath
.PHONY: k8s-components
k8s-components: $(K8S_BIN)/kube $(addprefix $(K8S_BIN)/,$(K8S_COMMANDS)) $(K8S_BIN)/etcd $(K8S_BIN)/pause $(K8S_OUT)/pause.tar

$(K8S_BIN)/kube: $(K8S_MOD_SRC) $(K8S_MOD)/main.go
	@mkdir -p $(K8S_BIN)
	v=$(K8S_VERSION); major=$${v#v}; major=$${major%%.*}; minor=$${v#v*.}; minor=$${minor%%.*}; \
	x="-X k8s.io/component-base/version.gitVersion=$$v -X k8s.io/component-base/version.gitMajor=$$major \
	   -X k8s.io/component-base/version.gitMinor=$$minor -X k8s.io/component-base/version.gitCommit= \
	   -X k8s.io/client-go/pkg/version.gitVersion=$$v -X k8s.io/client-go/pkg/version.gitMajor=$$major \
	   -X k8s.io/client-go/pkg/version.gitMinor=$$minor -X k8s.io/client-go/pkg/version.gitCommit="; \
	$(K8S_GO) -ldflags "-s -w $$x" -o $(abspath $@).tmp .
	mv $@.tmp $@

# A symlink's mtime is its target's to make: once made, it stays done.
$(addprefix $(K8S_BIN)/,$(K8S_COMMANDS)): $(K8S_BIN)/kube
	ln -sfn kube $@

$(K8S_BIN)/etcd: $(K8S_MOD_SRC)
	@mkdir -p $(K8S_BIN)
	$(K8S_GO) -ldflags "-s -w" -o $(abspath $@).tmp go.etcd.io/etcd/server/v3
	mv $@.tmp $@

# The pod sandbox's program is upstream's own pause.c from the
# k8s.io/kubernetes module (build/pause/linux), built as its Makefile builds
# it (gcc -Os -static, stripped; gcc and libc6-dev are the build group's): the image
# then runs exactly what registry.k8s.io/pause runs, under the tag of that
# Makefile. A Go rewrite would be a second implementation of its signal and
# zombie handling to keep right, and ten times its size.
$(K8S_BIN)/pause: $(K8S_MOD_SRC)
	@$(DEPS) build
	@mkdir -p $(K8S_BIN)
	dir=$$(cd $(K8S_MOD) && GOWORK=off $(GO) mod download k8s.io/kubernetes && GOWORK=off $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes) && \
	tag=$$(awk '$$1 == "TAG" && $$2 == "?=" {print $$3}' $$dir/build/pause/Makefile) && test -n "$$tag" && \
	gcc -Os -Wall -Werror -static -s -DVERSION=v$$tag -o $@.tmp $$dir/build/pause/linux/pause.c && \
	printf '%s\n' "$$tag" >$(K8S_OUT)/pause.version
	mv $@.tmp $@

# SOURCE_DATE_EPOCH (default: the time of the last commit of the module's
# go.mod, which fixes pause.c's version; HEAD's while it has none) sets
# every timestamp. The tag is the one of upstream's pause Makefile.
$(K8S_OUT)/pause.tar: $(K8S_BIN)/pause tools/deploy/kubernetes/cluster/pauseimage/main.go
	epoch=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct -- $(K8S_MOD)/go.mod)}; \
	$(GO) run ./tools/deploy/kubernetes/cluster/pauseimage -pause $(K8S_BIN)/pause \
		-tag registry.k8s.io/pause:$$(cat $(K8S_OUT)/pause.version) \
		-epoch $${epoch:-$$(git log -1 --format=%ct)} -oci $(K8S_OUT)/pause.oci -archive $@

# --- the test cluster (tools/deploy/kubernetes/cluster/README.md) ---
# test-k8s: a real Kubernetes with three nodes on this machine (each a
# network and mount namespace of its own), the worker image and manifests
# deployed, the e2e steps run, everything torn down and the host compared
# with what it was before; as root. Measurements: build/k8s/measurements.txt.
# k8s-debs: Debian's containerd, runc and CNI plugins, unpacked (not
# installed) into build/k8s/root.
.PHONY: test-k8s k8s-debs
k8s-debs:
	tools/deploy/kubernetes/cluster/debs.sh $(K8S_OUT)/root

test-k8s: k8s-components k8s-debs worker-image $(RUNTIME_OCI)/index.json
	@$(DEPS) k8s
	K8S=$(abspath $(K8S_OUT)) RUNTIME_OCI=$(abspath $(RUNTIME_OCI)) tools/deploy/kubernetes/cluster/test.sh
