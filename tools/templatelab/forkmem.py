# Experiment E1 (server/warmpool/TEMPLATE.md): what a copy-on-write fork of a
# template that imported the data stack costs, and what the forks share.
# Run inside the runtime rootfs (see run-forkmem.sh); prints one JSON object.
import gc, json, os, random, sys, time

t0 = time.process_time()
import numpy, pandas, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
import multiprocessing.process
import_cpu = time.process_time() - t0
gc.collect()
gc.freeze()

def rollup(pid):
    d = {}
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            v = v.split()
            if len(v) == 2 and v[1] == "kB":
                d[k] = int(v[0])
    return d

def child(mode, wr, rd):
    # What a fork does before it waits for its execution.
    t = time.process_time()
    if mode in ("reseed", "reseed+fork"):
        numpy.random.seed()               # NumPy's global RandomState
        multiprocessing.process.current_process().authkey = os.urandom(32)
    if mode == "reseed+fork":
        # F forks G (the code's process, in the joined pid namespace).
        gpid = os.fork()
        if gpid == 0:
            os.write(wr, json.dumps({"g": os.getpid()}).encode() + b"\n")
            os.read(rd, 1)
            os._exit(0)
    cpu = time.process_time() - t
    os.write(wr, json.dumps({
        "pid": os.getpid(), "cpu_ms": cpu * 1e3,
        "random": random.random(), "np": float(numpy.random.random()),
        "hash": hash("sandboxd"), "authkey": bytes(multiprocessing.process.current_process().authkey).hex()[:16],
        "id_main": id(sys.modules["__main__"]),
    }).encode() + b"\n")
    os.read(rd, 1)
    os._exit(0)

out = {"python": sys.version.split()[0], "import_cpu_ms": import_cpu * 1e3, "template": rollup(os.getpid())}
for mode in ("bare", "reseed", "reseed+fork"):
    n = 6
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pids, fork_ms = [], []
    for _ in range(n):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            child(mode, w1, r2)
        fork_ms.append((time.perf_counter() - t) * 1e3)
        pids.append(pid)
    f = os.fdopen(r1, "rb", buffering=0)
    reports, gs = [], []
    want = n * (2 if mode == "reseed+fork" else 1)
    buf = b""
    while buf.count(b"\n") < want:
        buf += os.read(r1, 65536)
    for line in buf.splitlines():
        j = json.loads(line)
        (gs if "g" in j else reports).append(j)
    time.sleep(0.2)
    mem = [rollup(p) for p in pids]
    gmem = [rollup(g["g"]) for g in gs]
    os.write(w2, b"x" * want)
    for p in pids:
        os.waitpid(p, 0)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    out[mode] = {
        "fork_ms_median": med(fork_ms), "fork_ms_max": max(fork_ms),
        "child_cpu_ms_median": med([r["cpu_ms"] for r in reports]),
        "pss_kb_median": med([m["Pss"] for m in mem]),
        "private_dirty_kb_median": med([m["Private_Dirty"] for m in mem]),
        "rss_kb_median": med([m["Rss"] for m in mem]),
        "g_pss_kb_median": med([m["Pss"] for m in gmem]) if gmem else None,
        "g_private_dirty_kb_median": med([m["Private_Dirty"] for m in gmem]) if gmem else None,
        "distinct_random": len({r["random"] for r in reports}),
        "distinct_np": len({r["np"] for r in reports}),
        "distinct_hash": len({r["hash"] for r in reports}),
        "distinct_authkey": len({r["authkey"] for r in reports}),
        "distinct_id_main": len({r["id_main"] for r in reports}),
        "n": n,
    }
    os.close(w1); os.close(w2); f.close(); os.close(r2)
print(json.dumps(out, indent=1))
