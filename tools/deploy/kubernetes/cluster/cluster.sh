#!/usr/bin/env bash
# The test cluster of `make test-k8s`: a real Kubernetes (the components of
# `make k8s-components`, etcd, Debian's containerd, runc and CNI plugins,
# the pause image built here) with NODES nodes on this one machine, each a
# network and mount namespace of its own. README.md next to this file says
# why each setting is there; facts established about this kind of machine
# are in its "What this machine needs" section.
#
#   cluster.sh up      bring the cluster up (idempotent only after down)
#   cluster.sh deploy  the worker (the manifests with overlay/), rolled out
#   cluster.sh down    stop everything it started and remove what it made
#   cluster.sh kubectl ARGS...   kubectl against it (the admin kubeconfig)
#   cluster.sh stop-node N       node N fails: its processes and pods killed
#   cluster.sh kill-worker N     SIGKILL node N's worker process
#   cluster.sh exec N CMD...     run CMD in node N's network namespace (nsenter:
#                                the host's /sys, cgroups included, stays visible)
#   cluster.sh state             print the state directory
#
# One cluster per machine (the namespace names are global): up, deploy and
# down take /run/lock/sbxk8s.lock, or refuse (test.sh holds it for a whole
# run and says so in SBXK8S_LOCK_HELD).
#
# What it leaves on the host while up, and removes on down: network
# namespaces sbxk8s-* (the node's interfaces are in them: the host's network
# is not touched), cgroups below the caller's own (kubelet's cgroupRoot),
# processes it started (found again by PID, by the node's mount namespace
# and by those cgroups), and $STATE. The host's sysctls are never written
# (ip_forward is written per network namespace, inside them): what kubelet
# would rewrite is bound read-only with kubelet's values in each node's
# private mount namespace.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
BUILD=${BUILD:-$REPO/build}
K8S=${K8S:-$BUILD/k8s}            # make k8s-components
BIN=$K8S/bin
DEBROOT=$K8S/root                  # containerd, runc, CNI plugins (dpkg-deb -x)
STATE=${STATE:-$K8S/cluster}
NODES=${NODES:-3}
WORKER_OCI=${WORKER_OCI:-$BUILD/sandboxd-worker.oci} # make worker-image
RUNTIME_OCI=${RUNTIME_OCI:-$BUILD/python-runtime.oci}
PAUSE_IMAGE=${PAUSE_IMAGE:-registry.k8s.io/pause:$(cat "$K8S/pause.version" 2>/dev/null)}

# Addresses: the benchmarking range 198.18.0.0/15 (RFC 2544), never routed
# off the machine; the control plane is .1, node N is .(10+N); node N's
# pods are 10.244.N.0/24; Services 10.96.0.0/16.
NET=198.18.0
CP_IP=$NET.1
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
POD_CIDR=10.244.0.0/16
node_ip() { echo "$NET.$((10 + $1))"; }
pod_cidr() { echo "10.244.$1.0/24"; }
NS=sbxk8s # the prefix of every network namespace

log() { printf '%s cluster: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "$*"; exit 1; }

LOCK=/run/lock/sbxk8s.lock
# lock: this machine's one cluster, ours until we exit (fd 9, closed for
# the processes we start, so a leftover cluster does not hold it).
lock() {
	[ -z "${SBXK8S_LOCK_HELD:-}" ] || return 0
	exec 9>"$LOCK"
	flock -n 9 || die "another test cluster is being set up, used or torn down on this machine ($LOCK)"
}

# Process identity: PID and start time (field 22 of /proc/PID/stat), so a
# recorded PID reused by another process after a crash or a reboot is
# never signalled.
ident() { [ -r "/proc/$1/stat" ] && echo "$1 $(awk '{print $22}' "/proc/$1/stat")"; }
alive() { # alive "PID START": that very process still runs
	local pid=${1%% *}
	[ "$(ident "$pid" 2>/dev/null)" = "$1" ]
}

# From the control plane's namespace: the host's own has no route to it.
kubectl_() { nsenter --net=/run/netns/$NS-cp "$BIN/kubectl" --kubeconfig "$STATE/pki/admin.kubeconfig" "$@"; }

# wait_for SECONDS WHAT CMD...: CMD until it succeeds, or fail naming WHAT.
wait_for() {
	local limit=$1 what=$2
	shift 2
	local end=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $end ] || die "timed out after ${limit}s waiting for $what"
		sleep 0.2
	done
}

