#!/bin/sh
# Runs forkmem.py in the runtime rootfs (read-only use: a private mount
# namespace with tmpfs on /tmp, so matplotlib's cache lands nowhere).
set -eu
R=${1:?usage: run-forkmem.sh ROOTFS}
here=$(cd "$(dirname "$0")" && pwd)
exec unshare -m --propagation private sh -c '
  mount -t tmpfs -o size=64m tmpfs "$0/tmp"
  mount -t proc proc "$0/proc"
  cp "$1/forkmem.py" "$0/tmp/forkmem.py"
  exec chroot "$0" env -i HOME=/tmp MPLCONFIGDIR=/tmp PATH=/usr/bin:/bin /usr/bin/python3 -B -P /tmp/forkmem.py
' "$R" "$here"
