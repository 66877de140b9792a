# The warm pool's template (issue 17, server/warmpool/TEMPLATE.md sections
# 2, 3, 5 and 7). T, this program, runs as the first process of a
# libcontainer sandbox of its own (nsjail.Runner.StartTemplate: root of its
# user namespace U_T with CAP_SETUID and CAP_SETGID only), imports the
# preload once and then, for each fork request of the worker, clones G, the
# code's process, into the execution's own new user and pid namespaces
# (U_F, PID_F), writes G's id maps and relays G's end. G joins the shell the worker made for it
# (nsjail.Runner.StartShell), drops to what a cold sandbox's process has,
# reseeds what the preload seeded, and then runs exactly what a zygote's
# child runs (zygote.py's _serve: _rehearse, READY, _receive, then the
# runner's run_file or _kernel), from zygote.py's own source: this program
# gets it as its first argument and loads it as a module, as the zygote
# loads the runner; nothing of it is copied here.
#
# argv (protocol.go's templateArgs): zygote.py's source, the runner's
# source, the preload's module names joined by PRELOAD_SEP.
#
# The exchange (protocol.go's "Template forks"; the block below mirrors its
# constants, TestTemplateMirrorsProtocol checks both agree):
#  T  <- worker, TEMPLATE_FD: a ForkRequest line (the fork's uid_map and
#        gid_map, as T writes them) with FORK_FDS fds (SCM_RIGHTS): the
#        fork's control socket, ready pipe, exit-report pipe and go-ahead
#        pipe (read end), then, when the request says "cgroup" (cgroup
#        v2), FORK_CGROUP_FDS more, the shell's cgroup (a detached mount
#        of its directory), into which T clones G, then optionally
#        FORK_OUTPUT_FDS more, the execution's stdout and stderr.
#  T  -> worker: a ForkReply line, {"forked": true} once G exists and its
#        maps are written, or {"refused": why}: T then forks nothing, or
#        (a failed map write) a G that exits at once, told nothing, whose
#        end T reports and reaps as any G's. T keeps the exit report and
#        the go-ahead of a G it cloned, and closes its copies of the
#        fork's other fds either way.
#  G  -> worker, CONTROL_FD: PIDFD_MESSAGE with a pidfd of G.
#  G  <- worker, CONTROL_FD: a Join line (seccomp program, rlimits, session
#        keyring name) with the shell's namespace fds, in SHELL_NAMESPACES
#        order. The worker sends it after StartShell and MoveG.
#  G  -> READY_FD: READY_BYTE once confined and rehearsed; then today's
#        hand-off (protocol.go steps 3 and 3k), unchanged.
#  T  -> the exit-report pipe: G's wait status, as soon as G has exited.
#  T  <- the go-ahead pipe: EOF (or a byte): the worker is done moving G
#        (Shell.MoveG) and T may reap G. Until then G stays a zombie.
#        (T keeps both at the numbers they arrived on.)
# EOF on TEMPLATE_FD: the worker is done with this template; T exits 0
# (its forks, in its pid namespace, die with it).
import json
import os
import select
import signal
import socket
import sys
import types

# --- PROTOCOL (server/warmpool/protocol.go) ---
TEMPLATE_FD = 3
FORK_FDS = 4
FORK_CGROUP_FDS = 1
FORK_OUTPUT_FDS = 2
PIDFD_MESSAGE = b"pidfd\n"
SHELL_NAMESPACES = "mnt net ipc uts cgroup"
# --- end PROTOCOL ---

_FORK_FAILED_EXIT = 71  # EX_OSERR: G could not do its part
_SETNS_FLAGS = {
    "mnt": os.CLONE_NEWNS,
    "net": os.CLONE_NEWNET,
    "ipc": os.CLONE_NEWIPC,
    "uts": os.CLONE_NEWUTS,
    "cgroup": os.CLONE_NEWCGROUP,
}
# Syscalls Python has no wrapper for, by machine.
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_SYS_CLONE3 = {"x86_64": 435, "aarch64": 435}
_CLONE_PIDFD = 0x00001000
_CLONE_CHILD_CLEARTID = 0x00200000
_CLONE_CHILD_SETTID = 0x01000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_INTO_CGROUP = 0x200000000
_PR_GET_TID_ADDRESS = 40
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_KEYCTL_JOIN_SESSION_KEYRING = 1
_KEYCTL_SETPERM = 5
_KEYCTL_DESCRIBE = 6
_KEY_OTH_SEARCH = 0x8
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4

zygote = None  # zygote.py, loaded by _load_zygote
_template_sock = None  # T's end of TEMPLATE_FD
_libc = None  # libc through ctypes: T's handle, which every G inherits


def _load_zygote(source):
    """zygote.py as a module of its own (its __main__ guard keeps it from
    starting): the hand-off and kernel code G runs is the zygote's."""
    global zygote
    mod = types.ModuleType("sandboxd_zygote")
    exec(compile(source, "<sandboxd zygote>", "exec", dont_inherit=True), mod.__dict__)
    zygote = mod


