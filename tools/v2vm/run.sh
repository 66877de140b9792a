#!/usr/bin/env bash
# cgroup v2 VM harness: boots Debian's kernel in qemu with cgroup v2 only and
# runs the privileged tests of tools/v2vm, nsjail and cgroup inside it.
# See tools/v2vm/README.md. Needs what `tools/deps/install.sh build v2vm`
# installs (`make test-v2vm` runs it first); installs nothing itself (the
# kernel package is only downloaded and unpacked).
#
# Exit status: the tests' (0 only if every test binary passed and no cgroup
# leaked), 124 if the VM did not finish within V2VM_TIMEOUT, 2 on setup errors.
#
# Knobs (environment):
#   V2VM_TIMEOUT  seconds the whole VM run may take (default 600, 2400 with the runtime
#                 image: its entries take ~10 min under TCG)
#   V2VM_ACCEL    auto (probe KVM, fall back to TCG), kvm or tcg (default auto)
#   V2VM_MEM      guest memory in MiB (default 2048, 4096 with the runtime image: the
#                 conformance suite's 2 GiB allocation must meet the cgroup's limit, not
#                 the guest's overcommit heuristic)
#   V2VM_SMP      guest CPUs (default 2)
#   V2VM_KERNEL   kernel package name (default: what linux-image-amd64 depends on)
#   V2VM_OUT      work and cache directory (default build/v2vm)
#   V2VM_ONLY     run only the plan entries named here (space-separated; default all)
#   V2VM_RUNTIME_ROOTFS  the python-runtime rootfs for the *-rt entries (default:
#                 $SANDBOXD_RUNTIME_ROOTFS, else build/runtime-rootfs.path's); none: they are left out
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${V2VM_OUT:-build/v2vm}
TIMEOUT=${V2VM_TIMEOUT:-}
ACCEL=${V2VM_ACCEL:-auto}
MEM=${V2VM_MEM:-}
SMP=${V2VM_SMP:-2}
GO=${GO:-go}

# What runs in the VM, in order: name, package, flags of its test binary.
# Benchmarks get their own entry: go test runs none after a failed test, and
# the numbers are wanted anyway. Entries named *-rt get the python-runtime
# image (a read-only ext4 disk, /runtime in the VM, as
# SANDBOXD_RUNTIME_ROOTFS): the template forks' tests; the others run without
# it, and their tests that need it skip.
#   TestOutputFloodIsCapped pushes 1 GB through a pipe: over 60 s under TCG,
#   and nothing in it depends on the cgroup version.
PLAN=(
	"v2vm ./tools/v2vm -test.v -test.count=1 -test.timeout=3m"
	"cgroup ./cgroup -test.v -test.count=1 -test.timeout=4m"
	"nsjail ./nsjail -test.v -test.count=1 -test.timeout=5m -test.skip=^TestOutputFloodIsCapped$"
	"nsjail-rt ./nsjail -test.v -test.count=1 -test.timeout=10m -test.run=^(TestTemplate|TestShell|TestPreparedShell|TestSweepAfterTemplateWorkerCrash)"
	"warmpool-rt ./server/warmpool -test.v -test.count=1 -test.timeout=15m -test.run=^(TestTemplate|TestShell)"
	"warmpool-forks-rt ./server/warmpool -test.v -test.count=1 -test.timeout=15m -test.run=^(TestWarmMatchesCold|TestKernelsOnForks|TestPoolRefillsInTheBackground)$/^(forks|[A-Z].*)$"
	"server-forks-rt ./server -test.v -test.count=1 -test.timeout=10m -test.run=^(TestPoolThroughAPI|TestSessionKernelFromTheWarmPool)$/^forks$"
	"v2vm-bench ./tools/v2vm -test.run=^$ -test.bench=ForkExecTrue -test.benchtime=200x"
	"nsjail-bench ./nsjail -test.run=^$ -test.bench=ExecTrue -test.benchtime=50x"
)
# Kernel features the tests need built in (=y); a missing one fails early with
# its name instead of as a puzzling test failure in the VM.
BUILTIN=(CGROUPS MEMCG CGROUP_PIDS CGROUP_SCHED CFS_BANDWIDTH CPUSETS CGROUP_DEVICE CGROUP_BPF
	BPF_SYSCALL USER_NS PID_NS NET_NS UTS_NS IPC_NS SECCOMP SECCOMP_FILTER DEVTMPFS TMPFS
	BLK_DEV_INITRD SERIAL_8250_CONSOLE BINFMT_SCRIPT UNIX)
