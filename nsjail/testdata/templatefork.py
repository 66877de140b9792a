# The template of nsjail's shell tests (template_test.go; experiment E4 of
# server/warmpool/TEMPLATE.md, on the production API: Runner.StartTemplate,
# Runner.StartShell, Shell.MoveG): a minimal stand-in, not the production
# program (server/warmpool/template.py, tested in server/warmpool). It can
# do what the production one never does, for the tests of the worker's
# defences: a G that stops the shell's init, a template that lingers after
# the worker died, and one that reaps G at once (no go-ahead: MoveG's pin
# must hold on its own). Run as
# `python3 -B -P -c SOURCE --template` in the template's sandbox (root of
# its user namespace U_T, CAP_SETUID/SETGID only), or
# `... --view` in a cold sandbox, which prints what its process sees.
#
# The template serves requests on fd 3, one at a time:
#   view          -> its own view (no probes), one JSON line on fd 1
#   fork MAPS     -> clones G with clone3(CLONE_NEWUSER|CLONE_NEWPID): G is
#                    root of a new user namespace U_F (the template writes
#                    MAPS, JSON {"uid_map", "gid_map"}; with "stop_init":
#                    true, G SIGSTOPs the shell's init as soon as it
#                    exists) and pid 1 of a new pid namespace PID_F; with
#                    "cgroup": true (cgroup v2) the worker first sends "c"
#                    with the shell's cgroup fd, and G is cloned into it
#                    (CLONE_NEWCGROUP|CLONE_INTO_CGROUP).
#                    G sends the worker a pidfd of itself ("G\n"), gets the
#                    shell's namespace fds ("join\n"), joins them, says
#                    "joined\n", reads "MODE HEXPROG\n", drops to what a cold
#                    sandbox's process has (what libcontainer's setns init
#                    does; rlimits and the keyring are left out), loads the
#                    program, closes every fd but 0-2 and prints its view on
#                    fd 1; MODE "oom" then allocates more than the shell's
#                    memory limit. Once G is reaped the template sends
#                    "status N\n" (G's wait status), then "forked\n".
#   quit          -> exits 0
# --preload=numpy,pandas imports those first (what a real template holds).
# With --linger among its args, a process that finds the worker gone (EOF)
# stays (for a sweep test to kill) instead of exiting.
import json, os, socket, sys, time

SOCK = None


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
        "uid_map": read("/proc/self/uid_map"), "gid_map": read("/proc/self/gid_map"),
        "cgroup": read("/proc/self/cgroup"),
        "oom_score_adj": read("/proc/self/oom_score_adj").strip(),
        "hostname": socket.gethostname(), "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "mounts": [l.split()[4] for l in read("/proc/self/mountinfo").splitlines()],
        "root_mount_options": [l.split()[5] for l in read("/proc/self/mountinfo").splitlines() if l.split()[4] == "/"],
        "net": [l.split(":")[0].strip() for l in read("/proc/net/dev").splitlines()[2:]],
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
        "cwd": os.getcwd(),
        "rootfs_write": probe(lambda: open("/usr/sandboxd-probe", "w")),
        # Never in the template itself: a successful unshare would move it
        # into a new user namespace and break every later fork (E4).
        "unshare_user": probe(lambda: os.unshare(os.CLONE_NEWUSER)) if probes else None,
        "mount_syscall": probe(mount_tmpfs) if probes else None,
        # A process may lower its oom_score_adj down to its
        # oom_score_adj_min without privilege: a fork must not inherit
        # the template's -1000.
        "oom_lower": probe(lower_oom_score_adj) if probes else None,
    }


def probe(f):
    try:
        f()
        return "allowed"
    except OSError as e:
        import errno
        return errno.errorcode.get(e.errno, str(e.errno))


def lower_oom_score_adj():
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")


def mount_tmpfs():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")


def readline():
    line = b""
    while not line.endswith(b"\n"):
        b = SOCK.recv(1)
        if not b:
            # The worker is gone. --linger: stay, for Sweep to kill.
            while "--linger" in sys.argv:
                time.sleep(3600)
            os._exit(1)
        line += b
    return line.decode().strip()