def _fail(who, exc):
    """G cannot go on: say why on stderr (the template's log: G has not
    yet put its execution's output on 1 and 2) and exit."""
    import traceback

    try:
        sys.stderr.write("template: %s: %s" % (who, "".join(traceback.format_exception(exc))))
        sys.stderr.flush()
    finally:
        os._exit(_FORK_FAILED_EXIT)


def _threads():
    return len(os.listdir("/proc/self/task"))


# --- T ---


def _reserve_fork_fds():
    """Hold G's channel numbers (_fork_targets but TEMPLATE_FD) with
    /dev/null before the preload opens anything: G puts its channels there
    with dup2, which would otherwise silently close whatever the preload
    had opened on those numbers (libffi's fd, which libffi mmaps again
    later)."""
    # TEMPLATE_FD is CONTROL_FD: G closes T's socket before it puts its
    # control socket there.
    targets = [fd for fd in _fork_targets() if fd != TEMPLATE_FD]
    for fd in targets:
        try:
            os.fstat(fd)
        except OSError:
            continue
        raise RuntimeError("fd %d is open at the template's start" % fd)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)  # the first of them, likely
    for fd in targets:
        if fd != null:
            os.dup2(null, fd, inheritable=False)
    if null not in targets:
        os.close(null)


def _is_reserved(fd):
    """Whether fd is still _reserve_fork_fds's read-only /dev/null."""
    import fcntl
    import stat

    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3) and flags & 3 == os.O_RDONLY


def _fork_targets():
    """The numbers of G's channels: control and ready (the exit report and
    the go-ahead stay T's, at the numbers they arrived on)."""
    return (zygote.CONTROL_FD, zygote.READY_FD)


def _shared_mappings():
    """T's shared mappings that are writable or may be made so (the
    kernel's VmFlags "sh" with "wr" or "mw"), as /proc/self/smaps header
    lines. A fork inherits a shared mapping as the same pages, not a copy:
    every execution forked from T, and T, would share memory the code can
    write (a channel between executions, a way to tamper with T). "mw"
    counts because a read-only mapping of a file opened for writing (an
    anonymous shared mapping, a memfd, /dev/shm) can be made writable with
    mprotect; one of a file opened read-only (glibc's gconv cache) cannot,
    and is shared harmlessly. smaps is read only when the shared mappings
    (_shared_vmas) are not the set already found harmless (it walks the page tables
    of every mapping: ~10 ms of T's CPU per fork with the default preload,
    whose gconv cache is such a mapping). _shared_vmas names each mapping
    (addresses, permissions, device, inode), and a mapping's VmFlags "mw"
    never changes; mprotect changes its permissions."""
    global _harmless_shared
    shared = _shared_vmas()
    if not shared or shared == _harmless_shared:
        return []
    bad, header = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] == "VmFlags:":
                flags = set(fields[1:])
                if header and "sh" in flags and flags & {"wr", "mw"}:
                    bad.append(header)
            elif len(fields) > 1 and "-" in fields[0] and not fields[0].endswith(":"):
                header = line.rstrip("\n")
    if not bad:
        _harmless_shared = shared
    return bad


# The shared mappings (_shared_vmas) _shared_mappings last found harmless.
_harmless_shared = None

# PROCMAP_QUERY (Linux 6.11+, linux/fs.h): _IOWR('f', 17, struct
# procmap_query), whose 104 bytes are size, query_flags, query_addr,
# vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode (u64),
# dev_major, dev_minor, vma_name_size, build_id_size (u32), vma_name_addr,
# build_id_addr (u64).
_PROCMAP_QUERY = 0xC0686611
_PROCMAP_QUERY_FORMAT = "=9Q4I2Q"
_PROCMAP_QUERY_VMA_SHARED = 0x08
_PROCMAP_QUERY_COVERING_OR_NEXT_VMA = 0x10
_procmap_query = True  # until the kernel says it has no such ioctl


def _shared_vmas():
    """T's shared mappings (VM_MAYSHARE: maps' "s"), each as its start, end,
    flags (readable, writable, executable, shared), offset, inode and
    device, in address order; mprotect changes a mapping's flags. Through
    PROCMAP_QUERY, which asks the kernel for the shared ones only: reading
    /proc/self/maps formats every one of T's ~2,000 mappings, ~2.7 ms of
    T's CPU per fork (perf, tools/bench/RESULTS.md "zygotes and forks in
    one run"); the ioctl takes tens of microseconds. Older kernels: the
    maps lines of the shared mappings."""
    global _procmap_query
    import errno
    import fcntl
    import struct

    if _procmap_query:
        out, addr = [], 0
        fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
        try:
            while True:
                flags = _PROCMAP_QUERY_VMA_SHARED | _PROCMAP_QUERY_COVERING_OR_NEXT_VMA
                buf = bytearray(struct.pack(_PROCMAP_QUERY_FORMAT, 104, flags, addr, *([0] * 12)))
                try:
                    fcntl.ioctl(fd, _PROCMAP_QUERY, buf)
                except OSError as e:
                    if e.errno == errno.ENOENT:  # no shared mapping at or above addr
                        return tuple(out)
                    if e.errno not in (errno.ENOTTY, errno.EINVAL):
                        raise
                    _procmap_query = False  # no PROCMAP_QUERY here
                    break
                v = struct.unpack(_PROCMAP_QUERY_FORMAT, buf)
                out.append(v[3:6] + v[7:11])
                addr = v[4]
        finally:
            os.close(fd)
    with open("/proc/self/maps") as f:
        return tuple(line for line in f if len(line.split()) > 1 and line.split()[1][3:4] == "s")