# --- cgroups ---------------------------------------------------------------
# kubelet (cgroupfs driver) puts each node's pods under its cgroupRoot, the
# same path in every v1 hierarchy. It must be below the cgroup this script
# runs in, in every hierarchy (the machine's rule: never write to a cgroup
# we did not create): the longest of our own paths, when the others are its
# ancestors (as under a container or a systemd unit with one delegated
# controller); otherwise we refuse, naming the paths.
# The hybrid layout's unified line (0::, no controllers) names no v1
# hierarchy and does not choose the path; a v2-only host is not supported
# here yet.
cgroup_base() {
	local longest="" path v1
	v1=$(grep -v '^0::' /proc/self/cgroup || true)
	[ -n "$v1" ] || die "cgroup v2 only: this harness drives kubelet on cgroup v1 (hybrid) so far"
	while IFS=: read -r _ _ path; do
		[ ${#path} -gt ${#longest} ] && longest=$path
	done <<<"$v1"
	# The unified hierarchy too: runc mirrors a container's path there.
	while IFS=: read -r _ ctrls path; do
		case "${longest%/}/" in "${path%/}/"*) ;; *) die "own cgroups are not nested ($ctrls:$path vs $longest): no path is below all of them" ;; esac
	done </proc/self/cgroup
	echo "${longest%/}/sandboxd-k8s"
}

# The hierarchies' mount points: every v1 one, and the hybrid layout's
# unified one, where runc mirrors a container's v1 path.
cgroup_mounts() { awk '$9 == "cgroup" || $9 == "cgroup2" { print $5 }' /proc/self/mountinfo; }

# make_cgroup PATH: PATH in every hierarchy, recording each directory made
# (in order) so down removes exactly those. cpuset needs its cpus and mems
# copied from the parent before anything can join.
make_cgroup() {
	local m dir parts p
	for m in $(cgroup_mounts); do
		dir=$m
		IFS=/ read -ra parts <<<"${1#/}"
		for p in "${parts[@]}"; do
			dir=$dir/$p
			if [ ! -d "$dir" ]; then
				mkdir "$dir"
				echo "$dir" >>"$STATE/cgroups"
				if [ -e "$dir/cpuset.cpus" ]; then
					cat "$(dirname "$dir")/cpuset.cpus" >"$dir/cpuset.cpus"
					cat "$(dirname "$dir")/cpuset.mems" >"$dir/cpuset.mems"
				fi
			fi
		done
	done
}

# kill_tree DIR...: thaw and SIGKILL every process in the cgroups DIR and
# below them (kubelet's pods, their containers, the workers' sandboxes),
# until none is left; then remove the cgroups below DIR, deepest first. A
# frozen task on v1 cannot die: thawed first (../README.md, "A SIGKILLed
# worker on cgroup v1").
kill_tree() {
	local dir f pid left
	for _ in $(seq 50); do
		left=0
		for dir in "$@"; do
			[ -d "$dir" ] || continue
			for f in $(find "$dir" -name freezer.state 2>/dev/null); do
				echo THAWED >"$f" 2>/dev/null || true
			done
			for pid in $(find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null); do
				kill -KILL "$pid" 2>/dev/null && left=1
			done
		done
		[ $left = 0 ] && break
		sleep 0.1
	done
	for dir in "$@"; do
		[ -d "$dir" ] && find "$dir" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
}

