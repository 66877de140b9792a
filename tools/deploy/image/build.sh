#!/bin/sh
# tools/deploy/image/build.sh BUILD_DIR BINARY: the sandboxd worker image
# (README.md here). Run by `make worker-image`; needs apt-get (for .debs
# missing from the cache), dpkg-deb and dpkg-query, not root.
#
#   BUILD_DIR/sandboxd-worker.oci   OCI image layout
#   BUILD_DIR/sandboxd-worker.tar   docker-archive (ctr images import, docker load)
#   BUILD_DIR/worker-image/         the .debs, the unpacked base, packages.txt
#
# The base layer is the build host's own versions of the packages below
# (dpkg-query): the binary was linked against them, so the image carries
# the C library and libseccomp it was built for. SOURCE_DATE_EPOCH (default:
# the commit time of HEAD) sets every mtime and the creation time.
set -eu
out=${1:-build}
bin=${2:-bin/sandboxd-worker}
# What the dynamically linked sandboxd and the two e2fsprogs tools it runs
# (server/volume: mkfs.ext4 for a session's volume, e2fsck -p before
# mounting one) load: libc6 (and libgcc-s1, which glibc loads for thread
# cancellation), libseccomp2, and mke2fs/e2fsck's libraries. Nothing else:
# no shell, no apt, no CA certificates.
PACKAGES="libc6 libgcc-s1 libseccomp2 e2fsprogs libext2fs2 libcom-err2 libblkid1 libuuid1"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
fi
revision=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
	revision="$revision-modified"
fi

work=$out/worker-image
mkdir -p "$work/debs"
: >"$work/packages.txt.tmp"
for p in $PACKAGES; do
	v=$(dpkg-query -W -f='${Version}' "$p") || {
		echo "build.sh: $p is not installed on this host (tools/deps/install.sh build)" >&2
		exit 1
	}
	printf '%s\t%s\n' "$p" "$v" >>"$work/packages.txt.tmp"
	file=$(printf '%s_%s' "$p" "$v" | sed 's/:/%3a/g')
	if ! ls "$work/debs/$file"_*.deb >/dev/null 2>&1; then
		cached=$(ls /var/cache/apt/archives/"$file"_*.deb 2>/dev/null | head -n 1 || true)
		if [ -n "$cached" ]; then
			cp "$cached" "$work/debs/"
		else
			(cd "$work/debs" && apt-get download -q "$p=$v")
		fi
	fi
done
mv "$work/packages.txt.tmp" "$work/packages.txt"

rm -rf "$work/base"
mkdir -p "$work/base"
for deb in "$work"/debs/*.deb; do
	p=$(dpkg-deb -f "$deb" Package)
	v=$(dpkg-deb -f "$deb" Version)
	# Only the versions listed: an older .deb left in the cache is ignored.
	grep -qx "$(printf '%s\t%s' "$p" "$v")" "$work/packages.txt" || continue
	dpkg-deb -x "$deb" "$work/base"
done

# Every library the three programs need is in the base: ld.so resolves
# them there and nowhere else.
base=$work/base
libs=$base/lib/x86_64-linux-gnu:$base/usr/lib/x86_64-linux-gnu
for prog in "$bin" "$base/sbin/mke2fs" "$base/sbin/e2fsck"; do
	if ! list=$("$base/lib64/ld-linux-x86-64.so.2" --inhibit-cache --library-path "$libs" --list "$prog" 2>&1) ||
		echo "$list" | grep -q 'not found'; then
		echo "build.sh: $prog needs a library the base layer lacks:" >&2
		echo "$list" >&2
		exit 1
	fi
	if echo "$list" | grep '=>' | grep -v "$base" | grep -q .; then
		echo "build.sh: $prog resolved a library outside the base layer:" >&2
		echo "$list" >&2
		exit 1
	fi
done

go run ./tools/deploy/image -base "$base" -packages "$work/packages.txt" -binary "$bin" \
	-epoch "$SOURCE_DATE_EPOCH" -revision "$revision" \
	-oci "$out/sandboxd-worker.oci" -archive "$out/sandboxd-worker.tar"
