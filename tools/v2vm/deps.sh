#!/usr/bin/env bash
# Installs what `make test-v2vm` needs on a Debian 12 (bookworm) host, with apt.
# The harness itself installs nothing: it only downloads (apt-get download,
# no install) the kernel package into build/v2vm/, which needs the apt lists.
#   qemu-system-x86  qemu-system-x86_64 (TCG, or KVM where it works)
#   busybox-static   /bin/busybox for the initramfs and the tests' rootfs
#   libseccomp-dev   libseccomp.a for the static test binaries
#   cpio             packs the initramfs
#   gcc, make        cgo and the Makefile
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(qemu-system-x86 busybox-static libseccomp-dev cpio gcc make)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
updated=
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  updated=1
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The harness resolves and downloads linux-image-amd64's kernel package.
if [ -z "$updated" ] && ! apt-cache policy linux-image-amd64 | grep -q 'Candidate: [0-9]'; then
  apt-get update -qq
fi
