#!/usr/bin/env bash
# Shows that the python-runtime image is reproducible: builds it twice from
# the same package set and compares the manifest digests. Build 1 resolves
# against the mirror's current package lists and records them with the
# versions it installed (its snapshot); build 2 installs from that snapshot,
# every package pinned to build 1's version. Both use the same
# SOURCE_DATE_EPOCH (source-date-epoch, or the environment's) and share the
# downloaded .debs; RUNTIME_IMAGE_SUITE and the mirrors pass through. Usage
# (root, repo root):
#
#   tools/runtime-image/repro.sh [DIR]     # default build/repro; `make runtime-image-repro`
#
# Prints both digests; exits 1 when they differ (and diffs the two layers'
# file lists and the two package lists to say where).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build/repro}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
export RUNTIME_IMAGE_DEB_CACHE=${RUNTIME_IMAGE_DEB_CACHE:-$dir/apt-archives}
unset RUNTIME_IMAGE_SNAPSHOT RUNTIME_IMAGE_VARIANT
mkdir -p "$dir"

digest() { # the manifest digest an OCI layout's index names
	grep -o '"digest": *"sha256:[0-9a-f]*"' "$1/index.json" | head -1 | grep -o 'sha256:[0-9a-f]*'
}

start=$(date +%s)
tools/runtime-image/build.sh "$dir/1"
t1=$(($(date +%s) - start))
RUNTIME_IMAGE_SNAPSHOT=$dir/1/python-runtime.snapshot tools/runtime-image/build.sh "$dir/2"
t2=$(($(date +%s) - start - t1))
d1=$(digest "$dir/1/python-runtime.oci")
d2=$(digest "$dir/2/python-runtime.oci")
echo "build 1 ($t1 s, mirror lists of $(sed -n 's/^Date: //p' "$dir/1/python-runtime.snapshot/lists/"*_dists_*_InRelease | head -1)): $d1"
echo "build 2 ($t2 s, build 1's snapshot, $(wc -l <"$dir/1/python-runtime.snapshot/packages.txt") pinned versions): $d2"
if [ -z "$d1" ] || [ "$d1" != "$d2" ]; then
	echo "repro: the two builds differ" >&2
	for i in 1 2; do
		tar -tvzf "$(ls -S "$dir/$i/python-runtime.oci/blobs/sha256/"* | head -1)" >"$dir/$i.list"
	done
	diff "$dir/1.list" "$dir/2.list" | head -50 >&2 || true
	exit 1
fi
echo "repro: identical"
