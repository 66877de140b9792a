#!/usr/bin/env bash
# Builds the python-runtime root filesystem from Debian packages (forky by
# default) with mmdebstrap (no Docker), then hands it to main.go, which writes
# the OCI layout and the docker-archive. Usage (from the repo root, as root):
#
#   tools/runtime-image/build.sh [BUILD_DIR]      # default: build
#
# Environment:
#   RUNTIME_IMAGE_VARIANT   default | geo | tests (default: default).
#                           "geo" (python-runtime-geo) is the default package
#                           set plus geopandas, shapely, pyproj and pyogrio
#                           (GDAL) with proj-data. "tests" is the default set
#                           plus python3-pytest and python3-hypothesis, with
#                           the libraries' own test suites kept: what `make
#                           upstream-tests` runs.
#   RUNTIME_IMAGE_SNAPSHOT  DIR of an earlier build's package snapshot (the
#                           apt lists it resolved against and its packages.txt):
#                           apt is not updated, the same lists are used and every
#                           package is pinned to the version recorded there, so
#                           this build installs exactly that package set (or
#                           fails). Without it the mirror's current lists are
#                           used and saved to BUILD_DIR/NAME.snapshot.
#   RUNTIME_IMAGE_DEB_CACHE downloaded .debs kept between builds (default
#                           BUILD_DIR/apt-archives; apt checks each against the lists).
#   RUNTIME_IMAGE_SUITE     forky (the default: Debian testing) or trixie.
#                           Every suite gets the complete time-zone database
#                           (tzdata, tzdata-legacy) and the en_US.UTF-8 locale;
#                           every suite but trixie (and older) python3-pyarrow.
#   RUNTIME_IMAGE_MIRROR, RUNTIME_IMAGE_SECURITY_MIRROR
#   RUNTIME_IMAGE_MAX_LIST_AGE_DAYS  default 120. apt accepts a Release file
#                           past its Valid-Until while it is at most this many
#                           days old (its Date; apt's Acquire::Min-ValidTime),
#                           for a mirror that refreshes testing's lists
#                           (Valid-Until: a week) seldom. Older lists fail the
#                           build. 0: Valid-Until exactly. README.md says what
#                           the bound gives up.
#   RUNTIME_IMAGE_CHECK_VALID_UNTIL  default true. false accepts Release files
#                           of any age (still signature-checked): for a frozen
#                           mirror or snapshot.debian.org, and it gives up apt's
#                           defence against a mirror (or MITM) replaying old,
#                           validly signed lists entirely, so it is never the
#                           default.
#   SOURCE_DATE_EPOCH       default: the one in ./source-date-epoch.
#
# Reproducible for a given package set: every timestamp in the image is
# clamped to SOURCE_DATE_EPOCH (tools/runtime-image/repro.sh checks it).
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${1:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
variant=${RUNTIME_IMAGE_VARIANT:-default}
suite=${RUNTIME_IMAGE_SUITE:-forky}
mirror=${RUNTIME_IMAGE_MIRROR:-http://deb.debian.org/debian}
security=${RUNTIME_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
snapshot_in=${RUNTIME_IMAGE_SNAPSHOT:-}
check_valid_until=${RUNTIME_IMAGE_CHECK_VALID_UNTIL:-true}
case $check_valid_until in true | false) ;; *)
	echo "build.sh: RUNTIME_IMAGE_CHECK_VALID_UNTIL must be true or false" >&2
	exit 2
	;;
esac
max_list_age_days=${RUNTIME_IMAGE_MAX_LIST_AGE_DAYS:-120}
case $max_list_age_days in '' | *[!0-9]* | 0[0-9]*)
	echo "build.sh: RUNTIME_IMAGE_MAX_LIST_AGE_DAYS must be a whole number of days, got '$max_list_age_days'" >&2
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

