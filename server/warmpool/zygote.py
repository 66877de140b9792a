# The warm pool's waiting interpreter. It runs as the first process (pid 1)
# of a fresh, single-use sandbox, started with -P so that no directory the
# sandbox can write is on its sys.path (SECURITY.md case 35). It imports the
# preload modules, then forks the process the code will run in and tells
# the pool it is ready with READY_BYTE on READY_FD (written by that
# process once it has rehearsed a hand-off: _rehearse). That process waits on
# CONTROL_FD for one execution, the hand-off message (decode_handoff: the
# runner's job: the file's path, its argv, the cwd, display and figures)
# and with it, maybe, the execution's events fd, closes the protocol's fds,
# leaving only 0-2 and the events fd on the runner's EVENTS_FD (the zygote
# refuses to start if the preload left any other fd open but read-only
# files of the image: _check_no_stray_fds), and runs the file through the runner
# (server/runner/runner.py, the zygote's second argument, loaded before the
# preload), exactly as a cold execution runs it: as `python3 path` would. EOF on CONTROL_FD
# without a message means the pool is retiring this sandbox: it exits 0
# quietly. A hand-off with "kernel" set makes it a session's kernel instead
# (_kernel): it keeps CONTROL_FD and runs execution after execution, each a
# notebook cell in one persistent namespace, until EOF or its death.
#
# The zygote itself never runs the code. It waits for the code's process,
# kills whatever that left behind, writes the process's wait status (as the
# kernel gave it) on EXIT_REPORT_FD, which the code has no way to reach,
# and exits with the same status. The sandbox is destroyed afterwards;
# nothing here is ever reused.
#
# The whole exchange is server/warmpool/protocol.go's; the block below
# mirrors its constants, and its tests check that both sides agree.
import os
import select
import signal
import sys
import types

# --- PROTOCOL (server/warmpool/protocol.go) ---
CONTROL_FD = 3
READY_FD = 4
EXIT_REPORT_FD = 5
READY_BYTE = b"R"
PRELOAD_SEP = ","
MESSAGE_END = b"\n"
KERNEL_READY_SEQ = 0
KERNEL_FDS = 3
CELL_NAME_FORMAT = "<cell %d>"
# --- end PROTOCOL ---

_PR_SET_DUMPABLE = 4
_STRAY_FD_EXIT = 70  # EX_SOFTWARE: the preload left an fd open


def decode_handoff(message):
    """The hand-off message (protocol.go's Handoff) as (job, kernel,
    cwd_on_path, events): job is the runner's (runner.go's Job), events
    says an events fd came with it."""
    import json

    h = json.loads(message)
    path = h["path"]
    job = {
        "path": path,
        "argv": h.get("argv") or [path],
        "cwd": h.get("cwd") or "/",
        "display": bool(h.get("display")),
        "figures": bool(h.get("figures")),
        "done": bool(h.get("done")),
    }
    return job, bool(h.get("kernel")), bool(h.get("cwd_on_path")), bool(h.get("events"))


def decode_request(message):
    """A kernel's execution (protocol.go's KernelRequest) as (seq, code,
    env, display, figures, drop_interrupt)."""
    import json

    req = json.loads(message)
    return (
        req["seq"],
        req["code"],
        req.get("env") or {},
        bool(req.get("display")),
        bool(req.get("figures")),
        bool(req.get("drop_interrupt")),
    )


def encode_reply(seq, exit_code):
    """A kernel's answer (protocol.go's KernelReply, DecodeKernelReply)."""
    import json

    return json.dumps({"seq": seq, "exit_code": exit_code}).encode() + MESSAGE_END


def encode_exit_report(status):
    """The exit report of a wait status (protocol.go's DecodeExitReport)."""
    return b"%d" % status + MESSAGE_END


_runner = None  # server/runner/runner.py, loaded by _load_runner


def _load_runner(source):
    """The runner as a module of its own (not importable by name): the same
    source a cold execution runs with -c."""
    global _runner
    mod = types.ModuleType("sandboxd_runner")
    exec(compile(source, "<sandboxd runner>", "exec", dont_inherit=True), mod.__dict__)
    _runner = mod


def _preload(names):
    for name in names:
        if not name:
            continue
        try:
            __import__(name)
        except Exception as exc:  # a broken preload must not break the run
            sys.stderr.write("zygote: preload %s failed: %r\n" % (name, exc))


