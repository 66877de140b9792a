# What a template fork's code can draw from the pseudo-random state the
# template left it (TEMPLATE.md section 7, SECURITY.md case 64), as one
# JSON line on stdout. template_test.go runs it in two forks of one
# template and fails on any draw the two share.
#
# "generators": every pseudo-random generator object reachable through the
# collector (random.Random but SystemRandom, NumPy's RandomState,
# Generator, BitGenerator and SeedSequence), found before this file imports
# anything, keyed by the shortest attribute path from sys.modules that
# reaches it (breadth first, modules in name order), else by its type and
# its order among the unreachable ones; each drawn from once, in key order.
# "process": per-process sources that are not Python objects, drawn
# through their modules: the multiprocessing authkey, uuid1's clock
# sequence (libuuid's) and Arrow's seed generator (pyarrow.compute.random),
# each if the template imported its module; tempfile's name sequence
# (which it renews only when the pid changes: G is pid 1, as T is),
# OpenSSL's DRBG (whose fork check is the pid too) and glibc's arc4random.
# "shared": what every fork shares with T by design (the str hash secret,
# the address-space layout): the test checks the two forks do, i.e. that
# they are forks of one template and the comparison means something.
import gc
import sys

_HAD = set(sys.modules)  # what the template (and the runner) imported
# The template froze its objects (gc.freeze): the collector lists them
# only once they are unfrozen.
gc.unfreeze()

_SKIP = (type(None), bool, int, float, complex, str, bytes, bytearray)
# Attributes of a generator that hold generator state but are in no
# __dict__: the bit generator of NumPy's RandomState and Generator, a bit
# generator's seed sequence.
_GENERATOR_LINKS = ("_bit_generator", "bit_generator", "_seed_seq", "seed_seq")


def _kinds():
    """(name, predicate, draw) per kind of generator, for the modules the
    process already has (nothing is imported that the template did not)."""
    import _random

    random = sys.modules.get("random")
    system = random.SystemRandom if random else ()
    # By type alone: isinstance would ask a proxy object its __class__.
    kinds = [("random.Random", lambda o: issubclass(type(o), _random.Random) and not issubclass(type(o), system),
              lambda o: o.getrandbits(64))]
    npr = sys.modules.get("numpy.random")
    if npr is not None:
        kinds += [
            ("numpy.random.RandomState", lambda o: issubclass(type(o), npr.RandomState),
             lambda o: int(o.randint(0, 1 << 62, dtype="int64"))),
            ("numpy.random.Generator", lambda o: issubclass(type(o), npr.Generator), lambda o: int(o.integers(1 << 62))),
            ("numpy.random.BitGenerator", lambda o: issubclass(type(o), npr.BitGenerator), lambda o: int(o.random_raw())),
            ("numpy.random.SeedSequence", lambda o: issubclass(type(o), npr.SeedSequence),
             lambda o: [int(x) for x in o.generate_state(2, dtype="uint64")]),
        ]
    return kinds


def _kind(kinds, o):
    for k in kinds:
        try:
            if k[1](o):
                return k
        except Exception:
            pass
    return None


def _paths(kinds, depth=4):
    """id -> (shortest attribute path, object) for every generator reachable
    from sys.modules within depth steps."""
    found, seen = {}, set()
    level = [(name, sys.modules[name]) for name in sorted(sys.modules) if sys.modules[name] is not None]
    for _ in range(depth):
        nxt = []
        for path, o in level:
            if id(o) in seen or issubclass(type(o), _SKIP):
                continue
            seen.add(id(o))
            if _kind(kinds, o) and id(o) not in found:
                found[id(o)] = (path, o)
            nxt += _children(kinds, path, o)
        level = nxt
    return found


