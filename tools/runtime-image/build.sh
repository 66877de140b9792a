#!/usr/bin/env bash
# Builds the python-runtime root filesystem from Debian packages (trixie by
# default) with mmdebstrap (no Docker), then hands it to main.go, which writes
# the OCI layout and the docker-archive. Usage (from the repo root, as root):
#
#   tools/runtime-image/build.sh [BUILD_DIR]      # default: build
#
# Environment:
#   RUNTIME_IMAGE_VARIANT   default | tests (default: default). "tests" is the
#                           same package set plus python3-pytest and
#                           python3-hypothesis, with the libraries' own test
#                           suites kept: what `make upstream-tests` runs.
#   RUNTIME_IMAGE_SNAPSHOT  DIR of an earlier build's package snapshot (the
#                           apt lists it resolved against and its packages.txt):
#                           apt is not updated, the same lists are used and every
#                           package is pinned to the version recorded there, so
#                           this build installs exactly that package set (or
#                           fails). Without it the mirror's current lists are
#                           used and saved to BUILD_DIR/NAME.snapshot.
#   RUNTIME_IMAGE_DEB_CACHE downloaded .debs kept between builds (default
#                           BUILD_DIR/apt-archives; apt checks each against the lists).
#   RUNTIME_IMAGE_SUITE     trixie (the default) or forky: forky adds
#                           python3-pyarrow, tzdata and tzdata-legacy (the
#                           legacy zone names), checked at build time. Not the
#                           default yet: see README.md, "The forky option".
#                           Any other suite gets trixie's package list.
#   RUNTIME_IMAGE_MIRROR, RUNTIME_IMAGE_SECURITY_MIRROR
#   RUNTIME_IMAGE_CHECK_VALID_UNTIL  default true. false accepts Release files
#                           past their Valid-Until date (still signature-checked):
#                           needed for a frozen mirror or snapshot, and it gives
#                           up apt's defence against a mirror (or MITM) replaying
#                           old, validly signed lists, so it is never the default.
#   SOURCE_DATE_EPOCH       default: the one in ./source-date-epoch.
#
# Reproducible for a given package set: every timestamp in the image is
# clamped to SOURCE_DATE_EPOCH (tools/runtime-image/repro.sh checks it).
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${1:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
variant=${RUNTIME_IMAGE_VARIANT:-default}
suite=${RUNTIME_IMAGE_SUITE:-trixie}
mirror=${RUNTIME_IMAGE_MIRROR:-http://deb.debian.org/debian}
security=${RUNTIME_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
snapshot_in=${RUNTIME_IMAGE_SNAPSHOT:-}
check_valid_until=${RUNTIME_IMAGE_CHECK_VALID_UNTIL:-true}
case $check_valid_until in true | false) ;; *)
	echo "build.sh: RUNTIME_IMAGE_CHECK_VALID_UNTIL must be true or false" >&2
	exit 2
	;;
esac

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(sed -n '/^[0-9][0-9]*$/p' tools/runtime-image/source-date-epoch)
fi
case $SOURCE_DATE_EPOCH in '' | *[!0-9]*)
	echo "build.sh: SOURCE_DATE_EPOCH must be seconds since 1970, got '$SOURCE_DATE_EPOCH'" >&2
	exit 2
	;;
esac
export SOURCE_DATE_EPOCH

if [ "$(id -u)" != 0 ]; then
	echo "build.sh: mmdebstrap --mode=root needs root" >&2
	exit 1
fi

# The packages the Agent's code may import; their versions become one image
# label each. trixie has no python3-pyarrow; forky has, and its tzdata no
# longer pulls the legacy zone names (US/Pacific and the like) in.
packages=(python3 python3-pandas python3-numpy python3-scipy python3-sklearn
	python3-matplotlib python3-openpyxl python3-seaborn python3-statsmodels)
case $suite in
forky) packages+=(python3-pyarrow tzdata tzdata-legacy) ;;
esac
case $variant in
default) name=python-runtime ;;
tests)
	name=python-runtime-tests
	packages+=(python3-pytest python3-hypothesis)
	;;
*)
	echo "build.sh: unknown RUNTIME_IMAGE_VARIANT '$variant' (default, tests)" >&2
	exit 2
	;;
esac

work=$build/$name.work
snapshot_out=$build/$name.snapshot
# Downloaded .debs, shared by builds and variants: a rebuild from one
# snapshot downloads nothing.
debcache=${RUNTIME_IMAGE_DEB_CACHE:-$build/apt-archives}
rm -rf "$work"
mkdir -p "$work/lists" "$debcache"
# (Paths in mmdebstrap's special hooks, sync-in and the like, are split on
# white space: the build dir must not contain any.)
# A go.mod makes build/ a module of its own, which keeps `go test ./...` and
# `go vet ./...` from walking the rootfs trees (and the /proc mounted in one
# during the build).
[ -e "$build/go.mod" ] || printf 'module sandboxd.invalid/build-output\n' >"$build/go.mod"
start=$(date +%s)
stage() { echo "runtime-image: $* ($(($(date +%s) - start))s)" >&2; }