def _libc():
    """libc through ctypes, for prctl. Loaded before _check_no_stray_fds, so
    that what `import ctypes` leaves open (libffi's fd) is checked too."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _set_dumpable(libc, on):
    import ctypes

    if libc.prctl(_PR_SET_DUMPABLE, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def _drop_signal_handlers():
    """Reset every handler Python or a preload installed and return them.

    As init of its pid namespace, a process with no handler ignores every
    signal sent from inside the namespace, SIGKILL and SIGSTOP included
    (pid_namespaces(7)): the code can neither stop nor kill the zygote."""
    saved = {}
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if callable(handler):
            saved[sig] = handler
            signal.signal(sig, signal.SIG_DFL)
    with open("/proc/self/status") as f:
        caught = [line for line in f if line.startswith("SigCgt:")]
    if not caught or int(caught[0].split()[1], 16) != 0:
        raise RuntimeError("zygote: a signal handler is still installed: %r" % caught)
    return saved


def _fork_code_process(libc):
    """Fork the process the code will run in; return its pid in the zygote.

    The zygote becomes unreachable from that process first (SECURITY.md
    case 25): not dumpable, so /proc/1/fd, /proc/1/mem and the like are
    refused (ptrace, process_vm_writev and pidfd_getfd are refused by
    seccomp anyway), and without signal handlers. The child restores both,
    so the code sees what a cold `python3 FILE` would."""
    import gc
    import warnings

    # Objects the preload made are never collected: keep the collector from
    # writing to them, so the child's pages stay shared with the zygote's.
    gc.freeze()
    handlers = _drop_signal_handlers()
    _set_dumpable(libc, False)
    with warnings.catch_warnings():
        # A preload's idle threads (OpenBLAS) make 3.12+ warn about fork;
        # the libraries that start them reinitialise in the child.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    _set_dumpable(libc, True)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    os.close(EXIT_REPORT_FD)
    _serve()


def _serve():
    """The code's process from its rehearsal on: READY, then one hand-off
    (or a kernel's). Only CONTROL_FD and READY_FD of the protocol's fds
    are open. Also run by a template's fork G once it is confined
    (template.py)."""
    _rehearse()
    # Ready only now: a hand-off never waits for the rehearsal. The zygote
    # closed its copy of READY_FD, so this process dying first is an EOF
    # to the pool, not a ready sandbox.
    os.write(READY_FD, READY_BYTE)
    os.close(READY_FD)
    msg, fds = _receive()
    if msg is None:
        os._exit(0)
    job, kernel, cwd_on_path, events = decode_handoff(msg)
    if kernel or not events:
        for fd in fds:
            os.close(fd)
        fds = []
    if kernel:
        _kernel(job["cwd"], cwd_on_path)
    else:
        os.close(CONTROL_FD)
        events_fd = None
        if fds:
            # The events fd, where a cold run has it.
            events_fd = _runner.EVENTS_FD
            os.dup2(fds[0], events_fd)
            for fd in fds:
                if fd != events_fd:
                    os.close(fd)
        _runner.run_file(job, events_fd)
    os._exit(1)  # not reached: both exit


def _rehearse():
    """Run once, on dummy input, what a kernel's hand-off and first cell
    run (the hand-off's setup, _kernel_setup, and a cell that prints and
    displays, through _execute), then put back everything that changed,
    before READY.

    After the fork every page this process writes first is copied from the
    zygote's (copy-on-write), and Python writes wherever it goes: reference
    counts, the interpreter's specialised bytecode, allocator pools. On the
    reference VM such a fault costs ~35 us: unrehearsed, a hand-off took
    ~160 of them and its first cell ~190, most of the kernel's answer; with
    the cell alone rehearsed, the hand-off's setup still took ~40 (~25 of
    them making the unbuffered streams) and the first cell ~15 more than a
    later one. Rehearsed here, at the pool's low priority and off the
    request path, they are this process's own when the hand-off comes
    (about a MiB: pages the execution would have copied anyway; the rest
    stays shared, as an idle session's memory counts on it).

    Nothing of any request exists yet: only the zygote's and the runner's
    code runs, in the process that will run the code anyway (it is
    already dumpable and has the handlers back). Put back afterwards, so a
    single-shot run or a kernel starts as without it: fds 1 and 2, the
    streams (sys.stdout, sys.__stdout__ and the streams kept open), the
    working directory, sys.argv, sys.path, sys.modules["__main__"], the
    SIGINT handler, the kernel's cell sources and linecache, the interrupt
    flag, and what the figure capture patched (pyplot's show and
    Figure.savefig, sys.meta_path). A failure here is the runner's or the
    zygote's bug: it is raised, and the sandbox never becomes ready."""
    import linecache
    import socket

    global _interrupt_pending, _cell_source_chars
    saved_fds = (os.dup(1), os.dup(2))
    saved_streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    saved_kept = list(_runner._kept_streams)
    saved_cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    saved_main = sys.modules.get("__main__")
    # The cell captures figures, as a kernel's first cell does by default
    # (an unrehearsed capture cost a first cell ~70 page copies and 3 ms of
    # CPU): what that patches into pyplot or adds to sys.meta_path is put
    # back below, so that a request without figure capture finds them as a
    # cold run would. Not when a preload left figures open: the capture
    # would save them into the workspace and close them.
    figures = _runner.open_figure_count() == 0
    saved_pyplot = _runner.pyplot_patch_state()
    saved_sigint = signal.getsignal(signal.SIGINT)
    saved_interrupt = _interrupt_pending
    saved_sources, saved_chars = list(_cell_sources), _cell_source_chars
    ours, theirs = socket.socketpair()
    sock = None
    pipes = [os.pipe() for _ in range(KERNEL_FDS)]
    try:
        # The hand-off: a message and an fd, as the pool sends them, and
        # the kernel's setup, on a socket of its own (as on CONTROL_FD).
        socket.send_fds(ours, [b'{"path":"/dev/null","cwd":"/","kernel":true,"cwd_on_path":true}' + MESSAGE_END],
                        [pipes[0][1]])
        msg, fds = _receive(theirs.fileno())
        for fd in fds:
            os.close(fd)
        job, _, cwd_on_path, _ = decode_handoff(msg)
        sock, main, libc = _kernel_setup(os.dup(theirs.fileno()), job["cwd"], cwd_on_path)
        # A cell: its request with its stdout, stderr and events fds, run
        # through _execute as a kernel runs it, and its reply.
        socket.send_fds(ours, [b'{"seq":1,"code":"print(1)\\nx = 1\\nx","env":{},"display":true}' + MESSAGE_END],
                        [w for _, w in pipes])
        for _, w in pipes:
            os.close(w)
        pipes = [(r, None) for r, _ in pipes]
        msg, fds = _receive_request(sock)
        seq, code, env, display, _, _ = decode_request(msg)
        if _execute(main, seq, code, env, fds, libc, display, figures) != 0:
            raise RuntimeError("zygote: the rehearsal's cell failed")
        sock.sendall(encode_reply(seq, 0))
    finally:
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved_streams
        _runner._kept_streams[:] = saved_kept
        os.fchdir(saved_cwd)
        os.close(saved_cwd)
        sys.argv[:], sys.path[:] = saved_argv, saved_path
        if saved_main is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = saved_main
        _runner.restore_pyplot_patch_state(saved_pyplot)
        signal.signal(signal.SIGINT, saved_sigint)
        _interrupt_pending = saved_interrupt
        for name, _ in _cell_sources[len(saved_sources):]:
            linecache.cache.pop(name, None)
        _cell_sources[:] = saved_sources
        _cell_source_chars = saved_chars
        if sock is not None:
            sock.close()
        ours.close()
        theirs.close()
        for r, w in pipes:
            os.close(r)
            if w is not None:
                os.close(w)


def _receive(fd=CONTROL_FD):
    """The hand-off message from fd (CONTROL_FD; another only in
    _rehearse) and the fds that came with it (SCM_RIGHTS), or (None, [])
    at EOF.

    The pool tells a hand-off that never reached the code (the process was
    killed first: by the host, the OOM killer) from bytes left in the
    socket. So wait with poll, which consumes nothing, and read only back in
    user space: a killed process dies on its way back from poll, leaving the
    bytes, where a blocking read would take them as it dies. And read up to
    MESSAGE_END only; the code runs after it."""
    import socket

    sock = socket.socket(fileno=fd)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        data, fds = b"", []
        while not data.endswith(MESSAGE_END):
            poller.poll()
            chunk, got, _, _ = socket.recv_fds(sock, 65536, 4)
            fds += got
            if not chunk:
                for fd in fds:
                    os.close(fd)
                return None, []
            data += chunk
        return data, fds
    finally:
        sock.detach()  # fd stays open: the kernel keeps CONTROL_FD


def _relay_exit_status(pid):
    """The zygote's part once the code's process exists: it runs no code of
    the execution, reads nothing the code can write, and only reports what
    the kernel says about that process."""
    os.close(CONTROL_FD)
    # The code's process holds the output pipes; they end when it does.
    for fd in (0, 1, 2):
        os.close(fd)
    # The code's process says READY, once it has rehearsed (_rehearse).
    os.close(READY_FD)
    _, status = os.waitpid(pid, 0)
    try:
        # Everything the code started dies before the worker hears of the
        # exit, as it would with a cold run's init (the zygote is spared).
        os.kill(-1, signal.SIGKILL)
    except OSError:  # ESRCH: nothing was left
        pass
    os.write(EXIT_REPORT_FD, encode_exit_report(status))
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


# --- the kernel (protocol.go, step 3k) ---

_interrupt_pending = False
_KERNEL_PROTOCOL_EXIT = 76  # EX_PROTOCOL: a request without its fds
# The cells kept in linecache (name, characters), oldest first, and their
# total: the newest within the budget, and the last one whatever its size.
_CELL_SOURCE_BUDGET = 4 << 20
_cell_sources = []
_cell_source_chars = 0


def _note_interrupt(signum, frame):
    """SIGINT between cells: remembered, never raised into the loop."""
    global _interrupt_pending
    _interrupt_pending = True


def _kernel(cwd, cwd_on_path):
    """Loop over a session's executions, each a cell run in one persistent
    __main__, as a notebook does. cwd goes first on sys.path only with
    cwd_on_path: a kernel running the worker's code on the session's files
    (a profile) must not import a module planted there (SECURITY.md case
    45). Every execution brings its own stdout and
    stderr (the pool's pipes, on fds 1 and 2 while it runs; /dev/null
    between executions, where a thread left running writes). A cell's
    SystemExit, exception or KeyboardInterrupt ends the cell, never the
    kernel. The code runs in this very process and may write anything on
    CONTROL_FD: the pool trusts nothing said here beyond a well-formed
    reply with the right seq (SECURITY.md case 39)."""
    global _interrupt_pending
    sock, main, libc = _kernel_setup(CONTROL_FD, cwd, cwd_on_path)
    kernel_pid = os.getpid()
    sock.sendall(encode_reply(KERNEL_READY_SEQ, 0))
    while True:
        got = _receive_request(sock)
        if got is None:
            os._exit(0)  # EOF: the pool is done with this kernel
        msg, fds = got
        if len(fds) != KERNEL_FDS:
            os._exit(_KERNEL_PROTOCOL_EXIT)
        seq, code, env, display, figures, drop_interrupt = decode_request(msg)
        # An interrupt noted while the request was on its way is this
        # execution's (the pool sends SIGINT once it awaits the reply, maybe
        # before this read): kept, and raised as the cell starts
        # (_CellGuard). Unless the pool says a SIGINT for the execution
        # before may have come after its reply: the handlers of signals
        # that came before the request ran by now (decode_request's call),
        # so that one is dropped here.
        if drop_interrupt:
            _interrupt_pending = False
        exit_code = _execute(main, seq, code, env, fds, libc, display, figures)
        if os.getpid() != kernel_pid:
            # A fork made by the cell that returned into the loop: it ends
            # here, as a forked child of a script ends with the script.
            os._exit(exit_code)
        # The cell is over: an interrupt noted since is not the next one's.
        _interrupt_pending = False
        try:
            sock.sendall(encode_reply(seq, exit_code))
        except OSError:
            os._exit(0)


def _kernel_setup(fd, cwd, cwd_on_path):
    """What a kernel does on its hand-off before it says ready (_kernel;
    _rehearse runs it too, on its own socket): returns the socket on fd,
    the cells' __main__ and libc."""
    import ctypes
    import socket
    import types

    sock = socket.socket(fileno=fd)
    # Not inherited by programs the code runs (a fork still has it).
    os.set_inheritable(fd, False)
    _to_devnull()
    # Output is live: every write reaches the execution's pipe at once.
    _runner.unbuffered_streams()
    os.chdir(cwd)
    sys.argv[:] = [""]
    if cwd_on_path:
        # As an interactive interpreter's: modules beside the data import.
        sys.path.insert(0, cwd)
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    signal.signal(signal.SIGINT, _note_interrupt)
    return sock, main, ctypes.CDLL(None)


def _receive_request(sock, maxfds=KERNEL_FDS):
    """One request line and the fds that came with it (at most maxfds a
    message), or None at EOF. template.py reads its lines with it too."""
    import socket

    chunks, fds = [], []
    while not chunks or not chunks[-1].endswith(MESSAGE_END):
        chunk, got, _, _ = socket.recv_fds(sock, 1 << 16, maxfds)
        fds += got
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None
        chunks.append(chunk)
    return b"".join(chunks), fds


def _to_devnull():
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _flush(libc):
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}.values():
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        libc.fflush(None)  # what C code printed
    except BaseException:
        pass