# Features that may be modules (module:CONFIG option): when the option is =m,
# the .ko files (with dependencies) go into the initramfs, insmod'ed by init2.
MODULES=(overlay:OVERLAY_FS)
# With the runtime image: its disk (virtio-blk) and filesystem.
# (ext4 on 6.1 loads crc32c whatever the features: "Cannot load crc32c driver".)
# loop: session volumes (server/volume), loop-mounted ext4 images.
RT_MODULES=(virtio_pci:VIRTIO_PCI virtio_blk:VIRTIO_BLK crc32c_generic:CRYPTO_CRC32C ext4:EXT4_FS loop:BLK_DEV_LOOP)

die() { echo "v2vm: $*" >&2; exit 2; }
# is_static FILE: no ELF interpreter. (Not `readelf | grep -q`: with pipefail
# a SIGPIPE'd readelf would turn a match into a silent pass.)
is_static() {
	local headers
	headers=$(readelf -lW "$1") || die "readelf $1 failed"
	[[ $headers != *"program interpreter"* ]]
}
log() { echo "v2vm: $*" >&2; }

for tool in qemu-system-x86_64 busybox cpio dpkg-deb apt-get readelf "$GO"; do
	command -v "$tool" >/dev/null || die "$tool not found: run tools/deps/install.sh build v2vm (as root), or make test-v2vm"
done
t0=$SECONDS
mkdir -p "$OUT"

# --- kernel: Debian's linux-image-*-amd64, downloaded once and cached ----------
fetch_kernel() {
	local pkg=${V2VM_KERNEL:-} ver dir
	if [ -z "$pkg" ]; then
		pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ && !n++ {print $2}')
	fi
	if [ -z "$pkg" ]; then
		# Offline or no apt lists: use the newest cached kernel if any.
		dir=$(ls -d "$OUT"/kernel/linux-image-* 2>/dev/null | sort -V | tail -n1)
		[ -n "$dir" ] || die "cannot resolve linux-image-amd64 from the apt sources (run apt-get update) and no kernel is cached in $OUT/kernel"
		KDIR=$dir
		return
	fi
	ver=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
	[ -n "$ver" ] && [ "$ver" != "(none)" ] || die "no candidate version of $pkg in the apt sources (run apt-get update)"
	KDIR=$OUT/kernel/${pkg}_$ver
	[ -f "$KDIR/.complete" ] && return
	log "downloading $pkg $ver"
	rm -rf "$KDIR" "$OUT/kernel/tmp"
	mkdir -p "$OUT/kernel/tmp"
	# -o APT::Sandbox::User=root: the download directory is not the _apt user's.
	(cd "$OUT/kernel/tmp" && apt-get -q -o APT::Sandbox::User=root download "$pkg=$ver" >/dev/null) ||
		die "apt-get download $pkg=$ver failed"
	dpkg-deb -x "$OUT"/kernel/tmp/*.deb "$OUT/kernel/tmp/x"
	mv "$OUT/kernel/tmp/x" "$KDIR"
	rm -rf "$OUT/kernel/tmp"
	touch "$KDIR/.complete"
}
fetch_kernel
VMLINUZ=$(ls "$KDIR"/boot/vmlinuz-* | head -n1)
KCONFIG=$(ls "$KDIR"/boot/config-* | head -n1)
KVER=${VMLINUZ##*/vmlinuz-}
for opt in "${BUILTIN[@]}"; do
	grep -q "^CONFIG_$opt=y" "$KCONFIG" || die "kernel $KVER: CONFIG_$opt is not built in ($(grep "CONFIG_$opt[= ]" "$KCONFIG" || echo unset))"
done
log "kernel $KVER ($KDIR)"