# mmdebstrap writes every --aptopt into the image's
# /etc/apt/apt.conf.d/99mmdebstrap: the Valid-Until override is passed only
# when asked for and taken out again, so the image is the same either way.
valid_until_opts=()
if [ "$check_valid_until" = false ]; then
	valid_until_opts=(--aptopt='Acquire::Check-Valid-Until "false"'
		--customize-hook='sed -i "/^Acquire::Check-Valid-Until /d" "$1/etc/apt/apt.conf.d/99mmdebstrap"')
fi

snapshot_opts=()
if [ -n "$snapshot_in" ]; then
	# Same lists, no apt update, every package pinned to the version the
	# snapshot's build installed (priority > 1000 also allows downgrades, so
	# a pin is never silently lost to a newer candidate).
	[ -d "$snapshot_in/lists" ] && [ -s "$snapshot_in/packages.txt" ] || {
		echo "build.sh: $snapshot_in is not a snapshot (lists/ and packages.txt)" >&2
		exit 2
	}
	snapshot_in=$(cd "$snapshot_in" && pwd)
	awk -F'\t' '{printf "Package: %s\nPin: version %s\nPin-Priority: 1001\n\n", $1, $2}' \
		"$snapshot_in/packages.txt" >"$work/pins.pref"
	snapshot_opts=(--skip=update
		--setup-hook="sync-in $snapshot_in/lists /var/lib/apt/lists"
		--setup-hook="copy-in $work/pins.pref /etc/apt/preferences.d"
		--customize-hook="rm -f \"\$1/etc/apt/preferences.d/pins.pref\"")
	stage "package snapshot $snapshot_in ($(wc -l <"$snapshot_in/packages.txt") pinned versions)"
fi

stage "mmdebstrap $suite ($variant): ${packages[*]}"
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
	--skip=essential/unlink \
	--setup-hook="mkdir -p \"\$1/var/cache/apt/archives\"" \
	--setup-hook="sync-in $debcache /var/cache/apt/archives" \
	"${snapshot_opts[@]}" \
	"${valid_until_opts[@]}" \
	--customize-hook="sync-out /var/cache/apt/archives $debcache" \
	--customize-hook="sync-out /var/lib/apt/lists $work/lists" \
	--customize-hook="$PWD/tools/runtime-image/customize.sh \"\$1\" \"$work\" $variant" \
	"$suite" "$work/rootfs" \
	"deb $mirror $suite main" \
	"deb $mirror $suite-updates main" \
	"deb $security $suite-security main"
stage "mmdebstrap done: $(wc -l <"$work/packages.txt") packages"

if [ -n "$snapshot_in" ]; then
	# The same variant installs exactly the snapshot's set; another variant
	# (tests on the default's snapshot) the same versions of every package
	# both have, plus its own.
	if [ "$(cat "$snapshot_in/variant" 2>/dev/null)" = "$variant" ]; then
		differ=$(diff "$snapshot_in/packages.txt" "$work/packages.txt" || true)
	else
		differ=$(join -t "$(printf '\t')" "$snapshot_in/packages.txt" "$work/packages.txt" | awk -F'\t' '$2 != $3')
	fi
	if [ -n "$differ" ]; then
		echo "build.sh: installed versions differ from the snapshot's:" >&2
		echo "$differ" >&2
		exit 1
	fi
fi

CGO_ENABLED=0 go run ./tools/runtime-image \
	-rootfs "$work/rootfs" \
	-packages "$work/packages.txt" \
	-label-packages "$(IFS=,; echo "${packages[*]}")" \
	-epoch "$SOURCE_DATE_EPOCH" \
	-suite "$suite" \
	-title "$name" \
	-oci "$build/$name.oci" \
	-archive "$build/$name.tar" \
	-tag "$name:latest"

# The package snapshot of this build: the lists apt resolved against and the
# versions it installed. Another build with RUNTIME_IMAGE_SNAPSHOT set to it
# installs the same set.
if [ -z "$snapshot_in" ]; then
	rm -rf "$snapshot_out.tmp"
	mkdir -p "$snapshot_out.tmp"
	mv "$work/lists" "$snapshot_out.tmp/lists"
	rm -rf "$snapshot_out.tmp/lists/partial" "$snapshot_out.tmp/lists/lock"
	cp "$work/packages.txt" "$snapshot_out.tmp/packages.txt"
	echo "$variant" >"$snapshot_out.tmp/variant"
	rm -rf "$snapshot_out"
	mv "$snapshot_out.tmp" "$snapshot_out"
fi
rm -rf "$work"
stage "done: $build/$name.oci, $build/$name.tar"