def _execute(main, seq, code, env, fds, libc, display, figures):
    """Run one cell with its own stdout, stderr, events fd and environment,
    through the runner; its exit code (130 for KeyboardInterrupt)."""
    import linecache

    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    _flush(libc)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    os.close(fds[0])
    os.close(fds[1])
    events = _runner.Events(fds[2])
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    name = CELL_NAME_FORMAT % seq
    # Tracebacks and inspect show the cell's lines: the newest cells' only,
    # within _CELL_SOURCE_BUDGET (a long session's sources would grow the
    # kernel's memory without bound).
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    _cell_sources.append((name, len(code)))
    global _cell_source_chars
    _cell_source_chars += len(code)
    while len(_cell_sources) > 1 and _cell_source_chars > _CELL_SOURCE_BUDGET:
        old, size = _cell_sources.pop(0)
        linecache.cache.pop(old, None)
        _cell_source_chars -= size
    try:
        return _runner.run_code(code, name, main.__dict__, events, display, figures, _CellGuard)
    finally:
        events.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _flush(libc)
        _to_devnull()


class _CellGuard:
    """Around the cell's code alone: SIGINT raises KeyboardInterrupt while
    it runs; one that came first (between the request and here) is raised
    at its start. Outside it, SIGINT is only noted (_note_interrupt)."""

    def __enter__(self):
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if _interrupt_pending:
                raise KeyboardInterrupt
        except BaseException:
            signal.signal(signal.SIGINT, _note_interrupt)
            raise
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, _note_interrupt)
        return False


