"""Seed matplotlib's font cache from the copy prebuilt into the image.

matplotlib reads its font list only from its writable cache directory
(MPLCONFIGDIR, else $XDG_CACHE_HOME/matplotlib, else ~/.cache/matplotlib).
sandboxd gives every run a fresh, empty one, so without this matplotlib would
rescan all fonts on every start (~200 ms). Imported from a .pth file at
interpreter start; costs one stat when the cache is already there.
"""
import os


def _seed():
    src = "/usr/share/sandboxd/matplotlib"
    dst = os.environ.get("MPLCONFIGDIR")
    if not dst:
        cache = os.environ.get("XDG_CACHE_HOME")
        if not cache:
            home = os.environ.get("HOME")
            if not home:
                return
            cache = os.path.join(home, ".cache")
        dst = os.path.join(cache, "matplotlib")
    try:
        names = [n for n in os.listdir(src) if n.startswith("fontlist-")]
    except OSError:
        return
    for name in names:
        target = os.path.join(dst, name)
        if os.path.exists(target):
            continue
        try:
            os.makedirs(dst, exist_ok=True)
            with open(os.path.join(src, name), "rb") as f:
                data = f.read()
            tmp = "%s.%d.tmp" % (target, os.getpid())
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except OSError:
            pass  # read-only or full cache dir: matplotlib copes on its own


_seed()
del _seed
