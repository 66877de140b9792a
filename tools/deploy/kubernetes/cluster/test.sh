#!/usr/bin/env bash
# make test-k8s: the cluster up (cluster.sh), the worker deployed, the e2e
# steps run against it from node 1's network namespace, everything torn
# down, and the host's sysctls, network and cgroups outside our own
# compared with what they were before. Measurements go to
# $K8S/measurements.txt (and the log).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
cluster=$HERE/cluster.sh
STATE=$("$cluster" state)
K8S=$(dirname "$STATE")

# One cluster per machine: held for the whole run (cluster.sh's own calls
# are told so); the processes of the cluster never inherit it.
exec 9>/run/lock/sbxk8s.lock
flock -n 9 || { echo "test-k8s: another test cluster runs on this machine (/run/lock/sbxk8s.lock)" >&2; exit 1; }
export SBXK8S_LOCK_HELD=1

# The host as the cluster must leave it: values, not counters.
volatile='^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|kernel\.(random\.|ns_last_pid|pty\.nr|sched_domain)|net\.netfilter\.nf_conntrack_count|vm\.(stat|nr_)|dev\.cdrom)'
snapshot() {
	{
		echo "## sysctl"
		sysctl -a 2>/dev/null | grep -Ev "$volatile" | sort
		echo "## links"
		ip -o link show | awk '{print $2}' | sort
		echo "## addresses"
		ip -o addr show | awk '{print $2, $4}' | sort
		echo "## routes"
		ip route show table all | sort
		echo "## iptables"
		iptables-save 2>/dev/null | grep -Ev '^#|^:' | sort
		echo "## netns"
		ip netns list | sort
		echo "## loop devices"
		losetup -l -n -O NAME,BACK-FILE 2>/dev/null | sort
		echo "## mounts the cluster's programs would make"
		awk '{print $5}' /proc/self/mountinfo | { grep -E 'kube|sandboxd|k8s|containerd|netns|cni' || true; } | sort
		echo "## modules"
		awk '{print $1}' /proc/modules 2>/dev/null | sort
		echo "## cgroups"
		# The cgroups the cluster's programs would name (cluster.sh's
		# sandboxd-k8s, kubelet's, containerd's and runc's, the
		# workers'), in every hierarchy: others come and go with the
		# machine's own services.
		find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null |
			{ grep -E 'kube|pod[0-9a-f_-]{30,}|sandboxd|k8s|containerd|cri-' || true; } | sort
	}
}

# A snapshot that cannot be taken fails the run, saying so.
before=$(mktemp) after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
"$cluster" down # a run killed before its teardown
snapshot >"$before" || { echo "test-k8s: the host's snapshot failed" >&2; exit 1; }

status=0
(
	trap '"$cluster" down' EXIT
	t0=$SECONDS
	"$cluster" up
	echo "MEASURE cluster_up_s $((SECONDS - t0))" | tee "$K8S/measurements.txt"
	t1=$SECONDS
	"$cluster" deploy
	echo "MEASURE deploy_s $((SECONDS - t1)) (3 workers ready, each unpacking the runtime image)" | tee -a "$K8S/measurements.txt"
	cd "$REPO"
	go test -c -o "$STATE/e2e.test" ./tools/deploy/kubernetes/cluster/e2e
	cd "$REPO/tools/deploy/kubernetes/cluster/e2e"
	failed=
	"$cluster" exec 1 env SANDBOXD_TEST_K8S="$STATE" SANDBOXD_TEST_K8S_BIN="$K8S/bin" \
		"$STATE/e2e.test" -test.v -test.timeout 15m 2>&1 | tee "$K8S/e2e.log" || failed=1
	grep '^MEASURE' "$K8S/e2e.log" >>"$K8S/measurements.txt" || true
	[ -z "$failed" ] || exit 1
	t2=$SECONDS
	"$cluster" down
	echo "MEASURE teardown_s $((SECONDS - t2))" | tee -a "$K8S/measurements.txt"
) || status=$?

snapshot >"$after" || { echo "test-k8s: the host's snapshot failed" >&2; exit 1; }
if ! diff -u "$before" "$after"; then
	echo "test-k8s: the host differs from before the cluster (above)" >&2
	status=1
fi
[ $status = 0 ] && echo "test-k8s: passed" || echo "test-k8s: FAILED" >&2
exit $status