def _warm_up():
    """Run, once, the data stack's first-use work that every execution
    would otherwise repeat in its own fork: a pandas group-by and a
    matplotlib figure rendered to PNG (font loading and caching, the Agg
    renderer, the PNG writer), each only if the preload imported it. SOCK
    (Oakes et al., ATC '18) and Android's zygote pre-initialise the same
    way. Fixed inputs, no randomness and no request data (SECURITY.md case
    64: nothing secret is made here); what it leaves is the libraries'
    caches, not state a cold run would see differently: no pyplot figure
    (its numbering starts at 1 in the code, as cold), rcParams and options
    untouched. The font it loads is freed again (below); a file a library
    keeps open stays open read-only, which T's fd check admits and G
    reopens in the shell's mount namespace as it does libffi's. A failure
    is logged on T's stderr and changes nothing else: the forks then pay
    that first use themselves."""
    try:
        if "pandas" in sys.modules and "numpy" in sys.modules:
            np, pd = sys.modules["numpy"], sys.modules["pandas"]
            df = pd.DataFrame({"key": np.arange(1000) % 10, "x": np.linspace(0.0, 1.0, 1000)})
            df.groupby("key").agg(x_mean=("x", "mean"), x_sum=("x", "sum"), rows=("x", "size"))
            df.describe()
        if "matplotlib" in sys.modules:
            import io

            from matplotlib import font_manager
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            fig = Figure(figsize=(2, 1.5), dpi=50)
            FigureCanvasAgg(fig)
            ax = fig.subplots()
            ax.bar([0, 1, 2], [1.0, 2.0, 1.5])
            ax.plot([0, 1, 2], [1.0, 0.5, 2.0])
            ax.set_xlabel("key")
            ax.set_ylabel("value")
            ax.set_title("warm-up")
            fig.savefig(io.BytesIO(), format="png")
            # The font the figure loaded (an FT2Font, in font_manager's
            # _get_font cache) is no fork's: matplotlib empties that cache
            # in every fork child (its os.register_at_fork hook: an FT2Font
            # must not cross a fork), so G would only free it, writing to
            # ~240 of T's pages (copy-on-write faults, ~15% of what G pays
            # before READY; TEMPLATE.md section 12, "what G pays"). Emptied
            # here once, G's hook finds nothing to free. The font search
            # (FontManager's own cache) stays warm.
            font_manager._get_font.cache_clear()
    except Exception as exc:
        sys.stderr.write("template: warm-up failed: %r\n" % (exc,))


def _why_not_fork(fds, cgroup):
    """Why T must not fork now, or None. Checked before every fork, as the
    preload (its threads, a lazy import) may have changed T since the last."""
    base = FORK_FDS + (FORK_CGROUP_FDS if cgroup else 0)
    if len(fds) not in (base, base + FORK_OUTPUT_FDS):
        return "the fork request carried %d fds, want %d or %d" % (len(fds), base, base + FORK_OUTPUT_FDS)
    # The fds a fork inherits from T: 0-2 (G replaces them), T's socket and
    # the reserved numbers (G replaces or closes them), the fork's own, the
    # live forks' (G closes them); besides those, only what
    # zygote._fd_refusal admits (read-only files of the image).
    stray = zygote._stray_fds({0, 1, 2, TEMPLATE_FD, *_fork_targets(), *fds, *_live_fork_fds()})
    if stray:
        return "stray fds: " + ", ".join("%d -> %s (%s)" % s for s in stray)
    # G's dup2 onto the reserved numbers would silently close whatever a
    # preload put there since (_reserve_fork_fds).
    for fd in _fork_targets():
        if fd != TEMPLATE_FD and not _is_reserved(fd):
            return "fd %d is no longer the reserved /dev/null" % fd
    shared = _shared_mappings()
    if shared:
        return "shared mappings: " + "; ".join(shared)
    # _clone skips glibc's fork handling, safe only with no other thread.
    threads = _threads()
    if threads != 1:
        return "the template has %d threads (_quiesce)" % threads
    return None


