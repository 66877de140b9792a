#!/bin/sh
# Runs seedaudit.py (experiment E6) in the runtime rootfs, read-only: a
# private mount and pid namespace (seedaudit.py is its pid 1, as a
# template is), tmpfs on /tmp, the base environment of a policy
# (server/policy.go BaseEnv, one CPU); walk fixes the str hash seed, so that
# two runs differ only where an import seeded something, not in set orders.
#   run-seedaudit.sh ROOTFS walk|forks|forks-prelude [PRELOAD [CODE]]
set -eu
R=${1:?usage: run-seedaudit.sh ROOTFS MODE [PRELOAD]}
MODE=${2:?mode}
PRELOAD=${3:-numpy,pandas,matplotlib,matplotlib.pyplot}
CODE=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
hashseed=random
[ "$MODE" = walk ] && hashseed=0
exec unshare -m -p -f --propagation private sh -c '
  mount -t tmpfs -o size=64m tmpfs "$0/tmp"
  mount -t proc proc "$0/proc"
  mkdir "$0/tmp/lab"
  cp "$1/tools/templatelab/seedaudit.py" "$1/server/warmpool/template.py" "$1/server/warmpool/zygote.py" \
     "$1/server/runner/runner.py" "$1/server/warmpool/testdata/seedprobe.py" "$0/tmp/lab/"
  exec chroot "$0" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib MPLBACKEND=Agg \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
    LANG=C.UTF-8 PYTHONHASHSEED=$4 /usr/bin/python3 -P /tmp/lab/seedaudit.py "$2" "$3" "$5"
' "$R" "$repo" "$MODE" "$PRELOAD" "$hashseed" "$CODE"
