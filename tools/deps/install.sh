#!/usr/bin/env bash
# Installs the Debian packages a make target needs, so that a fresh Debian 12
# VM with only Go, git and make gets from clone to `make run` / `make test`.
# Usage: tools/deps/install.sh GROUP...   (the Makefile calls it)
#
#   build   cgo with -tags seccomp: libseccomp-dev (headers and libseccomp.a),
#           pkg-config, gcc, libc6-dev
#   image   the python-runtime image: mmdebstrap (root mode), the Debian
#           archive keyring and CA certificates for the mirror
#   test    busybox-static: the small rootfs of the nsjail/seccomp tests
#   v2vm    the cgroup v2 VM harness: qemu-system-x86, cpio, busybox-static
#
# As root, missing packages are installed with apt-get (after one
# `apt-get update`); otherwise it names the exact command and fails. Nothing
# is done when every package is present (a dpkg-query, a few ms).
set -euo pipefail

declare -A groups=(
	[build]="libseccomp-dev pkg-config gcc libc6-dev"
	[image]="mmdebstrap debian-archive-keyring ca-certificates"
	[test]="busybox-static"
	[v2vm]="qemu-system-x86 cpio busybox-static"
)

want=()
for g in "$@"; do
	[ -n "${groups[$g]+x}" ] || { echo "deps: unknown group '$g' (build, image, test, v2vm)" >&2; exit 2; }
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
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
	echo "deps: missing Debian packages: ${missing[*]}; run: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