def _fork(request, fds):
    """Clone G for one request; None, or why T refused."""
    import gc

    req = json.loads(request)
    maps = {name: req[name] for name in ("uid_map", "gid_map")}
    cgroup = req.get("cgroup", False) is True
    why = _why_not_fork(fds, cgroup)
    if why:
        return why
    # Objects the preload made are never collected: keep the collector from
    # writing to them, so the forks' pages stay shared with T's.
    gc.freeze()
    # Nothing T's streams hold may reach a fork's (G's) output.
    sys.stdout.flush()
    sys.stderr.flush()
    ours, theirs = socket.socketpair()
    try:
        pid, pidfd = _clone(fds[FORK_FDS] if cgroup else None)
        if pid == 0:
            try:
                ours.close()
                _enter_g(fds, theirs, cgroup)
            except BaseException as exc:
                _fail("G", exc)
            os._exit(_FORK_FAILED_EXIT)  # not reached: _g exits
        # From here on, whatever happens, G's end is reported and G reaped
        # (_relay): T takes the exit report and the go-ahead out of the
        # request's fds (the caller closes the rest), with G's pidfd, which
        # the clone itself made, so nothing can fail in between.
        _forks[pidfd] = _Fork(fds[2], fds[3])
        fds[2] = fds[3] = None
        _poller.register(pidfd, select.POLLIN)
        theirs.close()
        # G waits for its maps before it does anything of its own; without
        # them (a failed write) it is told nothing, and exits.
        for name, text in maps.items():
            with open("/proc/%d/%s" % (pid, name), "w") as f:
                f.write(text)
        ours.sendall(b"m")
    finally:
        ours.close()
        theirs.close()
    return None


def _template():
    global _template_sock
    _load_zygote(sys.argv[1])
    _reserve_fork_fds()
    zygote._load_runner(sys.argv[2])
    zygote._preload(sys.argv[3].split(zygote.PRELOAD_SEP) if len(sys.argv) > 3 else [])
    _warm_up()
    global _libc
    _libc = libc = zygote._libc()  # G inherits it
    # Not dumpable (TEMPLATE.md section 5): ptrace of T and its /proc mem,
    # fd and environ files then need CAP_SYS_PTRACE over U_T, not merely
    # T's host uid, which every G before its drop shares. Forks
    # inherit it; G becomes dumpable after its drop, as a cold process is.
    # T never calls unshare(CLONE_NEWUSER) itself: it would move T into an
    # unmapped user namespace and break every later fork (E4).
    zygote._set_dumpable(libc, False)
    _template_sock = socket.socket(fileno=TEMPLATE_FD)
    # T's children are its Gs, each reaped by _relay after its go-ahead;
    # SIG_IGN would have the kernel reap them at once.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _quiesce()
    _poller.register(TEMPLATE_FD, select.POLLIN)
    while True:
        for fd, _ in _poller.poll(_TRACED_RETRY_MS if _traced else None):
            if fd == TEMPLATE_FD:
                _serve_request()
            else:
                _relay(fd)
        for pidfd in list(_traced):
            _exited(pidfd)


def _serve_request():
    got = zygote._receive_request(_template_sock, FORK_FDS + FORK_CGROUP_FDS + FORK_OUTPUT_FDS)
    if got is None:
        os._exit(0)
    msg, fds = got
    try:
        why = _fork(msg, fds)
    except Exception as exc:  # a bad request, a failed map write
        why = "%s: %s" % (type(exc).__name__, exc)
    finally:
        for fd in fds:
            if fd is not None:  # None: taken over by a fork
                os.close(fd)
    reply = {"refused": why} if why else {"forked": True}
    _template_sock.sendall(json.dumps(reply).encode() + zygote.MESSAGE_END)


def _quiesce():
    """Leave T with one thread, as _clone needs. A preload's library may
    keep a pool of idle threads (OpenBLAS's pthreads build), which it stops
    in its pthread_atfork prepare handler before every fork and starts
    again on its next use: one os.fork() whose child exits at once runs
    those handlers in T, and T never calls into the library again. A
    library that keeps its threads across a fork (libgomp's pool, once an
    OpenMP region ran) leaves T threaded: then every fork is refused
    (_why_not_fork says how many threads), as a raw clone3 would copy their
    locks in whatever state they are."""
    if _threads() == 1:
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+ warns about a fork with threads
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if _threads() != 1:
        sys.stderr.write("template: %d threads after the preload, also across a fork: every fork is refused\n" % _threads())
        sys.stderr.flush()


class _Fork:
    """T's part of one live fork besides G's pidfd (its key in _forks):
    T's ends of the exit report and the go-ahead (T relays G's end:
    SECURITY.md case 25)."""

    __slots__ = ("report", "go_ahead")

    def __init__(self, report, go_ahead):
        self.report, self.go_ahead = report, go_ahead

    def fds(self):
        return (self.report, self.go_ahead)


def _live_fork_fds():
    """Every fd T holds for its live forks: each G's pidfd, exit report and
    go-ahead (a clone copies them all into the next G)."""
    return [fd for pidfd, fork in _forks.items() for fd in (pidfd, *fork.fds())]