def _children(kinds, path, o):
    """What o holds, with their paths, read without running the code of o's
    class (no __getattr__, no property, no lazy container's filling: the
    walk must not import or create anything)."""
    import types

    out = []
    try:
        t = type(o)
        if issubclass(t, dict):
            out = [("%s[%r]" % (path, k), v) for k, v in dict.items(o) if type(k) in (str, int)]
        elif issubclass(t, (list, tuple)):
            it = list.__iter__(o) if issubclass(t, list) else tuple.__iter__(o)
            out = [("%s[%d]" % (path, i), v) for i, v in enumerate(it)]
        elif issubclass(t, (types.MethodType, types.BuiltinMethodType)):
            # numpy.random.random is a method of the global RandomState.
            out = [(path + ".__self__", o.__self__)]
        elif t is types.FunctionType:
            # A default argument made at import (rng=default_rng()), a
            # closure's cell.
            out = [("%s.__defaults__[%d]" % (path, i), v) for i, v in enumerate(o.__defaults__ or ())]
            out += [("%s.__kwdefaults__[%r]" % (path, k), v) for k, v in (o.__kwdefaults__ or {}).items()]
            for i, c in enumerate(o.__closure__ or ()):
                try:
                    out.append(("%s.__closure__[%d]" % (path, i), c.cell_contents))
                except ValueError:  # an empty cell
                    pass
        else:
            try:
                d = object.__getattribute__(o, "__dict__")
            except AttributeError:
                d = None
            if type(d) in (dict, types.MappingProxyType):
                out = [("%s.%s" % (path, k), v) for k, v in d.items() if type(k) is str]
            if _kind(kinds, o):
                for a in _GENERATOR_LINKS:
                    v = getattr(o, a, None)
                    if v is not None:
                        out.append(("%s.%s" % (path, a), v))
    except Exception:
        pass
    return out


def generators():
    kinds = _kinds()
    found = _paths(kinds)
    keyed = {path: o for path, o in found.values()}
    order = {}
    for o in gc.get_objects():
        if id(o) not in found and _kind(kinds, o):
            name = "%s.%s" % (type(o).__module__, type(o).__qualname__)
            n = order.get(name, 0)
            order[name] = n + 1
            keyed["<unreachable %s #%d>" % (name, n)] = o
    draws = {}
    for key in sorted(keyed):
        o = keyed[key]
        kind = _kind(kinds, o)
        try:
            draws["%s (%s)" % (key, kind[0])] = repr(kind[2](o))
        except Exception as exc:  # e.g. a SeedSequence-less BitGenerator's seed_seq
            draws["%s (%s)" % (key, kind[0])] = "error: %s: %s" % (type(exc).__name__, exc)
    return draws


def process():
    import ctypes

    out = {}
    if "multiprocessing.process" in _HAD:
        mp = sys.modules["multiprocessing.process"]
        out["multiprocessing authkey"] = bytes(mp.current_process().authkey).hex()
    import tempfile

    out["tempfile names"] = next(tempfile._get_candidate_names())
    try:
        import ssl

        out["OpenSSL RAND_bytes"] = ssl.RAND_bytes(16).hex()
    except ImportError:
        pass
    if "uuid" in _HAD:
        # libuuid's clock sequence (or the fallback's, from random), made
        # on the first uuid1 and kept: a shared one repeats uuid1 values.
        out["uuid1 clock_seq"] = sys.modules["uuid"].uuid1().clock_seq
    if "pyarrow.compute" in _HAD:
        # Arrow's process-wide seed generator, made on first use.
        out["pyarrow.compute.random"] = sys.modules["pyarrow.compute"].random(1).to_pylist()[0]
    libc = ctypes.CDLL(None)
    if hasattr(libc, "arc4random"):
        libc.arc4random.restype = ctypes.c_uint32
        out["glibc arc4random"] = libc.arc4random()
    return out


if __name__ == "__main__":
    import json

    result = {"generators": generators(), "process": process(),
              "shared": {"hash": repr(hash("sandboxd")), "layout": repr(id(sys.modules["sys"]))}}
    # Draws as strings: JSON numbers would lose 64-bit integers' low bits.
    result["process"] = {k: repr(v) for k, v in result["process"].items()}
    print(json.dumps(result, sort_keys=True))