def _check_no_stray_fds():
    """Exit if the preload left an fd open that the code may not inherit.

    The code's process inherits every fd the zygote holds, and closing one
    behind the back of the library that opened it would let that library
    later close, write or mmap an fd number the code reuses. So, as
    Android's zygote does with its fd allowlist, refuse to become warm
    instead: the pool logs this and the execution runs cold (SECURITY.md
    cases 15, 25, 56). Only 0-2, the protocol's fds and fds that give the
    code nothing it could not open itself (_fd_refusal) are let through."""
    stray = _stray_fds()
    if stray:
        sys.stderr.write(
            "zygote: the preload left fds open: %s\n"
            % ", ".join("%d -> %s (%s)" % s for s in stray)
        )
        os._exit(_STRAY_FD_EXIT)


def _stray_fds(allowed=None):
    """The open fds besides allowed (0-2 and the protocol's) that
    _fd_refusal refuses, as (fd, target, why) in fd order."""
    import fcntl

    if allowed is None:
        allowed = {0, 1, 2, CONTROL_FD, READY_FD, EXIT_REPORT_FD}
    root = _root_mount()
    stray = []
    # The listing's own directory fd shows in it, and is closed by now.
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        if fd in allowed:
            continue
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue
        why = _fd_refusal(fd, root)
        if why is None:
            continue
        try:
            target = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            target = "?"
        stray.append((fd, target, why))
    return stray


