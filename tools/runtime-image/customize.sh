#!/usr/bin/env bash
# mmdebstrap customize hook: $1 is the finished chroot, $2 the work dir outside
# it, $3 the variant (default, geo, tests). Everything here runs once at image
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

installed() {
	[ "$(chroot "$root" dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}
py() { # python3 in the image, as the sandbox would start it (its env)
	# Bounded: a check that hangs (seen once: this parquet round trip
	# printed its answer, then never exited) fails the build, naming
	# itself, instead of hanging it (and CI) without an end.
	local rc=0
	timeout -k 5 300 chroot "$root" env -i PATH=/usr/bin:/bin HOME=/nonexistent PYTHONDONTWRITEBYTECODE=1 \
		LANG=C.UTF-8 MPLCONFIGDIR=/tmp/mpl-smoke MPLBACKEND=Agg python3 "$@" || rc=$?
	[ $rc != 124 ] || echo "customize: a python3 check in the image did not end in 300 s: python3 $*" >&2
	return $rc
}

# A UTF-8 locale beyond C.UTF-8 (libc-bin's, the image's LANG): analysts'
# code asks for en_US.UTF-8 by name (locale.setlocale, thousands grouping).
# Compiled here into /usr/lib/locale/en_US.utf8 (a directory like C.utf8,
# not the locale-archive), and listed in locale.gen so that locales'
# own tools would keep it.
sed -i 's/^# *\(en_US.UTF-8 UTF-8\)$/\1/' "$root/etc/locale.gen"
grep -qx 'en_US.UTF-8 UTF-8' "$root/etc/locale.gen"
chroot "$root" env -i PATH=/usr/bin:/bin localedef --no-archive -i en_US -c -f UTF-8 en_US.UTF-8 ||
	[ -e "$root/usr/lib/locale/en_US.utf8/LC_CTYPE" ]
[ -e "$root/usr/lib/locale/C.utf8/LC_CTYPE" ] && [ -e "$root/usr/lib/locale/en_US.utf8/LC_CTYPE" ]
[ "$(chroot "$root" env -i LANG=C.UTF-8 LC_ALL=en_US.UTF-8 locale charmap)" = UTF-8 ]
py -c '
import locale, sys
assert sys.getfilesystemencoding() == "utf-8"
assert locale.getpreferredencoding(False).lower().replace("-", "") == "utf8"
for name in ("C.UTF-8", "en_US.UTF-8", "en_US.utf8"):
    locale.setlocale(locale.LC_ALL, name)
    assert locale.nl_langinfo(locale.CODESET) == "UTF-8", name
assert locale.format_string("%d", 1234567, grouping=True) == "1,234,567"
locale.setlocale(locale.LC_ALL, "")  # LANG=C.UTF-8, as in the image config
assert locale.nl_langinfo(locale.CODESET) == "UTF-8"'

# The complete time-zone database, legacy names included (tzdata-legacy),
# for libc, zoneinfo and pandas alike.
[ "$(chroot "$root" env -i TZ=US/Pacific date -d @0 +%Z)" = PST ]
[ "$(chroot "$root" env -i TZ=Asia/Calcutta date -d @0 +%z)" = +0530 ]
py -c '
import zoneinfo, datetime as dt, pandas as pd
for key in ("US/Pacific", "US/Eastern", "US/Central", "US/Mountain", "US/Hawaii", "Europe/Kiev",
            "Asia/Calcutta", "Asia/Saigon", "GB", "Japan", "EST5EDT", "Etc/GMT+5", "UTC", "Europe/Berlin"):
    assert zoneinfo.ZoneInfo(key).key == key, key
assert len(zoneinfo.available_timezones()) > 590, len(zoneinfo.available_timezones())
t = dt.datetime(2024, 7, 1, 12, tzinfo=zoneinfo.ZoneInfo("US/Pacific"))
assert t.utcoffset() == dt.timedelta(hours=-7), t
ts = pd.Timestamp("2024-07-01 12:00").tz_localize("US/Pacific")
assert ts.utcoffset() == pd.Timedelta(hours=-7), ts
assert str(pd.Timestamp("2024-01-01", tz="Asia/Calcutta").tz_convert("UTC")) == "2023-12-31 18:30:00+00:00"'

# Arrow-backed pandas with parquet round trips (time zones included), where
# the suite has pyarrow (build.sh).
if installed python3-pyarrow; then
	py -c '
import io, pandas as pd, pyarrow as pa, pyarrow.parquet
df = pd.DataFrame({"t": pd.date_range("2024-01-01", periods=3, tz="Europe/Berlin"), "s": ["a", "ü", None]})
df["s"] = df["s"].astype("string[pyarrow]")
buf = io.BytesIO(); df.to_parquet(buf); back = pd.read_parquet(buf)
assert back["s"].tolist()[:2] == ["a", "ü"] and back["s"].isna().tolist() == [False, False, True], back
assert list(back["t"]) == list(df["t"]) and str(back["t"].dt.tz) == "Europe/Berlin", back["t"]
assert str(pd.Series([1, 2], dtype="int64[pyarrow]").dtype) == "int64[pyarrow]"
# Ended as the runner ends every execution (flush, then os._exit): a
# parquet read from a file object can leave Arrow thread-pool work that
# deadlocks the interpreter'"'"'s own shutdown (apache/arrow#33975, #50482;
# hung 2 builds of 3 here on 2026-12-02). Executions never meet it.
import os, sys; sys.stdout.flush(); os._exit(0)'
fi

# The geo variant: a GeoDataFrame, CRS transforms checked against the
# formulas, a spatial join, and files written and read back through
# pyogrio (GDAL), all without network (PROJ's grid download stays off).
if [ "$variant" = geo ]; then
	install -d -m 1777 "$root/tmp/geo-smoke"
	py -c '
import math, geopandas as gpd, pyogrio, pyproj, shapely
from pyproj.network import is_network_enabled
from shapely.geometry import Point, Polygon
assert not is_network_enabled()
pts = gpd.GeoDataFrame({"name": ["a", "b", "c"]},
                       geometry=[Point(0.5, 0.5), Point(1.5, 0.5), Point(5, 5)], crs="EPSG:4326")
zones = gpd.GeoDataFrame({"zone": ["west", "east"]},
                         geometry=[Polygon([(0, 0), (1, 0), (1, 1), (0, 1)]),
                                   Polygon([(1, 0), (2, 0), (2, 1), (1, 1)])], crs="EPSG:4326")
j = gpd.sjoin(pts, zones, how="left", predicate="within")
assert dict(zip(j["name"], j["zone"].fillna("-"))) == {"a": "west", "b": "east", "c": "-"}, j
# Web Mercator by its formula; Berlin.
lon, lat = 13.405, 52.52
x, y = pyproj.Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True).transform(lon, lat)
R = 6378137.0
assert abs(x - R * math.radians(lon)) < 1e-3 and abs(y - R * math.log(math.tan(math.pi / 4 + math.radians(lat) / 2))) < 1e-3, (x, y)
# UTM zone 31N: the central meridian (3 E) on the equator is (500000, 0).
u = gpd.GeoSeries([Point(3, 0)], crs="EPSG:4326").to_crs("EPSG:32631")
assert abs(u.x[0] - 500000) < 1e-3 and abs(u.y[0]) < 1e-3, u
# Two 1x1 degree cells on the equator in an equal-area CRS: 2 x 110.574 km
# (1 degree of latitude there) x 111.320 km (1 of longitude).
area = zones.to_crs("EPSG:6933").area.sum() / 1e6
assert abs(area - 2 * 110.574 * 111.320) < 20, area
for path, driver in (("/tmp/geo-smoke/p.gpkg", "GPKG"), ("/tmp/geo-smoke/p.geojson", "GeoJSON")):
    pts.to_file(path, driver=driver)
    back = gpd.read_file(path)
    assert back.crs == pts.crs and list(back["name"]) == ["a", "b", "c"], (driver, back)
    assert back.geometry.geom_equals(pts.geometry).all(), (driver, back)
assert "GPKG" in pyogrio.list_drivers() and shapely.geos_version >= (3, 10)'
	rm -rf "$root/tmp/geo-smoke"
fi
rm -rf "$root/tmp/mpl-smoke"

# No setuid/setgid files: nothing in the sandbox may gain privileges (the
# image writer strips these bits again, and the unpacker a third time).
find "$root" -xdev -type f -perm /6000 -print -exec chmod ug-s {} + >&2

# Package versions, recorded as image labels by main.go.
chroot "$root" dpkg-query -W -f '${Package}\t${Version}\n' | sort >"$work/packages.txt"

# Files that differ per build host or run.
rm -f "$root/etc/hostname" "$root/etc/resolv.conf" "$root/var/cache/ldconfig/aux-cache"
rm -rf "$root/var/log/"* "$root/var/cache/debconf/"*-old "$root/var/lib/dpkg/"*-old
: >"$root/etc/machine-id" 2>/dev/null || true
