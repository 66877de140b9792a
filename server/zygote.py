# The warm pool's waiting interpreter. It runs as the first process of a
# fresh, single-use sandbox, imports the preload modules, then blocks on fd 3
# (after writing one byte on fd 4 to say it is ready) until the worker hands
# it one execution:
#   {"path": "/workspace/code/main.py", "argv": [...], "cwd": "/workspace"}
# and runs that file exactly as `python3 path` would: __name__ == "__main__",
# __file__, sys.argv, sys.path[0], cwd, exit codes and tracebacks. The sandbox
# is destroyed afterwards; nothing here is ever reused. Just before exiting it
# reports the exit status on fd 5. EOF on fd 3 without a
# message means the pool is retiring this sandbox: exit 0 quietly.
import os
import sys


def _preload(names):
    for name in names:
        if not name:
            continue
        try:
            __import__(name)
        except Exception as exc:  # a broken preload must not break the run
            sys.stderr.write("zygote: preload %s failed: %r\n" % (name, exc))


def _receive():
    chunks = []
    while True:
        chunk = os.read(3, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(3)
    return b"".join(chunks)


def _run(msg):
    import json
    import types
    from importlib.machinery import SourceFileLoader

    job = json.loads(msg)
    path = job["path"]
    os.chdir(job.get("cwd") or "/")
    sys.argv[:] = job.get("argv") or [path]
    try:
        sys.orig_argv[:] = ["python3"] + sys.argv
    except AttributeError:
        pass
    sys.path[0] = os.path.dirname(path)

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__loader__ = SourceFileLoader("__main__", path)
    main.__spec__ = None
    main.__package__ = None
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    opened = _track_open()

    code = 0
    try:
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        # What the interpreter prints for an uncaught exception, minus this
        # frame (a SyntaxError has no frame of the user's file to keep).
        # Since 3.12 the hook prints exc.__traceback__, so trim it there.
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        exc.__traceback__ = tb
        sys.excepthook(type(exc), exc, tb)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    _finish(code, main, opened)


def _exit_code(exc):
    """The exit status the interpreter derives from an uncaught SystemExit."""
    c = exc.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(str(c) + "\n")
    except Exception:
        pass
    return 1


def _track_open():
    """Remember every file the user's code opens, so that _finish can flush
    one left open (the interpreter's teardown would have)."""
    import builtins
    import functools
    import io
    import weakref

    opened = weakref.WeakSet()
    real_open = io.open

    @functools.wraps(real_open)
    def open(*args, **kwargs):
        f = real_open(*args, **kwargs)
        try:
            opened.add(f)
        except TypeError:
            pass
        return f

    builtins.open = io.open = open
    return opened


def _finish(code, main, opened):
    """Exit as Py_FinalizeEx would, without its teardown of every module.

    Tearing down numpy, pandas and matplotlib costs ~100-200 ms of pure
    overhead after the user's code is done. The observable steps are kept,
    in the interpreter's order: join non-daemon threads, run atexit
    callbacks, drop the user's globals (closing their files, running their
    __del__), flush every file the code left open and the standard streams;
    then _exit. The sandbox is destroyed right after, so nothing else is
    leaked."""
    import atexit
    import threading

    try:
        threading._shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    try:
        main.__dict__.clear()
    except BaseException:
        pass
    for f in list(opened):
        try:
            if not f.closed:
                f.flush()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if code == 0:
                code = 120  # what the interpreter returns when the flush fails
    # Close our ends of the output pipes, then report the status on fd 5:
    # the worker answers at once instead of waiting ~8 ms for the kernel to
    # tear down this large address space.
    for fd in (1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        os.write(_STATUS_FD, b"%d\n" % code)
    except OSError:
        pass
    os._exit(code)


_STATUS_FD = 5


def _zygote():
    # The status pipe must not leak into programs the user's code executes.
    os.set_inheritable(_STATUS_FD, False)
    _preload(sys.argv[1].split(",") if len(sys.argv) > 1 else [])
    # Tell the pool this sandbox is ready: one byte on fd 4.
    os.write(4, b"R")
    os.close(4)
    msg = _receive()
    if not msg:
        sys.exit(0)
    _run(msg)


if __name__ == "__main__":
    _zygote()