# T's live forks by G's pidfd, and the poll set of T's socket, those pidfds
# and the go-aheads still awaited (select.poll holds no fd of its own: a G
# inherits nothing of it).
_forks = {}
_poller = select.poll()
# The pidfds of Gs that exited while another process traced them
# (Shell.MoveG's and CheckConfined's ptrace pins): the kernel lets the
# parent wait for a traced zombie only once the tracer has let it go, so
# T retries them every _TRACED_RETRY_MS instead of blocking every other
# fork behind one.
_traced = set()
_TRACED_RETRY_MS = 20


def _relay(fd):
    """One event of a live fork: G exited (its pidfd), or the worker's
    go-ahead came (EOF or a byte). G's wait status goes out as soon as G
    exits; G is reaped only after the go-ahead. Shell.MoveG writes G's pid
    into cgroup.procs (v1 has no move by pidfd): a G reaped between MoveG's
    check and its write would free a pid a host process could take, and the
    write would move that process into the shell's cgroup, which Destroy
    kills. waitid with WNOWAIT leaves G a zombie, whose pid is not reused.
    (MoveG also pins G itself, against a compromised template: the worker
    does not rely on this.)"""
    for pidfd, fork in _forks.items():
        if fd == pidfd:
            _poller.unregister(pidfd)
            _exited(pidfd)
            return
        if fd == fork.go_ahead:
            # The report's EOF, after G is reaped, tells the worker (and
            # the tests) that T is done with this fork.
            _poller.unregister(fd)
            os.read(fd, 1)  # EOF or a byte: the go-ahead
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            for own in (pidfd, *fork.fds()):
                os.close(own)
            del _forks[pidfd]
            return
    raise RuntimeError("poll returned fd %d, which is no fork's" % fd)


def _exited(pidfd):
    """G's pidfd said G exited: report its wait status and wait for the
    go-ahead, or, while a tracer holds the zombie, retry later."""
    fork = _forks[pidfd]
    info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    if info is None:
        _traced.add(pidfd)
        return
    _traced.discard(pidfd)
    try:
        os.write(fork.report, zygote.encode_exit_report(_wait_status(info)))
    except OSError:
        pass  # the worker closed the report's read end (EPIPE: Python ignores SIGPIPE)
    _poller.register(fork.go_ahead, select.POLLIN)


