#!/usr/bin/env bash
# mmdebstrap customize hook: $1 is the finished chroot, $2 the work dir outside
# it, $3 the variant (default, tests). Everything here runs once at image
# build time so that nothing has to be written at sandbox run time (the root
# is mounted read-only).
set -euo pipefail
root=$1
work=$2
variant=${3:-default}

# The sandbox user. Appended by hand: trixie's essential set has no useradd.
echo 'sandbox:x:10001:10001:sandbox:/tmp:/usr/sbin/nologin' >>"$root/etc/passwd"
echo 'sandbox:x:10001:' >>"$root/etc/group"
# (No shadow files: the essential set has no passwd package to own them.)
if [ -e "$root/etc/shadow" ]; then echo 'sandbox:!:1::::::' >>"$root/etc/shadow"; fi
if [ -e "$root/etc/gshadow" ]; then echo 'sandbox:!::' >>"$root/etc/gshadow"; fi
install -d -m 0755 "$root/workspace"

# Test suites shipped inside the libraries: never imported by user code, and a
# large part of the image. The testing helpers (numpy.testing,
# matplotlib.testing, pandas._testing) are separate packages and stay. The
# tests variant keeps them: it exists to run them (make upstream-tests).
dist=$root/usr/lib/python3/dist-packages
if [ "$variant" != tests ]; then
	# numpy.testing imports numpy._core.tests._natype, so that one file stays.
	# The smoke test below catches any other library that imports its tests.
	keep=$(mktemp -d)
	cp -a "$dist/numpy/_core/tests/_natype.py" "$keep/"
	find "$dist" -depth -type d -name tests -exec rm -rf {} +
	install -d "$dist/numpy/_core/tests"
	cp -a "$keep/_natype.py" "$dist/numpy/_core/tests/"
	: >"$dist/numpy/_core/tests/__init__.py"
	rm -rf "$keep"
fi
find "$root/usr/lib" -depth -type d -name __pycache__ -exec rm -rf {} +

# Byte-code for everything, as unchecked-hash pycs: the root is read-only so
# CPython could never write a pyc at run time, and hash-based pycs do not
# depend on file mtimes (which the image writer clamps to SOURCE_DATE_EPOCH).
chroot "$root" env -i PATH=/usr/bin:/bin PYTHONDONTWRITEBYTECODE=1 \
	python3 -m compileall -q -f -j 0 --invalidation-mode unchecked-hash \
	/usr/lib/python3/dist-packages "/usr/lib/$(chroot "$root" env -i PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -c 'import sys; print(f"python3.{sys.version_info[1]}")')" >/dev/null

# matplotlib's font list. matplotlib only reads it from its *writable* cache
# dir (MPLCONFIGDIR, or $XDG_CACHE_HOME/matplotlib); a fresh dir makes it scan
# every font again on each start (~55 ms here). We build it once here, and a .pth
# hook (sandboxd_mplcache.py) copies it into an empty cache dir at start.
install -d -m 0755 "$root/usr/share/sandboxd/matplotlib"
chroot "$root" env -i PATH=/usr/bin:/bin HOME=/nonexistent PYTHONDONTWRITEBYTECODE=1 \
	MPLCONFIGDIR=/usr/share/sandboxd/matplotlib MPLBACKEND=Agg \
	python3 -c 'import matplotlib.font_manager'
# The list comes in directory order; sort it so the image is reproducible
# (and ties between equally good fonts resolve the same way every build).
chroot "$root" env -i PATH=/usr/bin:/bin PYTHONDONTWRITEBYTECODE=1 python3 -c '
import glob, json
for p in glob.glob("/usr/share/sandboxd/matplotlib/fontlist-v*.json"):
    with open(p) as f:
        d = json.load(f)
    for k in ("afmlist", "ttflist"):
        d[k].sort(key=lambda e: tuple(str(e.get(k)) for k in ("fname", "name", "style", "weight", "stretch", "variant")))
    with open(p, "w") as f:
        json.dump(d, f, indent=2)