def _root_mount():
    """The mount id of / (the image's root), or None if / is writable: then
    no fd is admitted."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            return None
        return _mount_id(fd)
    finally:
        os.close(fd)


def _mount_id(fd):
    """The id of the mount fd was opened through (its fdinfo's mnt_id)."""
    with open("/proc/self/fdinfo/%d" % fd) as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    return None


def _fd_refusal(fd, root_mount):
    """Why the code's process may not inherit fd, or None if it may.

    An fd is admitted only if holding it gives the code nothing it could
    not get by open(2) itself (SECURITY.md case 56): opened O_RDONLY (not
    writable, not an O_PATH handle), a regular file (not a directory to
    openat(2) from, a pipe or socket to someone, a device), on the
    sandbox's read-only root mount itself, i.e. a file of the image, which
    no one can change and which the code, with the zygote's own uid, can
    open just the same. libffi >= 3.4's static trampolines keep exactly
    such an fd on libffi's own .so, opened on `import ctypes` (which numpy
    does), to map more trampoline pages later. Everything else, e.g. an fd
    to a file on the workspace (a writable mount), an unlinked temporary
    file, a memfd, /dev/null or an inherited worker file, is refused."""
    import fcntl
    import stat

    if root_mount is None:
        return "the root is writable"
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & os.O_PATH:
        return "O_PATH"
    if flags & 3 != os.O_RDONLY:  # O_ACCMODE
        return "not read-only"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return "not a regular file"
    if _mount_id(fd) != root_mount:
        return "not on the image's root mount"
    return None


def _zygote():
    # argv: the runner's source, then the preload (protocol.go's zygoteArgs).
    _load_runner(sys.argv[1])
    _preload(sys.argv[2].split(PRELOAD_SEP) if len(sys.argv) > 2 else [])
    libc = _libc()
    _check_no_stray_fds()
    _relay_exit_status(_fork_code_process(libc))


if __name__ == "__main__":
    _zygote()