def _wait_status(info):
    """waitid's answer as a wait status (what the exit report carries). G is
    pid 1 of PID_F: everything the code started died before G could finish
    exiting; nothing is left to kill."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    if info.si_code == os.CLD_DUMPED:
        return info.si_status | 0x80
    return info.si_status  # CLD_KILLED


# --- G's birth ---


# struct clone_args (linux/sched.h, CLONE_ARGS_SIZE_VER2), a ctypes
# Structure made at the first clone3 (ctypes is imported lazily).
_clone_args = None


def _clone(cgroup_fd):
    """T's os.fork() for G (TEMPLATE.md sections 2 and 3), returning G's pid
    and a pidfd of G in T ((0, None) in G): clone3 with
    CLONE_NEWUSER | CLONE_NEWPID makes G root of a new user namespace U_F
    (unmapped until T writes its maps) and pid 1 of a new pid namespace
    PID_F owned by U_F, which the shell's runc init joins. On cgroup v2
    (cgroup_fd, TEMPLATE.md section 4) CLONE_INTO_CGROUP puts G straight
    into the shell's cgroup, so that nothing of G ever runs, or is charged,
    outside it and no process is ever moved, and CLONE_NEWCGROUP gives it a
    cgroup namespace rooted there, which G keeps: its /proc/self/cgroup
    reads "0::/" as a cold process's does (the worker sends it back as the
    shell's cgroup namespace).

    One clone, where os.fork() would need a second process between T and G:
    a user namespace is made for a child only by clone (unshare would move
    T itself), and G must be pid 1 of its pid namespace. That process (F)
    cost a copy and a teardown of T's page tables per execution
    (tools/bench/RESULTS.md, "kernel CPU of the fork path"). Python has no
    clone3: it is called through ctypes, with the GIL held (a PyDLL),
    bracketed as os.fork brackets fork(): PyOS_BeforeFork (the import lock,
    os.register_at_fork's before hooks), then PyOS_AfterFork_Child
    (CPython's thread state, random's reseed and the other after-fork
    hooks) or PyOS_AfterFork_Parent. glibc's fork() does more, which a raw
    clone3 skips: its own locks (malloc's, stdio's, the loader's), which
    protect against a lock another thread holds at the fork; the C
    libraries' pthread_atfork handlers; the robust-futex list's
    registration; and the cached thread id. T has one thread when it
    clones (_quiesce, checked before every fork by _why_not_fork), so no
    lock is held by anyone but the caller, who is in none. No C library's
    at-fork handler runs in G: the preload's at-fork work is Python's
    (matplotlib's font cache, random's reseed: os.register_at_fork, which
    PyOS_AfterFork_Child runs), OpenBLAS's pool was stopped in T, and what
    a library keys on its pid G's _reseed redoes (G is pid 1, as T is, so
    a pid check would miss the fork anyway; TEMPLATE.md section 7). No
    robust mutex is shared across processes here, so an unregistered list
    changes nothing. The cached tid
    (glibc's recursive locks, dlopen's among them, name their owner by it)
    is what glibc's fork sets with CLONE_CHILD_SETTID |
    CLONE_CHILD_CLEARTID at the thread's own tid field: the same here, its
    address read from the kernel (PR_GET_TID_ADDRESS: glibc registers that
    very field with set_tid_address)."""
    import ctypes

    global _clone_args
    if _clone_args is None:
        _clone_args = type("CloneArgs", (ctypes.Structure,), {"_fields_": [
            (name, ctypes.c_uint64) for name in ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack",
                                                 "stack_size", "tls", "set_tid", "set_tid_size", "cgroup")]})
    libc = _libc
    tid_address = ctypes.c_void_p()
    _check(libc.prctl(_PR_GET_TID_ADDRESS, ctypes.byref(tid_address), 0, 0, 0) == 0, "prctl(PR_GET_TID_ADDRESS)")
    if not tid_address.value:
        raise RuntimeError("no thread id address registered with the kernel")
    flags = _CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_PIDFD | _CLONE_CHILD_SETTID | _CLONE_CHILD_CLEARTID
    if cgroup_fd is not None:
        flags |= _CLONE_NEWCGROUP | _CLONE_INTO_CGROUP
    pidfd = ctypes.c_int(-1)
    args = _clone_args(flags=flags, pidfd=ctypes.addressof(pidfd), child_tid=tid_address.value,
                       exit_signal=signal.SIGCHLD, cgroup=cgroup_fd if cgroup_fd is not None else 0)
    api = ctypes.PyDLL(None, use_errno=True)  # the GIL stays held, as os.fork holds it
    api.syscall.restype = ctypes.c_long
    nr = _syscall(_SYS_CLONE3)
    api.PyOS_BeforeFork()
    pid = api.syscall(ctypes.c_long(nr), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0, None
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, "clone3(%#x): %s" % (flags, os.strerror(err)))
    return pid, pidfd.value


def _enter_g(fds, t, cgroup):
    """G's first steps, still template code: drop every channel that is T's
    (T's socket, every live fork's bookkeeping, this fork's exit report and
    go-ahead, the cgroup fd), put its own on their protocol numbers, and
    wait until T has written its maps."""
    import fcntl

    # T's socket first: no fork can talk to T (SECURITY.md case 68). Then
    # the other forks' pidfds, reports and go-aheads: with one, G's code
    # could forge another execution's end or signal its process.
    os.close(_template_sock.detach())
    for fd in _live_fork_fds():
        os.close(fd)
    _forks.clear()
    # G's channels onto their numbers (over the reserved ones), by way of
    # numbers above them, so no dup2 closes one still to be moved; the
    # outputs above them too, close-on-exec until G puts them on 1 and 2.
    # The rest is closed: the exit report and the go-ahead are T's, and G
    # holds nothing of the worker's cgroupfs.
    first = max(_fork_targets()) + 1
    mine = list(fds[:2]) + list(fds[FORK_FDS + (FORK_CGROUP_FDS if cgroup else 0):])
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, first) for fd in mine]
    for fd in fds:
        os.close(fd)
    for src, dst in zip(high[:2], _fork_targets()):
        os.dup2(src, dst)
        os.close(src)
    outputs = high[2:]
    if t.recv(1) != b"m":
        raise RuntimeError("T did not write G's id maps")
    t.close()
    # The at-fork hooks (a library's os.register_at_fork) ran in G: a
    # thread one started would outlive the drop's checks unconfined.
    threads = _threads()
    if threads != 1:
        raise RuntimeError("G has %d threads" % threads)
    _g(outputs)


# --- G ---


def _g(outputs):
    """G: pid 1 of PID_F, root of U_F, still in T's other namespaces and
    cgroup. Waits for its shell, confines itself, then serves as a zygote's
    child does."""
    # The fds G keeps past its drop: 0-2 (replaced below), its channels, and
    # what T's check admitted (read-only files of the image: libffi keeps
    # one and maps it again later, so it is not closed behind its back).
    # Decided here, in T's mount namespace, where those files' mount is the
    # root's.
    keep = {0, 1, 2, zygote.CONTROL_FD, zygote.READY_FD}
    # T checked itself before the fork, but the at-fork handlers (the
    # preload's os.register_at_fork) ran after that check, here: whatever
    # they opened is
    # refused (the fork never becomes ready), never closed behind its
    # library's back nor left to the code.
    stray = zygote._stray_fds(keep | set(outputs))
    if stray:
        raise RuntimeError("stray fds in G: " + ", ".join("%d -> %s (%s)" % s for s in stray))
    shared = _shared_mappings()
    if shared:
        raise RuntimeError("shared mappings in G: " + "; ".join(shared))
    admitted = set(_open_fds()) - set(outputs) - keep
    keep |= admitted
    images = _image_files(admitted)
    ctl = socket.socket(fileno=zygote.CONTROL_FD)
    try:
        me = os.pidfd_open(os.getpid())
        socket.send_fds(ctl, [PIDFD_MESSAGE], [me])  # the worker reads G's host pid from it
        os.close(me)
        namespaces = SHELL_NAMESPACES.split()
        got = zygote._receive_request(ctl, len(namespaces) + 1)
    finally:
        ctl.detach()  # CONTROL_FD stays open: the hand-off comes on it
    if got is None:
        os._exit(0)  # the worker gave this fork up before its shell
    msg, nsfds = got
    if len(nsfds) != len(namespaces):
        raise RuntimeError("the join carried %d fds, want %d" % (len(nsfds), len(namespaces)))
    join = json.loads(msg)
    for fd, name in zip(nsfds, namespaces):
        os.setns(fd, _SETNS_FLAGS[name])
        os.close(fd)
    # setns of a mount namespace moves root and cwd to its root.
    os.chdir("/")
    _reopen_image_files(images)
    _take_stdio(outputs)
    uid, gid = join["uid"], join["gid"]
    if not (isinstance(uid, int) and isinstance(gid, int) and uid > 0 and gid > 0):
        raise RuntimeError("the join's ids %r:%r are not a sandbox user's" % (uid, gid))
    _drop(join, uid, gid)
    # Nothing but what was kept (the namespace fds are closed, T's are gone:
    # SECURITY.md case 68).
    extra = [fd for fd in _open_fds() if fd not in keep]
    if extra:
        raise RuntimeError("fds open in G besides those kept: %s" % extra)
    _check_dropped(uid, gid)
    _reseed()
    _replay_site_hooks()
    zygote._serve()


def _image_files(fds):
    """What _reopen_image_files needs of each fd: its path in the image,
    identity, offset and close-on-exec flag."""
    out = {}
    for fd in fds:
        st = os.fstat(fd)
        out[fd] = (os.readlink("/proc/self/fd/%d" % fd), (st.st_dev, st.st_ino), os.lseek(fd, 0, os.SEEK_CUR),
                   not os.get_inheritable(fd))
    return out


def _reopen_image_files(images):
    """Put each image file T's check admitted back on its number, opened
    again in the shell's mount namespace: the same file (same image, which
    the template and its shells share), but no longer through a mount of
    T's namespace, so that no fd the code inherits is (its fdinfo would
    show it; /proc/self/exe and the file mappings still refer to T's root
    mount, the same read-only image). Its library keeps using the number
    as before."""
    for fd, (path, ident, pos, cloexec) in images.items():
        # Read-only, as T's check (zygote._fd_refusal) admits no other.
        new = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(new)
        if (st.st_dev, st.st_ino) != ident:
            raise RuntimeError("%s is not the template's file in the shell (fd %d)" % (path, fd))
        os.lseek(new, pos, os.SEEK_SET)
        os.dup2(new, fd, inheritable=not cloexec)
        os.close(new)


def _open_fds():
    fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    out = []
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:  # the listing's own directory fd, closed by now
            continue
        out.append(fd)
    return out


def _take_stdio(outputs):
    """G's fds 0-2 become its execution's (stdout and stderr from the fork
    request) or /dev/null, opened in the shell's mount namespace. Until now
    they were T's: T's stdin and the pipes of the template's log to the
    worker, which code that kept them could write lines into (forged
    worker-facing messages) and hold open past its execution."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    os.dup2(null, 0)
    out = list(outputs) if outputs else [null, null]
    os.dup2(out[0], 1)
    os.dup2(out[1], 2)
    for fd in {null, *outputs}:
        os.close(fd)


