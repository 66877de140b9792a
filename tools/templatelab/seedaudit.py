# Experiment E6 (server/warmpool/TEMPLATE.md section 7): what the preload
# seeds at import that a template's forks would share. Run inside the
# runtime rootfs by run-seedaudit.sh, which puts this directory's files and
# template.py, zygote.py, the runner and testdata/seedprobe.py in /tmp/lab
# and runs this as pid 1 of a new pid namespace (as T is).
#
#   seedaudit.py walk PRELOAD   T's set-up, then every int, float, str and
#                               bytes reachable from sys.modules within
#                               four steps (path -> repr), one JSON object:
#                               two cold runs differ where the import
#                               seeded something (entropy, time, pid,
#                               addresses)
#   seedaudit.py forks-prelude PRELOAD CODE
#                               forks, CODE run in T after the preload
#   seedaudit.py forks PRELOAD  T's set-up, gc.freeze, then per variant two
#                               forks as template.py makes them (F unshares
#                               a pid namespace, G is its pid 1) that run
#                               seedprobe.py; prints what the two share
#
# PRELOAD: module names joined by commas (the default: config.DefaultPreload).
import gc
import json
import os
import sys
import types

LAB = "/tmp/lab"


def load(name, path):
    mod = types.ModuleType(name)
    with open(path) as f:
        exec(compile(f.read(), path, "exec", dont_inherit=True), mod.__dict__)
    return mod


def template_setup(preload):
    """What template.py's T does before its first fork (its fd reservation
    and dumpable flag aside)."""
    zygote = load("sandboxd_zygote", LAB + "/zygote.py")
    with open(LAB + "/runner.py") as f:
        zygote._load_runner(f.read())
    zygote._preload(preload)
    zygote._libc()
    template = load("sandboxd_template", LAB + "/template.py")
    template.zygote = zygote
    return template


def walk(depth=4):
    out, seen = {}, set()
    level = [(n, sys.modules[n]) for n in sorted(sys.modules) if sys.modules[n] is not None]
    for _ in range(depth):
        nxt = []
        for path, o in level:
            t = type(o)
            if t in (int, float, str, bytes, bytearray):
                out.setdefault(path, repr(o)[:200])
                continue
            if id(o) in seen or t in (bool, type(None)):
                continue
            seen.add(id(o))
            try:
                if issubclass(t, dict):
                    nxt += [("%s[%r]" % (path, k), v) for k, v in dict.items(o) if type(k) in (str, int)]
                elif issubclass(t, (list, tuple)):
                    it = list.__iter__(o) if issubclass(t, list) else tuple.__iter__(o)
                    nxt += [("%s[%d]" % (path, i), v) for i, v in enumerate(it)]
                else:
                    d = object.__getattribute__(o, "__dict__")
                    if type(d) in (dict, types.MappingProxyType):
                        nxt += [("%s.%s" % (path, k), v) for k, v in d.items() if type(k) is str]
            except Exception:
                pass
        level = nxt
    return out


def fork_probe(template, variant):
    """One fork as template.py makes it: F unshares a pid namespace, G is
    its pid 1, reseeds per variant, then runs seedprobe.py; returns its
    JSON."""
    r, w = os.pipe()
    f = os.fork()
    if f == 0:
        os.close(r)
        os.unshare(os.CLONE_NEWPID)
        g = os.fork()
        if g == 0:
            if variant == "template.py":
                template._reseed()
            os.dup2(w, 1)
            sys.stdout = open(1, "w", closefd=False)
            mod = types.ModuleType("__main__")
            sys.modules["__main__"] = mod
            with open(LAB + "/seedprobe.py") as src:
                exec(compile(src.read(), "seedprobe.py", "exec"), mod.__dict__)
            sys.stdout.flush()
            os._exit(0)
        os._exit(os.waitstatus_to_exitcode(os.waitpid(g, 0)[1]))
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(f, 0)
    return json.loads(data)


def forks(template):
    gc.collect()
    gc.freeze()
    out = {"pid": os.getpid()}
    for variant in ("none", "template.py"):
        a, b = fork_probe(template, variant), fork_probe(template, variant)
        res = {"found": sorted(a["generators"]), "shared": {}, "differ": []}
        for part in ("generators", "process"):
            for k, v in a[part].items():
                if b[part].get(k) == v:
                    res["shared"][k] = v
                else:
                    res["differ"].append(k)
        res["hash/layout shared"] = a["shared"] == b["shared"]
        out[variant] = res
    return out


def main():
    mode, preload = sys.argv[1], sys.argv[2].split(",")
    template = template_setup(preload)
    if mode == "walk":
        import ctypes

        out = walk()
        # glibc's rand(): seed 1 in every process unless something calls
        # srand (1804289383 then).
        out["<glibc rand()>"] = ctypes.CDLL(None).rand()
        print(json.dumps(out, sort_keys=True))
    elif mode == "forks":
        print(json.dumps(forks(template), indent=1, sort_keys=True))
    elif mode == "forks-prelude":
        # What a preload other than the default could do at import (draw
        # from OpenSSL, name a temporary file, make a uuid1): does a G,
        # pid 1 as T is, get T's state?
        exec(sys.argv[3], {"__name__": "prelude"})
        print(json.dumps(forks(template), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