# kill_cgroups: kill_tree on our leaf (sandboxd-k8s) in every hierarchy,
# the only cgroups whose name is ours alone; then the directories
# make_cgroup made on the way to it (an ancestor's name, such as the
# caller's own in a hierarchy where the caller is at the root, may be
# shared: removed only when empty, nothing in them ever killed), deepest
# first.
kill_cgroups() {
	[ -s "$STATE/cgroups" ] || return 0
	local m dirs=() root
	root=$(cat "$STATE/cgroot")
	for m in $(cgroup_mounts); do dirs+=("$m$root"); done
	kill_tree "${dirs[@]}"
	tac "$STATE/cgroups" | while read -r dir; do
		[ -d "$dir" ] && { rmdir "$dir" 2>/dev/null || log "cgroup $dir not removed (not empty: someone else's now)"; }
	done
	rm -f "$STATE/cgroups"
}

# --- network ---------------------------------------------------------------
# A switch namespace holding the bridge, and one namespace per machine (the
# control plane, each node) with a veth into it. Routes: every machine
# reaches each node's pod subnet through that node.
make_network() {
	ip netns add $NS-sw
	ip -n $NS-sw link add br0 type bridge
	ip -n $NS-sw link set br0 up
	ip -n $NS-sw link set lo up
	local i name addr
	for i in cp $(seq "$NODES"); do
		if [ "$i" = cp ]; then name=$NS-cp addr=$CP_IP; else name=$NS-n$i addr=$(node_ip "$i"); fi
		ip netns add "$name"
		ip link add "v-$name" netns "$name" type veth peer name "p-$i" netns $NS-sw
		ip -n $NS-sw link set "p-$i" master br0 up
		ip -n "$name" link set lo up
		ip -n "$name" link set "v-$name" name eth0
		ip -n "$name" addr add "$addr/24" dev eth0
		ip -n "$name" link set eth0 up
		# The Services' range needs a route for a local client's packet
		# to reach kube-proxy's DNAT (the route is chosen first).
		ip -n "$name" route add $SERVICE_CIDR dev eth0
		# Per namespace (the host's own value is not touched).
		ip netns exec "$name" sysctl -qw net.ipv4.ip_forward=1
	done
	local j
	for i in cp $(seq "$NODES"); do
		name=$NS-n$i
		[ "$i" = cp ] && name=$NS-cp
		for j in $(seq "$NODES"); do
			[ "$i" = "$j" ] && continue
			ip -n "$name" route add "$(pod_cidr "$j")" via "$(node_ip "$j")"
		done
	done
}

