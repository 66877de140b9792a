#!/usr/bin/env bash
# Installs the Debian packages a make target needs, so that a fresh Debian 12
# VM with only Go, git and make gets from clone to `make run` / `make test`.
# Usage: tools/deps/install.sh GROUP...   (the Makefile calls it)
#
#   build   cgo with -tags seccomp: libseccomp-dev (headers and libseccomp.a),
#           pkg-config, gcc, libc6-dev; and e2fsprogs (mkfs.ext4, e2fsck for
#           session volumes, server/volume: Debian priority "required", so
#           present, but not Essential)
#   image   the python-runtime image: mmdebstrap (root mode), the Debian
#           archive keyring and CA certificates for the mirror
#   test    busybox-static: the small rootfs of the nsjail/seccomp tests;
#           python3: the Python client's tests (tools/clients/python) and
#           the agent loop example's (tools/examples)
#   v2vm    the cgroup v2 VM harness: qemu-system-x86, cpio, busybox-static;
#           and apt lists that know the kernel package it downloads
#   k8s     the test cluster (tools/deploy/kubernetes/cluster): iproute2
#           (ip netns, veth, bridge), iptables (kube-proxy), util-linux
#           (nsenter, unshare), python3 (the Python client's saturation
#           run); containerd, runc and the CNI plugins are unpacked, not
#           installed (debs.sh)
#
# As root, missing packages are installed with apt-get (after one
# `apt-get update`); otherwise it names the exact command and fails. Nothing
# is done when every package is present (a dpkg-query, a few ms).
set -euo pipefail

declare -A groups=(
	[build]="libseccomp-dev pkg-config gcc libc6-dev e2fsprogs"
	[image]="mmdebstrap debian-archive-keyring ca-certificates"
	[test]="busybox-static python3"
	[v2vm]="qemu-system-x86 cpio busybox-static"
	[k8s]="iproute2 iptables util-linux python3"
)

want=()
for g in "$@"; do
	[ -n "${groups[$g]+x}" ] || { echo "deps: unknown group '$g' (build, image, test, v2vm, k8s)" >&2; exit 2; }
	# shellcheck disable=SC2206
	want+=(${groups[$g]})
done

missing=()
for p in "${want[@]}"; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[ "$status" = "install ok installed" ] || missing+=("$p")
done
# One name once, in a stable order.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk 'NF && !seen[$0]++')

export DEBIAN_FRONTEND=noninteractive
updated=
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "deps: missing Debian packages: ${missing[*]}; run: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
		exit 1
	fi
	echo "deps: installing ${missing[*]}" >&2
	apt-get update -qq
	updated=1
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# v2vm: tools/v2vm/run.sh resolves the kernel package and `apt-get download`s
# it (no install), which needs apt lists that know it. Without them run.sh
# falls back to a cached kernel, so a non-root caller is only told.
if [[ " $* " == *" v2vm "* ]] && [ -z "$updated" ]; then
	kernel=${V2VM_KERNEL:-linux-image-amd64}
	# Not `apt-cache | grep -q`: with pipefail a SIGPIPE'd apt-cache would
	# turn a match into a failure.
	policy=$(apt-cache policy "$kernel" 2>/dev/null || true)
	if [[ $policy != *"Candidate: "[0-9]* ]]; then
		if [ "$(id -u)" = 0 ]; then
			echo "deps: apt lists do not know $kernel (the VM's kernel): apt-get update" >&2
			apt-get update -qq
		else
			echo "deps: apt lists do not know $kernel (the VM's kernel); run: sudo apt-get update" >&2
		fi
	fi
fi