# --- initramfs -----------------------------------------------------------------
ROOT=$OUT/root
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,etc,lib/modules,tests}
cp tools/v2vm/init tools/v2vm/init2 "$ROOT/"

BUSYBOX=$(command -v busybox)
is_static "$BUSYBOX" || die "$BUSYBOX is dynamically linked: install busybox-static"
cp "$BUSYBOX" "$ROOT/bin/busybox"
printf 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:10001:10001:sandbox:/tmp:/bin/sh\n' >"$ROOT/etc/passwd"
printf 'root:x:0:\nsandbox:x:10001:\n' >"$ROOT/etc/group"
echo v2vm >"$ROOT/etc/hostname"

# Modules, dependencies first, decompressed (busybox insmod reads plain .ko
# only). The package has no modules.dep (depmod runs at install time), so each
# module's dependencies come from its own .modinfo "depends=" string.
MODDIR=$KDIR/lib/modules/$KVER
n=0
add_module() {
	local mod=$1 src dst dep
	for f in "$ROOT"/lib/modules/*-"$mod.ko"; do [ -e "$f" ] && return; done
	src=$(find "$MODDIR/kernel" \( -name "$mod.ko" -o -name "$mod.ko.xz" -o -name "$mod.ko.zst" \) | head -n1)
	[ -n "$src" ] || die "kernel $KVER: module $mod not found"
	dst=$ROOT/lib/modules/$mod.ko.tmp
	case $src in
	*.xz) xz -dc "$src" >"$dst" ;;
	*.zst) zstd -qdc "$src" >"$dst" ;;
	*) cp "$src" "$dst" ;;
	esac
	for dep in $(tr '\0' '\n' <"$dst" | sed -n 's/^depends=//p' | tr , ' '); do add_module "$dep"; done
	mv "$dst" "$ROOT/lib/modules/$(printf '%02d' $n)-$mod.ko"
	n=$((n + 1))
}
# --- the python-runtime image, for the *-rt entries ------------------------------
RT_ROOTFS=${V2VM_RUNTIME_ROOTFS:-${SANDBOXD_RUNTIME_ROOTFS:-}}
if [ -z "$RT_ROOTFS" ] && [ -f build/runtime-rootfs.path ]; then RT_ROOTFS=$(cat build/runtime-rootfs.path); fi
RT_IMG=
if [ -n "$RT_ROOTFS" ] && [ "$RT_ROOTFS" != none ] && [ -d "$RT_ROOTFS" ]; then
	# One ext4 image per rootfs (its path names the image digest), cached.
	# No metadata_csum: the kernel's crc32c may be a module.
	RT_IMG=$OUT/runtime/$(printf '%s' "$RT_ROOTFS" | sha256sum | cut -c1-16).ext4
	if [ ! -f "$RT_IMG" ]; then
		mkdir -p "$OUT/runtime"
		rm -f "$OUT"/runtime/*.ext4
		mb=$(du -sm "$RT_ROOTFS" | cut -f1)
		log "making the runtime image's disk from $RT_ROOTFS (${mb} MiB)"
		truncate -s $((mb * 5 / 4 + 256))M "$RT_IMG.tmp"
		mkfs.ext4 -q -F -L runtime -O ^metadata_csum,^has_journal -E root_owner=0:0 -d "$RT_ROOTFS" "$RT_IMG.tmp" ||
			{ rm -f "$RT_IMG.tmp"; die "mkfs.ext4 of the runtime image failed"; }
		mv "$RT_IMG.tmp" "$RT_IMG"
	fi
	MODULES+=("${RT_MODULES[@]}")
	# Session volumes (server/volume) run mkfs.ext4 and e2fsck: dynamically
	# linked, so they go in with the libraries ldd names (the test binaries
	# and busybox stay static).
	for tool in mkfs.ext4 e2fsck; do
		bin=$(command -v "$tool") || die "$tool not found (e2fsprogs)"
		cp -L "$bin" "$ROOT/bin/$tool"
		for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
			mkdir -p "$ROOT$(dirname "$lib")"
			cp -L "$lib" "$ROOT$lib"
		done
	done
	MEM=${MEM:-4096}
	TIMEOUT=${TIMEOUT:-2400}
else
	log "no python-runtime rootfs (V2VM_RUNTIME_ROOTFS, SANDBOXD_RUNTIME_ROOTFS, build/runtime-rootfs.path): the *-rt entries are left out"
fi
MEM=${MEM:-2048}
TIMEOUT=${TIMEOUT:-600}
for entry in "${MODULES[@]}"; do
	mod=${entry%%:*} opt=${entry#*:}
	grep -q "^CONFIG_$opt=y" "$KCONFIG" || add_module "$mod"
done

# Static test binaries: the VM has no libc, so cgo (libseccomp, libcontainer's
# nsenter) is linked statically; osusergo/netgo keep glibc's NSS out of it.
PLANFILE=$ROOT/tests/plan
: >"$PLANFILE"
# build_tests PKG: the static test binary of PKG in $ROOT/tests/<base>/.
build_tests() {
	local pkg=$1 bin
	bin=$(basename "$pkg")
	[ -e "$ROOT/tests/$bin/$bin.test" ] && return
	mkdir -p "$ROOT/tests/$bin"
	log "building $pkg test binary (static)"
	CGO_ENABLED=1 "$GO" test -c -tags 'seccomp osusergo netgo' \
		-ldflags '-linkmode external -extldflags -static' \
		-o "$ROOT/tests/$bin/$bin.test" "$pkg" 2> >(grep -v 'statically linked applications requires at runtime' >&2) ||
		die "building $pkg test binary failed"
	is_static "$ROOT/tests/$bin/$bin.test" || die "$pkg test binary is not static"
	# Tests run in /tests/<bin>, as go test runs them in the package
	# directory: ./testdata and the repository's ../testdata/<bin> resolve.
	if [ -d "$pkg/testdata" ]; then cp -a "$pkg/testdata" "$ROOT/tests/$bin/"; fi
	if [ -d "testdata/$bin" ]; then
		mkdir -p "$ROOT/tests/testdata"
		cp -a "testdata/$bin" "$ROOT/tests/testdata/"
	fi
}
# The v2vm binary is also init2's cgroup escape watcher: always there.
build_tests ./tools/v2vm
for entry in "${PLAN[@]}"; do
	read -r name pkg flags <<<"$entry"
	if [ -n "${V2VM_ONLY:-}" ] && [[ " $V2VM_ONLY " != *" $name "* ]]; then
		continue
	fi
	if [[ $name == *-rt ]] && [ -z "$RT_IMG" ]; then
		continue
	fi
	if [ ! -d "$pkg" ] || [ -z "$(ls "$pkg"/*_test.go 2>/dev/null)" ]; then
		log "WARNING: $pkg has no tests yet: $name not run in the VM"
		continue
	fi
	bin=$(basename "$pkg")
	build_tests "$pkg"
	echo "$name $bin $flags" >>"$PLANFILE"
done
[ -s "$PLANFILE" ] || die "nothing to run"
# nsjailtest.ProbeRootfs builds nsjail/nsjailtest/probe with `go build` at
# test time; the VM has no toolchain, so build it here and hand it over
# through $SANDBOXD_PROBE (init2 exports it).
if [ -d nsjail/nsjailtest/probe ]; then
	CGO_ENABLED=0 "$GO" build -o "$ROOT/tests/probe" ./nsjail/nsjailtest/probe || die "building the probe failed"
fi

INITRD=$OUT/initramfs.cpio
(cd "$ROOT" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$INITRD"
log "initramfs $(du -m "$INITRD" | cut -f1) MiB, built in $((SECONDS - t0)) s"

# --- qemu ----------------------------------------------------------------------
# mitigations=off: the VM runs only our tests, and under emulation KPTI and
# friends make every syscall several times slower. cgroup_no_v1=all (with
# systemd.unified_cgroup_hierarchy=1, as production hosts boot) leaves only v2.
CMDLINE="console=ttyS0 panic=-1 loglevel=4 mitigations=off systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"
QPID=
cleanup() {
	if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
		kill "$QPID" 2>/dev/null || true
	fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# run_qemu ACCEL CPU TIMEOUT RESULTS CONSOLE EXTRA_CMDLINE: boots the VM with
# the console on CONSOLE (a file, or - for stdout) and ttyS1 in RESULTS; kills
# it (only the qemu started here, by PID) after TIMEOUT seconds. Returns 124
# on timeout, else qemu's status.
run_qemu() {
	local accel=$1 cpu=$2 limit=$3 results=$4 console=$5 extra=$6 deadline disk=()
	if [ -n "$RT_IMG" ]; then
		disk=(-drive "file=$RT_IMG,format=raw,if=virtio,readonly=on")
	fi
	local con=(-chardev stdio,id=con,signal=off) err=/dev/stderr
	if [ "$console" != - ]; then
		con=(-chardev "file,id=con,path=$console") err=$console
	fi
	: >"$results"
	qemu-system-x86_64 -nodefaults -no-reboot -display none -monitor none -nic none \
		-accel "$accel" -cpu "$cpu" -smp "$SMP" -m "$MEM" \
		-kernel "$VMLINUZ" -initrd "$INITRD" -append "$CMDLINE $extra" \
		"${con[@]}" -serial chardev:con -serial "file:$results" "${disk[@]}" </dev/null 2>>"$err" &
	QPID=$!
	deadline=$((SECONDS + limit))
	while kill -0 "$QPID" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			kill "$QPID" 2>/dev/null || true
			sleep 2
			kill -KILL "$QPID" 2>/dev/null || true
			wait "$QPID" 2>/dev/null || true
			QPID=
			return 124
		fi
		sleep 1
	done
	local st=0
	wait "$QPID" || st=$?
	QPID=
	return $st
}

accel=tcg cpu=max
case $ACCEL in
tcg) ;;
kvm) accel=kvm cpu=host ;;
auto)
	# /dev/kvm may exist and still hang (nested virtualization): a short
	# boot that only reports back decides.
	if [ -w /dev/kvm ]; then
		pst=0
		run_qemu kvm host 15 "$OUT/probe.log" "$OUT/probe-console.log" v2vm.probe=1 2>/dev/null || pst=$?
		if grep -q V2VM-PROBE-OK "$OUT/probe.log"; then
			accel=kvm cpu=host
		else
			log "KVM probe failed (status $pst, see $OUT/probe-console.log): using TCG"
		fi
	fi
	;;
*) die "V2VM_ACCEL=$ACCEL: want auto, kvm or tcg" ;;
esac

RESULTS=$OUT/results.log
log "booting $KVER with $accel ($SMP cpus, $MEM MiB), timeout ${TIMEOUT}s; tests: $(cut -d' ' -f1 "$PLANFILE" | tr '\n' ' ')"
tb=$SECONDS
qst=0
run_qemu "$accel" "$cpu" "$TIMEOUT" "$RESULTS" - "" || qst=$?
elapsed=$((SECONDS - tb))
tr -d '\r' <"$RESULTS" >"$RESULTS.tmp" && mv "$RESULTS.tmp" "$RESULTS"

if [ "$qst" = 124 ]; then
	log "FAIL: the VM did not finish within ${TIMEOUT}s (killed); partial results in $RESULTS"
	exit 124
fi
code=$(sed -n 's/^V2VM-EXIT-CODE: \([0-9]*\)$/\1/p' "$RESULTS" | tail -n1)
if [ -z "$code" ]; then
	log "FAIL: the VM exited (qemu status $qst) after ${elapsed}s without reporting an exit code; see $RESULTS"
	exit 2
fi
# Summary: per-binary status, failed tests, panics, leaks and escapes.
log "summary:"
grep -a -E '^V2VM: (---|LEAK|ESCAPE)|^ *--- FAIL|^panic:|^FAIL' "$RESULTS" >&2 || true
if [ "$code" != 0 ]; then
	log "FAIL: tests in the VM failed (exit code $code, VM ${elapsed}s, total $((SECONDS - t0))s); output in $RESULTS"
	exit "$code"
fi
log "PASS: cgroup v2 tests ($accel, VM ${elapsed}s, total $((SECONDS - t0))s); output in $RESULTS"