def _check(ok, what):
    import ctypes

    if not ok:
        raise OSError(ctypes.get_errno(), what)


def _syscall(table):
    import platform

    nr = table.get(platform.machine())
    if nr is None:
        raise RuntimeError("no syscall number for %s" % platform.machine())
    return nr


def _drop(join, uid, gid):
    """Bring G to a cold sandbox's process's end state (TEMPLATE.md section
    3 step 7: libcontainer's standard init reaches it in another order),
    checked after by _check_dropped."""
    import ctypes
    import resource

    libc = _libc
    # G's ids are the template root's (host HostIDBase+1), unmapped in U_F:
    # become U_F's root first, so that the change to the sandbox user's ids
    # (the join's uid and gid) below clears every capability (a uid change
    # clears them only when it leaves 0).
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # A session keyring of its own, named as runc names a container's
    # (SECURITY.md case 28): a fork inherits T's, and every execution of the
    # template would otherwise share one, a place to leave keys for the
    # next execution to read.
    keyctl = _syscall(_SYS_KEYCTL)
    name = join["keyring"].encode()
    ring = libc.syscall(keyctl, _KEYCTL_JOIN_SESSION_KEYRING, ctypes.c_char_p(name))
    _check(ring >= 0, "keyctl(KEYCTL_JOIN_SESSION_KEYRING)")
    # runc's ModKeyringPerm: others may search it (in a user namespace).
    buf = ctypes.create_string_buffer(512)
    n = libc.syscall(keyctl, _KEYCTL_DESCRIBE, ring, buf, len(buf))
    _check(0 < n <= len(buf), "keyctl(KEYCTL_DESCRIBE)")
    perm = int(buf.value.split(b";")[3], 16)
    _check(libc.syscall(keyctl, _KEYCTL_SETPERM, ring, perm | _KEY_OTH_SEARCH) == 0, "keyctl(KEYCTL_SETPERM)")
    # The policy's rlimits (nsjail/config.go rlimits; only lowered: T got
    # the policy's from its own sandbox).
    for res, soft, hard in ((r["resource"], r["soft"], r["hard"]) for r in join["rlimits"]):
        resource.setrlimit(res, (_rlim(soft), _rlim(hard)))
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0, "prctl(PR_CAPBSET_DROP)")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) == 0, "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "prctl(PR_SET_NO_NEW_PRIVS)")
    # As a cold process after its execve (the id change cleared it).
    zygote._set_dumpable(libc, True)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    import base64

    prog = base64.b64decode(join["seccomp"])
    if not prog or len(prog) % 8:
        raise RuntimeError("the seccomp program is %d bytes" % len(prog))
    fprog = SockFprog(len(prog) // 8, prog)
    rc = libc.syscall(_syscall(_SYS_SECCOMP), _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog))
    _check(rc == 0, "seccomp(SECCOMP_SET_MODE_FILTER)")


