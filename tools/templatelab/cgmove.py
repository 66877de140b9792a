# Experiment E3 (server/warmpool/TEMPLATE.md): what moving a freshly forked
# process into a new, nested cgroup costs on cgroup v1 (no CLONE_INTO_CGROUP
# there), per hierarchy and in all; and what fork(2) of a large process
# costs. Creates only sandboxd-lab-<pid>/ under this process's own cgroup
# in each hierarchy, moves only its own children, removes all it made.
# Run as root on the host: python3 cgmove.py
import json, os, resource, signal, statistics, time

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e3

ROOT = "/sys/fs/cgroup"
own = {}
for line in open("/proc/self/cgroup"):
    _, ctrls, path = line.strip().split(":", 2)
    for c in ctrls.split(","):
        if c and os.path.isdir(os.path.join(ROOT, c.replace("name=", ""))):
            own[c.replace("name=", "")] = os.path.join(ROOT, c.replace("name=", ""), path.lstrip("/"))
hier = {c: p for c, p in own.items() if c in ("cpu", "cpuacct", "memory", "pids", "freezer", "devices", "cpuset", "blkio")}
parent = {c: os.path.join(p, "sandboxd-lab-%d" % os.getpid()) for c, p in hier.items()}
for c, p in parent.items():
    os.mkdir(p)
    if c == "cpuset":
        for f in ("cpuset.cpus", "cpuset.mems"):
            open(os.path.join(p, f), "w").write(open(os.path.join(hier[c], f)).read())

def trial(ballast_mb, n=15):
    ballast = bytearray(ballast_mb << 20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    fork_ms, move_ms, fork_cpu, move_cpu, per = [], [], [], [], {c: [] for c in parent}
    for i in range(n):
        kids = {c: os.path.join(p, "k%d" % i) for c, p in parent.items()}
        for c, k in kids.items():
            os.mkdir(k)
            if c == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    open(os.path.join(k, f), "w").write(open(os.path.join(parent[c], f)).read())
        r, w = os.pipe()
        t = time.perf_counter(); c0 = cpu()
        pid = os.fork()
        if pid == 0:
            os.read(r, 1)
            os._exit(0)
        fork_ms.append((time.perf_counter() - t) * 1e3); fork_cpu.append(cpu() - c0)
        t = time.perf_counter(); c0 = cpu()
        for c, k in kids.items():
            t1 = time.perf_counter()
            with open(os.path.join(k, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            per[c].append((time.perf_counter() - t1) * 1e3)
        move_ms.append((time.perf_counter() - t) * 1e3); move_cpu.append(cpu() - c0)
        os.write(w, b"x")
        os.waitpid(pid, 0)
        os.close(r); os.close(w)
        for k in kids.values():
            os.rmdir(k)
        time.sleep(0.05)
    med = statistics.median
    return {"ballast_mb": ballast_mb, "fork_ms_median": round(med(fork_ms), 3), "fork_ms_max": round(max(fork_ms), 3),
            "move_all_ms_median": round(med(move_ms), 3), "fork_cpu_ms_median": round(med(fork_cpu), 3), "move_cpu_ms_median": round(med(move_cpu), 3), "move_all_ms_max": round(max(move_ms), 3),
            "per_hierarchy_ms_median": {c: round(med(v), 3) for c, v in per.items()}}

def burst(k=4, n=8):
    # k forks moved back to back, each into its own child cgroup: does the
    # burst pay one grace period or k?
    per_burst = []
    for i in range(n):
        kids, pids, pipes = [], [], []
        for j in range(k):
            d = {c: os.path.join(p, "b%d-%d" % (i, j)) for c, p in parent.items()}
            for c, kd in d.items():
                os.mkdir(kd)
                if c == "cpuset":
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        open(os.path.join(kd, f), "w").write(open(os.path.join(parent[c], f)).read())
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.read(r, 1)
                os._exit(0)
            kids.append(d); pids.append(pid); pipes.append((r, w))
        time.sleep(0.2)  # let the rcu_sync state go idle, as between refills
        t = time.perf_counter()
        for d, pid in zip(kids, pids):
            for kd in d.values():
                with open(os.path.join(kd, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
        per_burst.append((time.perf_counter() - t) * 1e3)
        for (r, w), pid in zip(pipes, pids):
            os.write(w, b"x"); os.waitpid(pid, 0); os.close(r); os.close(w)
        for d in kids:
            for kd in d.values():
                os.rmdir(kd)
    return {"burst_of": k, "burst_ms_median": round(statistics.median(per_burst), 3), "burst_ms_max": round(max(per_burst), 3)}

try:
    out = [trial(0), trial(160), burst()]
finally:
    for p in parent.values():
        os.rmdir(p)
print(json.dumps(out, indent=1))
