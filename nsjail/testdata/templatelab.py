# The template of experiment E4 (server/warmpool/TEMPLATE.md; driven by
# nsjail/templatelab_test.go, build tag templatelab). It runs as root of its
# own user namespace U_T, with CAP_SETUID and CAP_SETGID only, in a
# libcontainer sandbox. Per "fork" request on fd 3 it forks F, which makes
# a nested user namespace U_F (the template writes its id maps), sends the
# worker a pidfd of itself, receives a pidfd of the shell's init (a sandbox
# libcontainer made inside U_F), joins its namespaces with one setns, forks
# G (the code's process, in the shell's pid namespace), and relays G's wait
# status. G drops to uid 10001, no capabilities, no_new_privs, and prints
# its inside view as JSON on fd 1.
import json, os, socket, sys, time

NS = os.CLONE_NEWNS | os.CLONE_NEWNET | os.CLONE_NEWIPC | os.CLONE_NEWUTS | os.CLONE_NEWCGROUP
CODE = None


def inside_view(probes=True):
    def read(p):
        try:
            with open(p) as f:
                return f.read()
        except OSError as e:
            return "error: %s" % e
    status = {k: v.strip() for k, _, v in (l.partition(":") for l in read("/proc/self/status").splitlines())}
    return {
        "pid": os.getpid(), "ppid": os.getppid(),
        "uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(),
        "caps": {k: status.get(k) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        "no_new_privs": status.get("NoNewPrivs"), "seccomp": status.get("Seccomp"),
        "seccomp_filters": status.get("Seccomp_filters"),
        "uid_map": read("/proc/self/uid_map"), "cgroup": read("/proc/self/cgroup"),
        "hostname": socket.gethostname(), "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "ns": {n: os.readlink("/proc/self/ns/" + n) for n in ("user", "pid", "mnt", "net", "ipc", "uts", "cgroup")},
        "mounts": [l.split()[4] for l in read("/proc/self/mountinfo").splitlines()],
        "net": [l.split(":")[0].strip() for l in read("/proc/net/dev").splitlines()[2:]],
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
        "cwd": os.getcwd(),
        # Never in the template itself: a successful unshare would move it.
        "unshare_user": probe(lambda: os.unshare(os.CLONE_NEWUSER)) if probes else None,
        "mount_syscall": probe(mount_tmpfs) if probes else None,
    }


def probe(f):
    try:
        f()
        return "allowed"
    except OSError as e:
        return errno_name(e.errno)


def errno_name(n):
    import errno
    return errno.errorcode.get(n, str(n))


def mount_tmpfs():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")


def fork_f():
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid:
        os.close(w)
        os.read(r, 1)  # F has its own user namespace: map it
        os.close(r)
        idmap = os.environ.get("TEMPLATELAB_MAP", "0 0 1\n10001 10001 1\n").replace("\\n", "\n")
        with open("/proc/%d/uid_map" % pid, "w") as f:
            f.write(idmap)
        with open("/proc/%d/gid_map" % pid, "w") as f:
            f.write(idmap)
        return pid, (time.perf_counter() - t0) * 1e3
    # --- F: outside the sandbox for good; it only reaps G and reports ---
    os.close(r)
    os.unshare(os.CLONE_NEWUSER)
    os.write(w, b"u")
    os.close(w)
    while not open("/proc/self/gid_map").read():  # the template maps U_F
        time.sleep(0.0002)
    # A pid namespace can be joined only once it has an init, and only
    # from an ancestor: F makes PID_F (owned by U_F, a child of the
    # template's), G is its pid 1, and libcontainer joins it by path.
    os.unshare(os.CLONE_NEWPID)
    g = os.fork()
    if g == 0:
        # --- G: pid 1 of PID_F, the code's process ---
        me = os.pidfd_open(os.getpid())
        socket.send_fds(sock, [b"G\n"], [me])  # the worker reads G's host pid from it
        os.close(me)
        msg, fds, _, _ = socket.recv_fds(sock, 64, 8)
        for fd, kind in zip(fds, (os.CLONE_NEWNS, os.CLONE_NEWNET, os.CLONE_NEWIPC, os.CLONE_NEWUTS, os.CLONE_NEWCGROUP)):
            os.setns(fd, kind)
            os.close(fd)
        # The shell's init is gone already (the worker killed it once it
        # held the namespaces' fds): the code sees what a cold run sees.
        sock.sendall(b"joined\n")
        line = b""
        while not line.endswith(b"\n"):
            line += sock.recv(65536)
        msg, _, bpf = line.strip().partition(b" ")
        bpf = bytes.fromhex(bpf.decode())
        # What libcontainer's setns init does for `runc exec` (the lab
        # leaves out rlimits, the keyring and seccomp).
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last)
        # G's creds are the template root's (HostIDBase+1), unmapped in
        # U_F: become U_F's root first, as libcontainer's nsexec does, so
        # that the change to 10001 clears every capability.
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        os.setgroups([])
        os.setresgid(10001, 10001, 10001)
        os.setresuid(10001, 10001, 10001)  # drops every capability
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        if bpf:
            # The program the kernel holds for the shell's own init, i.e.
            # for a cold sandbox: seccomp(SECCOMP_SET_MODE_FILTER, 0, prog).
            class SockFprog(ctypes.Structure):
                _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
            prog = SockFprog(len(bpf) // 8, bpf)
            if libc.syscall(317, 1, 0, ctypes.byref(prog)) != 0:
                raise OSError(ctypes.get_errno(), "seccomp")
        os.chdir("/")
        sock.close()
        view = inside_view()
        if msg.startswith(b"oom"):
            os.write(1, (json.dumps(view) + "\n").encode())
            x = bytearray(512 << 20)  # more than the shell's limit
            view["oom"] = "survived"
        os.write(1, (json.dumps(view) + "\n").encode())
        os._exit(0)
    _, st = os.waitpid(g, 0)
    socket.send_fds(sock, [b"status %d\n" % st], [])
    os._exit(0)


if sys.argv[1:] == ["--view"]:  # a cold sandbox's view, for comparison
    print(json.dumps(inside_view()))
    sys.exit(0)
if len(sys.argv) > 1:  # optional preload, to measure the fork's cost
    for name in sys.argv[1].split(","):
        __import__(name)
    import gc
    gc.freeze()
sock = socket.socket(fileno=3)
while True:
    msg = sock.recv(64)
    if not msg or msg.startswith(b"quit"):
        break
    if msg.startswith(b"view"):
        os.write(1, (json.dumps(inside_view(probes=False)) + "\n").encode())
        continue
    pid, ms = fork_f()
    # This lab serves one fork at a time: wait for F, then say how long the
    # fork itself took.
    os.waitpid(pid, 0)
    sock.sendall(b"forked %d %.3f\n" % (pid, ms))
