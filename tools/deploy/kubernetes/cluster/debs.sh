#!/usr/bin/env bash
# Unpacks Debian's containerd, runc and CNI plugins into ROOT (dpkg-deb -x,
# no maintainer script: nothing is installed, no service is started on the
# host), for the test cluster's nodes (cluster.sh). The versions are apt's
# candidates, recorded in ROOT/versions.
#   debs.sh ROOT
set -euo pipefail
root=${1:?usage: debs.sh ROOT}
pkgs=(containerd runc containernetworking-plugins)
# A fresh VM's apt may not have read its lists yet: read once, as root.
policy=$(apt-cache policy "${pkgs[@]}" 2>/dev/null || true)
if [ "$(id -u)" = 0 ] && [ "$(grep -c 'Candidate: [0-9]' <<<"$policy")" -lt ${#pkgs[@]} ]; then
	apt-get update -qq
fi
want=$(for p in "${pkgs[@]}"; do
	v=$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')
	[ -n "$v" ] && [ "$v" != "(none)" ] || { echo "debs: apt does not know $p: apt-get update" >&2; exit 1; }
	echo "$p=$v"
done)
if [ -f "$root/versions" ] && [ "$(cat "$root/versions")" = "$want" ]; then
	exit 0
fi
rm -rf "$root" "$root.debs"
mkdir -p "$root.debs"
# shellcheck disable=SC2086
(cd "$root.debs" && apt-get download -q -o APT::Sandbox::User=root $want)
for deb in "$root.debs"/*.deb; do
	dpkg-deb -x "$deb" "$root"
done
rm -rf "$root.debs"
echo "$want" >"$root/versions"
echo "debs: $(echo $want) in $root"