def g_main(stop_init):
    # G: pid 1 of PID_F, root of U_F, in the template's other namespaces.
    me = os.pidfd_open(os.getpid())
    socket.send_fds(SOCK, [b"G\n"], [me])  # the worker reads G's host pid from it
    os.close(me)
    if stop_init:
        # A hostile G: SIGSTOP the shell's init (pid 2 of PID_F, which G
        # holds CAP_KILL over) as soon as it exists.
        while True:
            try:
                os.kill(2, 19)  # SIGSTOP
                break
            except ProcessLookupError:
                pass
    msg, fds, _, _ = socket.recv_fds(SOCK, 5, 8)
    if msg != b"join\n" or len(fds) != 5:
        os._exit(2)
    for fd, kind in zip(fds, (os.CLONE_NEWNS, os.CLONE_NEWNET, os.CLONE_NEWIPC, os.CLONE_NEWUTS, os.CLONE_NEWCGROUP)):
        os.setns(fd, kind)
        os.close(fd)
    os.chdir("/")
    SOCK.sendall(b"joined\n")
    mode, uid, gid, prog = readline().split(" ")
    uid, gid, prog = int(uid), int(gid), bytes.fromhex(prog)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last)
    # G's creds are the template root's (HostIDBase+1), unmapped in U_F:
    # become U_F's root first, so that the change to the sandbox user clears every
    # capability (E4). The ids are the test's (nsjail/inside).
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "no_new_privs")

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    fprog = SockFprog(len(prog) // 8, prog)
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog)
    if libc.syscall(317, 1, 1, ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")
    # Every fd but 0-2: the control socket and what ctypes opened (libffi
    # keeps an fd of its own library open for its trampolines).
    SOCK.close()
    os.closerange(3, 1 << 16)
    view = inside_view()
    os.write(1, (json.dumps(view) + "\n").encode())
    if mode == "oom":
        x = bytearray(512 << 20)  # more than the shell's limit
        os.write(1, b'{"oom": "survived"}\n')
    os._exit(0)


def fork(maps):
    cgroup_fd = None
    if maps.get("cgroup"):
        msg, fds, _, _ = socket.recv_fds(SOCK, 1, 1)
        if msg != b"c" or len(fds) != 1:
            raise RuntimeError("want the shell's cgroup fd, got %r with %d fds" % (msg, len(fds)))
        cgroup_fd = fds[0]
    # The raw clone3 skips glibc's fork handling: safe with one thread only.
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise RuntimeError("the template has %d threads" % threads)
    r, w = os.pipe()
    g = clone(cgroup_fd)
    if g == 0:
        # G: runs template code until its drop; first it waits for its maps.
        try:
            os.close(w)
            if cgroup_fd is not None:
                os.close(cgroup_fd)
            if os.read(r, 1) != b"m":
                raise RuntimeError("no maps")
            os.close(r)
            g_main(maps.get("stop_init", False))
        except BaseException:
            import traceback
            traceback.print_exc()
        os._exit(3)
    os.close(r)
    try:
        with open("/proc/%d/uid_map" % g, "w") as f:
            f.write(maps["uid_map"])
        with open("/proc/%d/gid_map" % g, "w") as f:
            f.write(maps["gid_map"])
        os.write(w, b"m")
    finally:
        os.close(w)  # without its maps, G reads EOF and exits
    if cgroup_fd is not None:
        os.close(cgroup_fd)
    _, st = os.waitpid(g, 0)
    SOCK.sendall(b"status %d\n" % st)
    SOCK.sendall(b"forked\n")


def clone(cgroup_fd):
    # What server/warmpool/template.py's _clone does (see there): G, root of
    # a new user namespace U_F and pid 1 of a new pid namespace PID_F owned
    # by it; on cgroup v2 (cgroup_fd) born in the shell's cgroup.
    import ctypes
    import signal
    fields = ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls", "set_tid",
              "set_tid_size", "cgroup")
    CloneArgs = type("CloneArgs", (ctypes.Structure,), {"_fields_": [(n, ctypes.c_uint64) for n in fields]})
    libc = ctypes.CDLL(None, use_errno=True)
    tid = ctypes.c_void_p()
    if libc.prctl(40, ctypes.byref(tid), 0, 0, 0) != 0:  # PR_GET_TID_ADDRESS
        raise OSError(ctypes.get_errno(), "PR_GET_TID_ADDRESS")
    # CLONE_NEWUSER | CLONE_NEWPID | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID
    flags = 0x10000000 | 0x20000000 | 0x01000000 | 0x00200000
    if cgroup_fd is not None:
        flags |= 0x02000000 | 0x200000000  # CLONE_NEWCGROUP | CLONE_INTO_CGROUP
    args = CloneArgs(flags=flags, child_tid=tid.value, exit_signal=signal.SIGCHLD,
                     cgroup=cgroup_fd if cgroup_fd is not None else 0)
    api = ctypes.PyDLL(None, use_errno=True)
    api.syscall.restype = ctypes.c_long
    api.PyOS_BeforeFork()
    pid = api.syscall(ctypes.c_long(435), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))  # x86_64, aarch64
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, "clone3")
    return pid


if __name__ == "__main__":
    # Args after --template only name the process (for a test to find it).
    if sys.argv[1:] == ["--view"]:
        print(json.dumps(inside_view()))
        sys.exit(0)
    for arg in sys.argv[1:]:
        if arg.startswith("--preload="):  # a real template's imports
            for name in arg[len("--preload="):].split(","):
                __import__(name)
            import gc
            gc.freeze()
    SOCK = socket.socket(fileno=3)
    while True:
        cmd, _, arg = readline().partition(" ")
        if cmd == "quit":
            break
        if cmd == "view":
            os.write(1, (json.dumps(inside_view(probes=False)) + "\n").encode())
        elif cmd == "fork":
            fork(json.loads(arg))
