#!/bin/sh
# tools/deploy/image/build.sh BUILD_DIR BINARY: the sandboxd worker image
# (README.md here). Run by `make worker-image`; needs apt-get (for .debs
# missing from the cache), dpkg-deb and dpkg-query, not root.
#
#   BUILD_DIR/sandboxd-worker.oci   OCI image layout
#   BUILD_DIR/sandboxd-worker.tar   docker-archive (ctr images import, docker load)
#   BUILD_DIR/worker-image/         the .debs, the unpacked base, packages.txt
#
# The base layer is the build host's suite's current versions of the
# packages below (apt's candidates), never older than the host's own: the
# binary was linked against those, so the image carries a C library and a
# libseccomp at least as new as it was built for. The .debs are kept: a
# rebuild with them gives the same digest. SOURCE_DATE_EPOCH (default:
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
	# The mirror's version (apt's candidate): the host's may be gone from
	# it (a binNMU, a point release). It must not be older than the host's:
	# the binary needs at least the glibc and libseccomp it was linked
	# against.
	installed=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
	v=$(apt-cache policy "$p" | awk '/Candidate:/{print $2}')
	case $v in '' | '(none)')
		echo "build.sh: apt knows no version of $p (apt-get update?)" >&2
		exit 1
		;;
	esac
	if [ -n "$installed" ] && dpkg --compare-versions "$v" lt "$installed"; then
		echo "build.sh: $p: the mirror has $v, older than this host's $installed" >&2
		exit 1
	fi
	printf '%s\t%s\n' "$p" "$v" >>"$work/packages.txt.tmp"
	file=$(printf '%s_%s' "$p" "$v" | sed 's/:/%3a/g')
	if ! ls "$work/debs/$file"_*.deb >/dev/null 2>&1; then
		cached=$(ls /var/cache/apt/archives/"$file"_*.deb 2>/dev/null | head -n 1 || true)
		if [ -n "$cached" ]; then
			# apt-get download checks a .deb against the signed index;
			# one taken from apt's cache is checked here the same way:
			# its hash must be the one apt's lists give for p=v (a file
			# planted or corrupted in the cache is refused).
			sum=$(sha256sum "$cached" | cut -d' ' -f1)
			if ! apt-cache show "$p=$v" | grep -qx "SHA256: $sum"; then
				echo "build.sh: $cached does not hash to the SHA256 apt's lists give for $p=$v" >&2
				exit 1
			fi
			cp "$cached" "$work/debs/"
		else
			# As root, apt's download sandbox user must be able to write here.
			(cd "$work/debs" && apt-get download -q -o APT::Sandbox::User=root "$p=$v")
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
