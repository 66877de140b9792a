#!/bin/bash
# CPU per execution through the API, all of it: starts `bin/sandboxd serve`
# (pool 4 per policy, zygotes or template forks), waits for a full pool, runs
# tools/bench's closed loop of one workload against it (-url) and divides
# the CPU the machine, the worker, the worker's reaped children (runc inits)
# and the sandboxes' cgroups (v1 cpuacct) spent meanwhile by the number of
# executions. With "perf", also records `perf record -a -g` into
# build/cpu-per-exec-KIND.data for `perf report --sort comm`.
# Root, cgroup v1 (this host); a quiet machine, since /proc/stat counts
# everyone.
#
# usage: tools/bench/cpu-per-exec.sh forks|zygotes [N [CONCURRENCY [WORKLOAD [perf]]]]
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=${1:?forks or zygotes}; n=${2:-40}; conc=${3:-2}; workload=${4:-pandas}; perfopt=${5:-}
case $kind in forks) forks=true ;; zygotes) forks=false ;; *) echo "forks or zygotes, not $kind" >&2; exit 2 ;; esac
rootfs=${SANDBOXD_RUNTIME_ROOTFS:-$(cat build/runtime-rootfs.path)}
dir=$(mktemp -d /tmp/cpu-per-exec-XXXX)
parent=cpu-per-exec-$$
port=$((20000 + $$ % 20000))
spid=
# The worker's cgroup in each hierarchy (it inherits ours): its cgroup
# parent for the sandboxes, $parent, is made below each.
cgdirs=()
acct=
while IFS=: read -r _ ctrls path; do
	mnt=/sys/fs/cgroup/${ctrls#name=}
	[ -z "$ctrls" ] && mnt=/sys/fs/cgroup/unified
	[ -d "$mnt$path" ] || continue
	cgdirs+=("$mnt${path%/}")
	case ",$ctrls," in *,cpuacct,*) acct="$mnt${path%/}/$parent/cpuacct.usage" ;; esac
done </proc/self/cgroup
perfpid=
cleanup() {
	[ -n "$perfpid" ] && kill -INT "$perfpid" 2>/dev/null && wait "$perfpid" 2>/dev/null || true
	[ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null || true
	# The worker removed what it made below $parent, not $parent itself.
	for d in "${cgdirs[@]}"; do
		[ -d "$d/$parent" ] && rmdir "$d/$parent" 2>/dev/null || true
	done
	rm -rf --one-file-system "$dir"
}
trap cleanup EXIT
env -i PATH="$PATH" EXECUTION_WORKER_HOST=127.0.0.1 EXECUTION_WORKER_PORT=$port \
	EXECUTION_WORK_ROOT="$dir/work" EXECUTION_RESULTS_DIR="$dir/results" EXECUTION_SESSIONS_DIR="$dir/sessions" \
	EXECUTION_STATE_ROOT="$dir/state" EXECUTION_ROOTFS_CACHE="$dir/rc" EXECUTION_PYTHON_IMAGE="dir:$rootfs" \
	EXECUTION_CGROUP_PARENT=$parent EXECUTION_POOL_SIZE=4 EXECUTION_POOL_TEMPLATE_FORKS=$forks \
	EXECUTION_SESSION_SPARE_KERNELS=0 bin/sandboxd serve >"$dir/server.log" 2>&1 &
spid=$!
ready=
for _ in $(seq 1 300); do
	ready=$(curl -s "127.0.0.1:$port/metrics" 2>/dev/null | awk '/^sandboxd_pool_ready /{print $2}') || true
	[ "$ready" = 8 ] && break
	sleep 0.2
done
[ "$ready" = 8 ] || { echo "the pool did not fill (ready: ${ready:-none}); server log:" >&2; tail -5 "$dir/server.log" >&2; exit 1; }
[ -r "$acct" ] || { echo "no cpuacct cgroup for the sandboxes (cgroup v1 only): $acct" >&2; exit 1; }
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
self() { awk '{print $14+$15}' /proc/$spid/stat; }
kids() { awk '{print $16+$17}' /proc/$spid/stat; }
# Built before the window: `go run` there put the bench's compile and link
# (up to a second of CPU, ~10-25 ms per execution) into "in all".
go build -o "$dir/bench-client" ./tools/bench
b0=$(busy) s0=$(self) k0=$(kids) a0=$(cat "$acct")
if [ "$perfopt" = perf ]; then
	perf record -a -g -o "build/cpu-per-exec-$kind.data" >/dev/null 2>&1 &
	perfpid=$!
	sleep 0.5
fi
"$dir/bench-client" -url "http://127.0.0.1:$port" -skip-peers -skip-sessions -workloads "$workload" \
	-concurrency "$conc" -n-print "$n" -n-pandas "$n" -out "$dir/bench" -results "" 2>&1 | grep 'api ' || true
if [ -n "$perfpid" ]; then
	kill -INT "$perfpid"
	wait "$perfpid" 2>/dev/null || true
	perfpid=
fi
b1=$(busy) s1=$(self) k1=$(kids) a1=$(cat "$acct")
execs=$(curl -s "127.0.0.1:$port/metrics" | awk '/^sandboxd_executions_total/{s+=$2} END{print s}')
taken=$(curl -s "127.0.0.1:$port/metrics" | awk '/^sandboxd_pool_taken_total /{print $2}')
hz=$(getconf CLK_TCK)
awk -v k="$kind" -v w="$workload" -v e="$execs" -v t="$taken" -v hz="$hz" \
	-v b=$((b1 - b0)) -v s=$((s1 - s0)) -v c=$((k1 - k0)) -v a=$((a1 - a0)) 'BEGIN {
	ms = 1000 / hz / e
	printf "%s, %s: %d executions (%d from the pool); CPU per execution: %.0f ms in all, worker %.0f, its reaped children %.0f, sandboxes cgroups %.0f\n",
		k, w, e, t, b * ms, s * ms, c * ms, a / 1e6 / e
}'