remove_network() {
	local n before
	for n in $(ip netns list | awk '{print $1}' | grep "^$NS-" || true); do
		ip netns del "$n"
	done
	# The first `ip netns add` on a host makes /run/netns a mount point (a
	# shared bind of itself): left as it was found (net_state), unless
	# someone else's namespaces are in it by now.
	before=$(cat "$STATE/run-netns" 2>/dev/null || echo mounted)
	if [ "$before" != mounted ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
		while mountpoint -q /run/netns; do umount /run/netns; done
		[ "$before" = dir ] || rmdir /run/netns
	fi
}

# net_state: what /run/netns was before the cluster (remove_network).
net_state() {
	if mountpoint -q /run/netns; then echo mounted; elif [ -d /run/netns ]; then echo dir; else echo none; fi
}

# --- processes -------------------------------------------------------------
# Processes enter a namespace with nsenter, not `ip netns exec`: that one
# mounts a new /sys for the namespace, without /sys/fs/cgroup below it.
#
# start NAME NETNS CMD...: CMD in the background in NETNS, its own session,
# output to $STATE/log/NAME.log, its identity in $STATE/pids/NAME.
start() {
	local name=$1 netns=$2
	shift 2
	setsid nsenter --net="/run/netns/$netns" "$@" >"$STATE/log/$name.log" 2>&1 </dev/null 9>&- &
	ident $! >"$STATE/pids/$name"
}

# stop_pid FILE: TERM, then KILL after 10 s, the process named in FILE, if
# it is still that process.
stop_pid() {
	local f=$1 id pid
	[ -f "$f" ] || return 0
	id=$(cat "$f") pid=${id%% *}
	if alive "$id" && kill -TERM "$pid" 2>/dev/null; then
		for _ in $(seq 100); do alive "$id" || break; sleep 0.1; done
		alive "$id" && kill -KILL "$pid" 2>/dev/null
	fi
	rm -f "$f"
}

# kill_mntns PIN: SIGKILL every process in the mount namespace PIN holds
# (a node's: its containerd, shims, kubelet and kube-proxy; the containers
# have namespaces of their own and are in the node's cgroups instead). PIN
# is a bind mount of the namespace made when the node started: while it is
# mounted the namespace lives, so its inode cannot name another; a PIN that
# is not mounted (a reboot since) names nothing, and nothing is killed.
kill_mntns() {
	local pin=$1 ns p
	[ "$(stat -f -c %T "$pin" 2>/dev/null)" = nsfs ] || { log "$pin pins no namespace: nothing to kill there"; return 0; }
	ns=$(stat -L -c %i "$pin")
	for _ in $(seq 50); do
		local found=0
		for p in /proc/[0-9]*; do
			[ "$(stat -L -c %i "$p/ns/mnt" 2>/dev/null)" = "$ns" ] || continue
			kill -KILL "${p#/proc/}" 2>/dev/null && found=1
		done
		[ $found = 0 ] && return 0
		sleep 0.1
	done
	log "processes of mount namespace $ns survived SIGKILL"
}

# --- the control plane -----------------------------------------------------
control_plane() {
	local p=$STATE/pki
	start etcd $NS-cp "$BIN/etcd" --name cp --data-dir "$STATE/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster cp=http://127.0.0.1:2380 --log-level warn
	start kube-apiserver $NS-cp "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
		--bind-address "$CP_IP" --advertise-address "$CP_IP" --secure-port 6443 \
		--service-cluster-ip-range $SERVICE_CIDR \
		--client-ca-file "$p/ca.crt" --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
		--kubelet-client-certificate "$p/apiserver-kubelet-client.crt" --kubelet-client-key "$p/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types InternalIP,Hostname \
		--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$p/sa.pub" \
		--service-account-signing-key-file "$p/sa.key" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --allow-privileged=true
	wait_for 90 "kube-apiserver /readyz" kubectl_ get --raw /readyz
	start kube-controller-manager $NS-cp "$BIN/kube-controller-manager" --kubeconfig "$p/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$p/controller-manager.kubeconfig" --authorization-kubeconfig "$p/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
		--service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
		--cluster-cidr $POD_CIDR --allocate-node-cidrs=false --node-monitor-grace-period 20s
	start kube-scheduler $NS-cp "$BIN/kube-scheduler" --kubeconfig "$p/scheduler.kubeconfig" \
		--authentication-kubeconfig "$p/scheduler.kubeconfig" --authorization-kubeconfig "$p/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false
}

# --- a node ----------------------------------------------------------------
# node_configs N: containerd's, CNI's, kubelet's and kube-proxy's files.
node_configs() {
	local n=$1 d=$STATE/n$1 cgroot=$2
	mkdir -p "$d/cni" "$d/var-lib" "$d/var-log" "$d/run" "$d/sysctl"
	cat >"$d/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This VM's bounding set lacks CAP_SYS_RESOURCE: runc cannot lower
  # oom_score_adj, and every pod sandbox would fail (README.md).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$DEBROOT/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$DEBROOT/usr/lib/cni"
    conf_dir = "$d/cni"
EOF
	cat >"$d/cni/10-sbxk8s.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "sbxk8s", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$(pod_cidr "$n")"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
	cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$n")
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: $cgroot
# This VM has cgroup v1 (README.md).
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
resolvConf: /etc/resolv.conf
podCIDR: $(pod_cidr "$n")
maxPods: 30
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The nodes share one disk with everything else on the machine: no eviction
# for its fill level, which is not theirs.
evictionHard: {memory.available: "100Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
nodeStatusReportFrequency: 10s
EOF
	cat >"$d/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/pki/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: n$n
bindAddress: $(node_ip "$n")
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Global sysctls (nf_conntrack_max, the conntrack hash size): left alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
	# The values kubelet's setupKernelTunables wants; bound read-only over
	# /proc/sys in the node's mount namespace, kubelet reads them and
	# writes nothing (the host's are not touched).
	printf '1\n' >"$d/sysctl/vm.overcommit_memory"
	printf '0\n' >"$d/sysctl/vm.panic_on_oom"
	printf '10\n' >"$d/sysctl/kernel.panic"
	printf '1\n' >"$d/sysctl/kernel.panic_on_oops"
	printf '1000000\n' >"$d/sysctl/kernel.keys.root_maxkeys"
	printf '25000000\n' >"$d/sysctl/kernel.keys.root_maxbytes"
}

# node N (run by `up` in node N's network namespace and a private mount
# namespace): the binds, then containerd, the images, kubelet, kube-proxy.
node() {
	local n=$1 d=$STATE/n$1
	# kubelet, CNI and containerd write to fixed paths below /var/lib,
	# /var/log and /run: each node gets its own.
	mount --bind "$d/var-lib" /var/lib
	mount --bind "$d/var-log" /var/log
	mount --bind "$d/run" /run
	local f
	for f in "$d"/sysctl/*; do
		local target=/proc/sys/$(basename "$f" | tr . /)
		mount --bind "$f" "$target"
		mount -o remount,bind,ro "$target"
	done
	# The hostPath the DaemonSet reads the runtime image from.
	mkdir -p /var/lib/sandboxd/images/python-runtime.oci
	mount --bind "$RUNTIME_OCI" /var/lib/sandboxd/images/python-runtime.oci
	mount -o remount,bind,ro /var/lib/sandboxd/images/python-runtime.oci
	export PATH=$DEBROOT/usr/bin:$DEBROOT/usr/sbin:$PATH
	containerd --config "$d/containerd.toml" >"$d/containerd.log" 2>&1 &
	local end=$((SECONDS + 30))
	until ctr -a /run/containerd/containerd.sock version >/dev/null 2>&1; do
		[ $SECONDS -lt $end ] || die "node $n: containerd did not start (see $d/containerd.log)"
		sleep 0.1
	done
	ctr -a /run/containerd/containerd.sock -n k8s.io images import "$K8S/pause.tar" >/dev/null
	# Named by its digest (--digests): the DaemonSet pins the image by
	# digest, as in production, and the kubelet finds it without a
	# registry (imagePullPolicy Never in the overlay).
	ctr -a /run/containerd/containerd.sock -n k8s.io images import --digests \
		--base-name docker.io/library/sandboxd-worker "$STATE/worker.tar" >/dev/null
	"$BIN/kubelet" --config "$d/kubelet.yaml" --kubeconfig "$STATE/pki/kubelet-n$n.kubeconfig" \
		--hostname-override "n$n" --node-ip "$(node_ip "$n")" \
		--node-labels sandboxd.io/worker=true --register-with-taints sandboxd.io/worker=true:NoSchedule \
		>"$d/kubelet.log" 2>&1 &
	"$BIN/kube-proxy" --config "$d/kube-proxy.yaml" >"$d/kube-proxy.log" 2>&1 &
	wait
}

start_node() {
	local n=$1
	node_configs "$n" "$CGROOT/n$n"
	make_cgroup "$CGROOT/n$n"
	setsid nsenter --net="/run/netns/$NS-n$n" unshare -m --propagation private -- "$0" node "$n" \
		>"$STATE/log/node-n$n.log" 2>&1 </dev/null 9>&- &
	local pid=$! end=$((SECONDS + 10))
	ident $pid >"$STATE/pids/node-n$n"
	until [ "$(stat -L -c %i "/proc/$pid/ns/mnt" 2>/dev/null)" != "$(stat -L -c %i /proc/self/ns/mnt)" ]; do
		[ $SECONDS -lt $end ] || die "node $n did not start (see $STATE/log/node-n$n.log)"
		sleep 0.05
	done
	# Pinned (kill_mntns): the node's processes are found by it later.
	touch "$STATE/n$n/mntns"
	mount --bind "/proc/$pid/ns/mnt" "$STATE/n$n/mntns"
}

# stop_node N: the node's processes, then its pods (they keep running
# without their shims), its cgroups stay for kill_cgroups.
stop_node() {
	local n=$1 d=$STATE/n$1
	if [ -e "$d/mntns" ]; then
		kill_mntns "$d/mntns"
		umount "$d/mntns" 2>/dev/null || true
	fi
	# A node whose namespace was never pinned: its script, if it is still
	# that process (it started nothing else yet).
	stop_pid "$STATE/pids/node-n$n"
	rm -f "$d/mntns"
}

# stop-node N: node N gone, as a machine that fails: its processes, then
# everything in its cgroups (its pods keep running without their shims).
stop_node_all() {
	local n=$1 m dirs=()
	stop_node "$n"
	for m in $(cgroup_mounts); do dirs+=("$m$(cat "$STATE/cgroot")/n$n"); done
	kill_tree "${dirs[@]}"
}

# kill-worker N: SIGKILL node N's worker process (as the OOM killer would),
# not its container's pid 1 when that is sandboxd's supervisor: the
# supervisor thaws and kills what serve left, and the kubelet restarts
# the container.
kill_worker() {
	local n=$1 sock=$STATE/n$1/run/containerd/containerd.sock ctr=$DEBROOT/usr/bin/ctr id pid= child
	# The running one: a restarted container's predecessors stay listed.
	for id in $("$ctr" -a "$sock" -n k8s.io containers ls -q 'labels."io.kubernetes.container.name"==sandboxd'); do
		pid=$("$ctr" -a "$sock" -n k8s.io tasks ls | awk -v id="$id" '$1 == id && $3 == "RUNNING" {print $2}')
		[ -z "$pid" ] || break
	done
	[ -n "$pid" ] || die "node $n: no running sandboxd container"
	local cmdline
	cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline")
	if [[ $cmdline == *" supervise "* ]]; then
		# Its child serve: listed under whichever of its threads forked it.
		child=
		for c in $(cat /proc/"$pid"/task/*/children); do
			[[ $(tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null) == *" serve "* ]] && child=$c
		done
		[ -n "$child" ] || die "node $n: the supervisor $pid has no serve child"
		pid=$child
	fi
	kill -KILL "$pid"
	log "node $n: worker pid $pid killed"
}

# --- up / down -------------------------------------------------------------
up() {
	[ "$(id -u)" = 0 ] || die "needs root"
	[ ! -e "$STATE" ] || die "$STATE exists: run '$0 down' first"
	local f
	for f in "$BIN/kube-apiserver" "$BIN/kubelet" "$BIN/etcd" "$K8S/pause.tar" "$DEBROOT/usr/bin/containerd" "$DEBROOT/usr/sbin/runc" "$DEBROOT/usr/lib/cni/bridge"; do
		[ -e "$f" ] || die "missing $f: make k8s-components"
	done
	[ -f "$WORKER_OCI/index.json" ] || die "missing $WORKER_OCI: make worker-image"
	[ -f "$RUNTIME_OCI/index.json" ] || die "missing $RUNTIME_OCI: make runtime-image"
	mkdir -p "$STATE/log" "$STATE/pids"
	tar -C "$WORKER_OCI" -cf "$STATE/worker.tar" .
	CGROOT=$(cgroup_base)
	echo "$CGROOT" >"$STATE/cgroot"
	local t0=$SECONDS
	log "pki"
	go run "$REPO/tools/deploy/kubernetes/cluster/pki" -out "$STATE/pki" -server "https://$CP_IP:6443" \
		-sans "$CP_IP,$API_SERVICE_IP,kubernetes,kubernetes.default,kubernetes.default.svc,kubernetes.default.svc.cluster.local" \
		-nodes "$(seq -s, -f 'n%g' "$NODES")"
	log "network"
	net_state >"$STATE/run-netns"
	make_network
	log "control plane"
	control_plane
	local n
	for n in $(seq "$NODES"); do
		log "node n$n"
		start_node "$n"
	done
	wait_for 120 "$NODES nodes Ready" nodes_ready "$NODES"
	log "up in $((SECONDS - t0)) s"
}

# deploy: the manifests (the overlay next to this file over the shipped
# base), the token Secret, and the rollout awaited. The token is kept in
# $STATE/token for the tests.
deploy() {
	local digest base=$(cd "$HERE/.." && pwd)
	digest=$(grep -o '"digest": *"sha256:[0-9a-f]*"' "$WORKER_OCI/index.json" | head -1 | grep -o 'sha256:[0-9a-f]*')
	[ -n "$digest" ] || die "no manifest digest in $WORKER_OCI/index.json"
	rm -rf "$STATE/overlay"
	cp -r "$HERE/overlay" "$STATE/overlay"
	# kustomize takes a base only by a relative path.
	sed -i "s|@BASE@|$(realpath --relative-to="$STATE/overlay" "$base")|; s|@DIGEST@|$digest|" "$STATE/overlay/kustomization.yaml"
	kubectl_ apply -f "$base/namespace.yaml" >/dev/null
	if ! kubectl_ -n sandboxd get secret sandboxd-token >/dev/null 2>&1; then
		head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STATE/token"
		kubectl_ -n sandboxd create secret generic sandboxd-token --from-file=token="$STATE/token" >/dev/null
	fi
	local t0=$SECONDS
	kubectl_ apply -k "$STATE/overlay"
	# rollout status alone can answer before the DaemonSet has counted its
	# nodes (0 of 0 rolled out): every node's worker available, awaited.
	kubectl_ -n sandboxd rollout status ds/sandboxd --timeout 300s >/dev/null
	wait_for 300 "$NODES workers available" workers_available
	log "deployed $digest in $((SECONDS - t0)) s"
}

workers_available() {
	[ "$(kubectl_ -n sandboxd get ds sandboxd -o jsonpath='{.status.numberAvailable}')" = "$NODES" ]
}

nodes_ready() {
	[ "$(kubectl_ get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)" -ge "$1" ]
}

down() {
	[ -d "$STATE" ] || return 0
	local d
	for d in "$STATE"/n[0-9]*; do
		[ -d "$d" ] && stop_node "${d##*/n}"
	done
	kill_cgroups
	local f
	for f in kube-scheduler kube-controller-manager kube-apiserver etcd; do
		stop_pid "$STATE/pids/$f"
	done
	remove_network
	# Loop devices of the workers' session volumes under $STATE: detached
	# with their last mount (autoclear); any left are ours to detach.
	losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v s="$STATE/" 'index($2, s) == 1 {print $1}' | while read -r dev; do
		losetup -d "$dev" || true
	done
	rm -rf "$STATE"
	log "down"
}

case "${1:-}" in
up) lock; up ;;
deploy) lock; deploy ;;
down) lock; down ;;
state) echo "$STATE" ;;
node) node "$2" ;;
kubectl) shift; kubectl_ "$@" ;;
stop-node) stop_node_all "$2" ;;
kill-worker) kill_worker "$2" ;;
exec) n=$2; shift 2; exec nsenter --net="/run/netns/$NS-n$n" "$@" ;;
*) echo "usage: $0 up | deploy | down | state | kubectl ARGS... | stop-node N | kill-worker N | exec N CMD..." >&2; exit 2 ;;
esac