'
rm -f "$root/usr/share/sandboxd/matplotlib/"*.lock
ls "$root/usr/share/sandboxd/matplotlib/"fontlist-v*.json >/dev/null
chmod 0644 "$root/usr/share/sandboxd/matplotlib/"*
install -m 0644 "$(dirname "$0")/sandboxd_mplcache.py" "$dist/sandboxd_mplcache.py"
echo 'import sandboxd_mplcache' >"$dist/zz_sandboxd_mplcache.pth"
# -f: the interpreter running compileall has just imported (and written a
# timestamp pyc for) this module through the .pth.
chroot "$root" env -i PATH=/usr/bin:/bin PYTHONDONTWRITEBYTECODE=1 \
	python3 -m compileall -q -f --invalidation-mode unchecked-hash \
	/usr/lib/python3/dist-packages/sandboxd_mplcache.py >/dev/null

# Smoke test: every library the Agent relies on imports without its tests.
chroot "$root" env -i PATH=/usr/bin:/bin HOME=/nonexistent PYTHONDONTWRITEBYTECODE=1 \
	MPLCONFIGDIR=/tmp/mpl-smoke MPLBACKEND=Agg python3 -c '
import pandas, numpy, scipy.stats, scipy.optimize, sklearn.ensemble, sklearn.linear_model
import matplotlib.pyplot, openpyxl, seaborn, statsmodels.api, statsmodels.formula.api'
rm -rf "$root/tmp/mpl-smoke"

# What the forky option (build.sh) adds, checked when it is installed.
installed() {
	[ "$(chroot "$root" dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}
# The time-zone database with the legacy names analysts type (US/Pacific and
# the like live in tzdata-legacy since tzdata 2023c-8), for libc, zoneinfo
# and pandas alike.
if installed tzdata-legacy; then
	[ "$(chroot "$root" env -i TZ=US/Pacific date -d @0 +%Z)" = PST ]
	chroot "$root" env -i PATH=/usr/bin:/bin HOME=/nonexistent PYTHONDONTWRITEBYTECODE=1 \
		LANG=C.UTF-8 python3 -c '
import zoneinfo, pandas as pd
assert zoneinfo.ZoneInfo("US/Eastern").key == "US/Eastern"
assert zoneinfo.ZoneInfo("Europe/Kiev").key == "Europe/Kiev"
assert len(zoneinfo.available_timezones()) > 590
ts = pd.Timestamp("2024-07-01 12:00").tz_localize("US/Pacific")
assert ts.utcoffset() == pd.Timedelta(hours=-7), ts'
fi
# Arrow-backed pandas with parquet round trips (time zones included).
if installed python3-pyarrow; then
	chroot "$root" env -i PATH=/usr/bin:/bin HOME=/nonexistent PYTHONDONTWRITEBYTECODE=1 \
		LANG=C.UTF-8 python3 -c '
import io, pandas as pd, pyarrow as pa, pyarrow.parquet
df = pd.DataFrame({"t": pd.date_range("2024-01-01", periods=3, tz="Europe/Berlin"), "s": ["a", "ü", None]})
df["s"] = df["s"].astype("string[pyarrow]")
buf = io.BytesIO(); df.to_parquet(buf); back = pd.read_parquet(buf)
assert back["s"].tolist()[:2] == ["a", "ü"] and back["s"].isna().tolist() == [False, False, True], back
assert list(back["t"]) == list(df["t"]) and str(back["t"].dt.tz) == "Europe/Berlin", back["t"]
assert str(pd.Series([1, 2], dtype="int64[pyarrow]").dtype) == "int64[pyarrow]"'
fi

# No setuid/setgid files: nothing in the sandbox may gain privileges (the
# image writer strips these bits again, and the unpacker a third time).
find "$root" -xdev -type f -perm /6000 -print -exec chmod ug-s {} + >&2

# Package versions, recorded as image labels by main.go.
chroot "$root" dpkg-query -W -f '${Package}\t${Version}\n' | sort >"$work/packages.txt"

# Files that differ per build host or run.
rm -f "$root/etc/hostname" "$root/etc/resolv.conf" "$root/var/cache/ldconfig/aux-cache"
rm -rf "$root/var/log/"* "$root/var/cache/debconf/"*-old "$root/var/lib/dpkg/"*-old
: >"$root/etc/machine-id" 2>/dev/null || true