# The packages the Agent's code may import, and what the image promises
# besides them; their versions become one label each. The time-zone
# database complete: since tzdata 2023c-8 the legacy names analysts type
# (US/Pacific, Asia/Calcutta and the like) are in tzdata-legacy. locales
# has the sources customize.sh compiles en_US.UTF-8 from (C.UTF-8 is in
# libc-bin). trixie does not package python3-pyarrow; forky does.
packages=(python3 python3-pandas python3-numpy python3-scipy python3-sklearn
	python3-matplotlib python3-openpyxl python3-seaborn python3-statsmodels
	tzdata tzdata-legacy locales)
case $suite in
trixie | bookworm) ;;
*) packages+=(python3-pyarrow) ;;
esac
case $variant in
default) name=python-runtime ;;
geo)
	# geopandas reads and writes files through pyogrio (GDAL); pyproj needs
	# proj-data (proj.db) for any CRS. Listed so each gets its label.
	name=python-runtime-geo
	packages+=(python3-geopandas python3-shapely python3-pyproj python3-pyogrio proj-data)
	;;
tests)
	name=python-runtime-tests
	packages+=(python3-pytest python3-hypothesis)
	;;
*)
	echo "build.sh: unknown RUNTIME_IMAGE_VARIANT '$variant' (default, geo, tests)" >&2
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

# Release files past their Valid-Until. testing's carry one a week ahead of
# their Date, and a mirror that refreshes seldom (this project's does, see
# README.md) serves expired ones: apt's Min-ValidTime (seconds after Date)
# accepts them for a bounded time instead of not at all, so a replay of
# lists older than that still fails. mmdebstrap writes every --aptopt into
# the image's /etc/apt/apt.conf.d/99mmdebstrap: each is taken out again, so
# the image is the same whatever the knobs.
if [ "$check_valid_until" = false ]; then
	valid_until_opts=(--aptopt='Acquire::Check-Valid-Until "false"'
		--customize-hook='sed -i "/^Acquire::Check-Valid-Until /d" "$1/etc/apt/apt.conf.d/99mmdebstrap"')
else
	valid_until_opts=(--aptopt="Acquire::Min-ValidTime \"$((max_list_age_days * 86400))\""
		--customize-hook='sed -i "/^Acquire::Min-ValidTime /d" "$1/etc/apt/apt.conf.d/99mmdebstrap"')
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
# unpacked (dpkg path-exclude), except copyright files. Its stderr is also
# kept in a log, to name the knob when apt refuses the mirror's lists.
log=$build/$name.mmdebstrap.log
rc=0
exec 3>&1
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
	"deb $security $suite-security main" \
	2>&1 >&3 | tee "$log" >&2 || rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
	if grep -q 'is expired' "$log"; then
		{
			echo "build.sh: apt refused the mirror's package lists as expired:"
			grep 'is expired' "$log" | sed 's/^/  /'
			echo "  They are past their Valid-Until and older than RUNTIME_IMAGE_MAX_LIST_AGE_DAYS=$max_list_age_days days."
			echo "  Use a mirror with current lists, or raise RUNTIME_IMAGE_MAX_LIST_AGE_DAYS knowing that"
			echo "  it accepts a replay of lists that old (tools/runtime-image/README.md)."
		} >&2
	fi
	echo "build.sh: mmdebstrap failed (exit $rc; its output: $log)" >&2
	exit 1
fi
rm -f "$log"
stage "mmdebstrap done: $(wc -l <"$work/packages.txt") packages"
# How old the lists are that this image was resolved against: with the
# Valid-Until grace above, possibly past their Valid-Until (said so).
now=$(date +%s)
for f in "$work/lists/"*_InRelease; do
	[ -e "$f" ] || continue
	d=$(sed -n 's/^Date: //p' "$f" | head -1)
	v=$(sed -n 's/^Valid-Until: //p' "$f" | head -1)
	age=$(((now - $(date -d "$d" +%s)) / 86400))
	note=
	if [ -n "$v" ] && [ "$(date -d "$v" +%s)" -lt "$now" ]; then
		note=", past its Valid-Until $v"
	fi
	stage "lists $(basename "$f" | sed 's/_InRelease$//; s/.*_dists_//'): $d, $age days old$note"
done

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