def _rlim(v):
    import resource

    return resource.RLIM_INFINITY if v >= 1 << 63 else v


def _check_dropped(uid, gid):
    """G refuses to become ready unless the kernel says it is confined: no
    capability in any set, the sandbox's ids, no_new_privs, a seccomp
    filter, one thread (SECURITY.md case 67: no request data reaches G
    before this)."""
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    want = {
        "CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16, "CapAmb": "0" * 16,
        "NoNewPrivs": "1", "Seccomp": "2", "Threads": "1",
        "Uid": "\t".join([str(uid)] * 4), "Gid": "\t".join([str(gid)] * 4), "Groups": "",
    }
    bad = {k: status.get(k, "").strip() for k, v in want.items() if status.get(k, "").strip() != v.strip()}
    if bad:
        raise RuntimeError("G is not confined: %r" % bad)


def _reseed():
    """Give G its own state wherever the preload left per-process random
    state at import (TEMPLATE.md section 7, experiment E6; SECURITY.md case
    64): a fork starts with T's memory, and G is pid 1 as T is, so a
    library's own after-fork check by pid does not fire either. Only what
    is imported is touched (nothing new is imported here); each line names
    what it reseeds. random's global generator needs nothing: CPython
    reseeds it in every fork (os.register_at_fork)."""
    # NumPy's legacy global RandomState (numpy.random.random, pandas'
    # sample), seeded at import: a fresh bit generator, as a cold import
    # makes it (seed() leaves it without a seed sequence to spawn from;
    # NumPy before 1.25 has only seed()).
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        if hasattr(np_random, "set_bit_generator"):
            np_random.set_bit_generator(np_random.MT19937())
        else:
            np_random.seed()
    # multiprocessing's authkey (its connections' HMAC key), made from
    # os.urandom at import.
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        mp_process.current_process().authkey = os.urandom(32)
    # OpenSSL's DRBG, if T drew from it (an SSLContext made at import
    # does): OpenSSL reseeds after a fork only when getpid() changed.
    ssl = sys.modules.get("_ssl")
    if ssl is not None:
        ssl.RAND_add(os.urandom(32), 32.0)
    # tempfile's name generator, if T named a temporary file: it makes a
    # new one only when getpid() changed. Dropped, as in a cold process
    # before its first temporary file.
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None



def _replay_site_hooks():
    """Redo in G what the image's interpreter start wrote into the sandbox's
    own writable directories. T's start wrote it into T's /tmp, which G, in
    the shell's mount namespace since its setns, does not see; a cold
    process's start (and a zygote's) writes it into the sandbox's. The
    runtime image has one such hook, sandboxd_mplcache
    (tools/runtime-image): imported by a .pth file, it copies matplotlib's
    prebuilt font list into MPLCONFIGDIR (/tmp/matplotlib). Without it a
    fork's /tmp lacks the file a cold run's has, and matplotlib imported by
    the code rebuilds its font list. The module is run again in its own
    namespace (what importlib.reload does, without importing importlib), as
    the sandbox user: the same copy, owned as a cold run's."""
    hook = sys.modules.get("sandboxd_mplcache")
    spec = getattr(hook, "__spec__", None)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(hook)


if __name__ == "__main__":
    _template()
