#!/usr/bin/env bash
# Builds the python-runtime root filesystem from Debian trixie packages with
# mmdebstrap (no Docker), then hands it to main.go, which writes the OCI layout
# and the docker-archive. Usage (from the repo root, as root):
#
#   tools/runtime-image/build.sh [BUILD_DIR]      # default: build
#
# Reproducible for a given mirror state: SOURCE_DATE_EPOCH defaults to the time
# of the last commit touching this directory, and every timestamp in the image
# is clamped to it.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${1:-build}
work=$PWD/$build/runtime-image.work
case $build in /*) work=$build/runtime-image.work ;; esac
suite=${RUNTIME_IMAGE_SUITE:-trixie}
mirror=${RUNTIME_IMAGE_MIRROR:-http://deb.debian.org/debian}
security=${RUNTIME_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct -- tools/runtime-image ':!tools/runtime-image/*.md' 2>/dev/null || true)
	SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1767225600} # 2026-01-01, outside git
fi
export SOURCE_DATE_EPOCH

if [ "$(id -u)" != 0 ]; then
	echo "build.sh: mmdebstrap --mode=root needs root" >&2
	exit 1
fi

# The packages the Agent's code may import; their versions become image labels.
packages=(python3 python3-pandas python3-numpy python3-scipy python3-sklearn
	python3-matplotlib python3-openpyxl python3-seaborn python3-statsmodels)

rm -rf "$work"
mkdir -p "$work"
# A go.mod makes build/ a module of its own, which keeps `go test ./...` and
# `go vet ./...` from walking the rootfs trees (and the /proc mounted in one
# during the build).
[ -e "$build/go.mod" ] || printf 'module sandboxd.invalid/build-output\n' >"$build/go.mod"
start=$(date +%s)

# --variant=essential: Essential:yes packages plus our list and its Depends; no
# apt, no Recommends. Docs, man pages, info and translations are never
# unpacked (dpkg path-exclude), except copyright files.
mmdebstrap \
	--mode=root --format=directory --variant=essential \
	--keyring=/usr/share/keyrings \
	--aptopt='APT::Install-Recommends "false"' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/lintian/*' \
	--dpkgopt='path-exclude=/usr/share/bug/*' \
	--include="$(IFS=,; echo "${packages[*]}")" \
	--customize-hook="$PWD/tools/runtime-image/customize.sh \"\$1\" \"$work\"" \
	"$suite" "$work/rootfs" \
	"deb $mirror $suite main" \
	"deb $mirror $suite-updates main" \
	"deb $security $suite-security main"

echo "mmdebstrap: $(( $(date +%s) - start ))s" >&2
CGO_ENABLED=0 go run ./tools/runtime-image \
	-rootfs "$work/rootfs" \
	-packages "$work/packages.txt" \
	-label-packages "$(IFS=,; echo "${packages[*]}")" \
	-epoch "$SOURCE_DATE_EPOCH" \
	-oci "$build/python-runtime.oci" \
	-archive "$build/python-runtime.tar" \
	-tag python-runtime:latest
rm -rf "$work"
echo "runtime image: $(( $(date +%s) - start ))s total" >&2
