# sandboxd's runner: the one code path that runs a user's Python inside a
# sandbox, for a cold single-shot execution (`python3 -P -c RUNNER JOB`),
# a warm one (zygote.py loads this source and hands it the job) and every
# cell of a session's kernel (zygote.py's loop calls run_code). It runs the
# code as `python3 FILE` would (or as a notebook cell), prints an uncaught
# exception as Python prints it, minus this harness's frames, and reports
# what an agent acts on as JSON lines on an events fd (runner.go): the
# typed error, the value of a final expression, the figures it saved.
#
# Everything here runs in the user's process, with the user's privileges:
# the code can rewrite any of it, and write anything on the events fd. The
# worker trusts none of it (runner.go's Reader, SECURITY.md case 50); the
# budgets below only keep honest answers small.
#
# The events protocol is server/runner/runner.go's; the block below mirrors
# its constants, and its tests check that both sides agree.
import ast
import difflib
import functools
import io
import json
import linecache
import os
import reprlib
import sys
import time
import traceback
import types
import weakref

# --- PROTOCOL (server/runner/runner.go) ---
EVENTS_FD = 3
EVENT_ERROR = "error"
EVENT_DISPLAY = "display"
EVENT_FIGURE = "figure"
EVENT_DONE = "done"
MIME_TEXT = "text/plain"
MIME_MARKDOWN = "text/markdown"
FIGURE_NAME_FORMAT = "figure-%d.png"
ARTIFACTS_DIR = "/workspace/output/artifacts"
MAX_LINE_BYTES = 262144
MAX_FIGURES = 64
# --- end PROTOCOL ---

# The runner's own budgets (characters): an honest answer stays well under
# MAX_LINE_BYTES even when every character is escaped.
_TEXT_CHARS = 16000  # error text: head and tail kept
_TEXT_HEAD = 3000
_MESSAGE_CHARS = 2000
_FILE_CHARS = 200  # a frame's file
_FUNCTION_CHARS = 100  # a frame's function, the error's type
_SOURCE_CHARS = 200  # a frame's source line
_FRAMES = 30  # frames in error.traceback: first and last kept
_FRAMES_HEAD = 10
_HINT_COLUMNS = 40
_HINT_CHARS = 1000
_DISPLAY_CHARS = 12000  # each of a display's mime texts
_TABLE_ROWS = 5  # head and tail rows of a DataFrame's table
_TABLE_COLUMNS = 20  # columns shown (first and last half)
_CELL_CHARS = 40

# How long the runner waits to be ended after its done event (seconds).
_DONE_WAIT = 2

# An uncaught KeyboardInterrupt's exit code, as a shell shows a SIGINT
# death (128 + 2): a cell's in protocol.go's KernelReply.
_EXIT_INTERRUPTED = 130
_real_open = io.open  # before anything wraps it (_track_open)


class Events:
    """The execution's events fd. Only the fd that was there at the start is
    written: code that closed it and opened another file on its number gets
    no event lines in that file."""

    def __init__(self, fd):
        self.fd, self.ident, self.pid = None, None, os.getpid()
        if fd is None or fd < 0:
            return
        try:
            st = os.fstat(fd)
            # Not inherited by programs the code runs (a fork still has it).
            os.set_inheritable(fd, False)
        except OSError:
            return
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)

    def _ours(self):
        """The fd is still the pipe it was at the start."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def emit(self, event, start=b""):
        """Write one event line (after start); False when it could not be
        written whole (too long, or the fd is gone)."""
        if self.fd is None:
            return False
        data = start + (json.dumps(event, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")
        if len(data) > MAX_LINE_BYTES or not self._ours():
            return False
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError:
            return False
        return True

    def done(self, exit_code):
        """The done event (runner.go's Job.Done): say the execution is
        over, with the exit code this process is about to exit with, then
        wait for the worker, which freezes the sandbox on the word and
        kills it once it has read it. The line starts on a line of its own
        (a newline first: the code may have left one open). Returns, for
        the caller to exit, when the event could not be written, after
        _DONE_WAIT seconds (the worker never read it: the code flooded the
        pipe past its bound, say; the exit then ends the execution, with
        the same code), and at once in a process the code forked that ends
        the script too: as a forked child of a script, it only exits, and
        the execution's end is the process's that ran it."""
        if os.getpid() != self.pid or not self.emit({"type": EVENT_DONE, "exit_code": exit_code}, b"\n"):
            return
        try:
            time.sleep(_DONE_WAIT)
        except BaseException:
            pass  # a handler the code left raised: exit

    def close(self):
        """Close the fd, unless the code closed it and its number is now a
        file of the code's."""
        if self.fd is not None and self._ours():
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = None


# --- running code ---


def run_code(source, filename, namespace, events, display=False, figures=False, guard=None):
    """Run source (str or bytes) compiled as filename in namespace, as
    `python3 FILE` runs a file or a notebook a cell, and report its events.
    Returns the exit code: 0, 1 for an uncaught exception, N for
    SystemExit(N), 130 for KeyboardInterrupt. guard, when given, is a
    context manager class wrapped around the code alone (the kernel's
    SIGINT); its frames are the harness's too, removed from tracebacks."""
    capture = _FigureCapture(events) if figures else None
    global _current_capture
    _current_capture = capture
    if capture is not None:
        _install_pyplot_hook()
    exit_code, exc, value = 0, None, _NOTHING
    try:
        body, last = _compile(source, filename, display)
        with guard() if guard is not None else _no_guard():
            exec(body, namespace)
            if last is not None:
                value = eval(last, namespace)
    except SystemExit as e:
        exit_code = _exit_code(e)
    except BaseException as e:
        exc = e
        exit_code = _EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else 1
    try:
        if exc is not None:
            _drop_harness_frames(exc, _harness_globals(guard))
            try:
                # What the interpreter prints for an uncaught exception.
                sys.excepthook(type(exc), exc, exc.__traceback__)
            except BaseException:
                pass
        if capture is not None:
            capture.finish()
        if exc is not None:
            err = describe_error(exc, filename)
            if not events.emit({"type": EVENT_ERROR, "error": err}):
                # Over the line's bound (escaped text): the text's tail.
                err["traceback"], err["text"] = [], _clip_middle(err["text"], 2000, 0)
                events.emit({"type": EVENT_ERROR, "error": err})
        elif value is not _NOTHING and value is not None:
            events.emit({"type": EVENT_DISPLAY, "mime": mime_bundle(value)})
    finally:
        _current_capture = None
    return exit_code


_NOTHING = object()


class _no_guard:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _compile(source, filename, display):
    """The code object to exec and, when display is asked and the code ends
    with an expression (not silenced by a trailing ';', as in a notebook),
    that expression's code object to eval after it."""
    if not display or _silenced(source):
        return compile(source, filename, "exec", dont_inherit=True), None
    tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return compile(tree, filename, "exec", dont_inherit=True), None
    last = tree.body.pop()
    body = compile(tree, filename, "exec", dont_inherit=True)
    # The body's `from __future__` imports apply to the expression too.
    flags = body.co_flags & _FUTURE_FLAGS
    return body, compile(ast.Expression(last.value), filename, "eval", flags, dont_inherit=True)


def _future_flags():
    import __future__

    flags = 0
    for name in __future__.all_feature_names:
        flags |= getattr(__future__, name).compiler_flag
    return flags


_FUTURE_FLAGS = _future_flags()


def _silenced(source):
    end = source.rstrip()
    return end.endswith(b";" if isinstance(end, bytes) else ";")


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


# --- typed errors ---


def _harness_globals(guard):
    """The globals of the harness's code: this runner's and, with a guard,
    the guard's module's (zygote.py's _CellGuard: an interrupt pending as a
    cell starts is raised in its __enter__)."""
    harness = [globals()]
    enter = getattr(guard, "__enter__", None)
    g = getattr(enter, "__globals__", None)
    if isinstance(g, dict) and g is not harness[0]:
        harness.append(g)
    return harness


def _drop_harness_frames(exc, harness, seen=None):
    """Remove the harness's frames (those whose globals are one of harness)
    from the tracebacks of exc and of every exception chained or grouped
    with it, so that they print as Python prints an uncaught exception of
    the user's file."""
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if not any(tb.tb_frame.f_globals is g for g in harness):
            kept.append(tb)
        tb = tb.tb_next
    if len(kept) != _tb_len(exc.__traceback__):
        new = None
        for t in reversed(kept):
            new = types.TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
        exc.__traceback__ = new
    _drop_harness_frames(exc.__cause__, harness, seen)
    _drop_harness_frames(exc.__context__, harness, seen)
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            _drop_harness_frames(sub, harness, seen)


def _tb_len(tb):
    n = 0
    while tb is not None:
        n, tb = n + 1, tb.tb_next
    return n


def type_name(t):
    """The exception type as Python prints it: qualified, module first
    unless builtins or __main__."""
    mod, qual = getattr(t, "__module__", None), getattr(t, "__qualname__", t.__name__)
    if mod in (None, "builtins", "__main__") or not isinstance(mod, str):
        return qual
    return mod + "." + qual


def describe_error(exc, filename):
    """The typed error of an uncaught exception (runner.go's Error)."""
    try:
        summary = traceback.extract_tb(exc.__traceback__)
    except BaseException:
        summary = []
    frames = [
        {
            "file": _clip(str(f.filename), _FILE_CHARS),
            "line": f.lineno or 0,
            "function": _clip(str(f.name), _FUNCTION_CHARS),
            "source": _clip((f.line or "").strip(), _SOURCE_CHARS),
        }
        for f in summary
    ]
    if len(frames) > _FRAMES:
        frames = frames[:_FRAMES_HEAD] + frames[len(frames) - (_FRAMES - _FRAMES_HEAD) :]
    line = None
    for f in reversed(summary):
        if f.filename == filename:
            line = f.lineno
            break
    err = {
        "type": _clip(type_name(type(exc)), _FUNCTION_CHARS),
        "message": _clip(_message(exc), _MESSAGE_CHARS),
        "line": line,
        "traceback": frames,
        "text": _clip_middle(_text(exc), _TEXT_CHARS, _TEXT_HEAD),
    }
    if isinstance(exc, SyntaxError) and exc.filename == filename and line is None:
        # The code did not compile: no frame of it ran.
        if isinstance(exc.lineno, int) and exc.lineno > 0:
            err["line"] = exc.lineno
        if isinstance(exc.offset, int) and exc.offset > 0:
            err["offset"] = exc.offset
    hint = _key_error_hint(exc)
    if hint:
        err["hint"] = hint
    return err


def _message(exc):
    if isinstance(exc, SyntaxError) and isinstance(exc.msg, str):
        return exc.msg
    try:
        return str(exc)
    except BaseException:
        return "<exception str() failed>"


def _text(exc):
    try:
        return "".join(traceback.format_exception(exc))
    except BaseException:
        return type_name(type(exc)) + ": " + _message(exc) + "\n"


def _key_error_hint(exc):
    """For a KeyError raised looking up a DataFrame's column: the columns
    it has, bounded, and the closest ones to the missing key."""
    if not isinstance(exc, KeyError) or not exc.args:
        return None
    pd = sys.modules.get("pandas")
    frame_type = getattr(pd, "DataFrame", None)
    if not isinstance(frame_type, type):
        return None
    df = None
    tb = exc.__traceback__
    while tb is not None and df is None:
        try:
            s = tb.tb_frame.f_locals.get("self")
            if isinstance(s, frame_type):
                df = s
            elif type(s).__module__.startswith("pandas.") and isinstance(getattr(s, "obj", None), frame_type):
                df = s.obj  # an indexer: df.loc[...]
        except BaseException:
            pass
        tb = tb.tb_next
    if df is None:
        return None
    try:
        key = exc.args[0]
        columns = list(df.columns)
        if key in columns:
            return None
        names = [_clip(repr(c), 60) for c in columns[:_HINT_COLUMNS]]
        more = len(columns) - len(names)
        text = "%s is not a column of the DataFrame." % _clip(repr(key), 100)
        if isinstance(key, str):
            strs = [c for c in columns if isinstance(c, str)]
            close = [c for c in strs if c.lower() == key.lower()] or difflib.get_close_matches(key, strs, n=3)
            if close:
                text += " Did you mean %s?" % " or ".join(_clip(repr(c), 60) for c in close[:3])
        text += " Its %d columns: %s%s" % (len(columns), ", ".join(names), " and %d more" % more if more > 0 else "")
        return _clip(text, _HINT_CHARS)
    except BaseException:
        return None


def _clip(s, n):
    return s if len(s) <= n else s[: n - 1] + "…"


def _clip_middle(s, n, head):
    if len(s) <= n:
        return s
    tail = n - head
    return "%s\n[… %d characters omitted …]\n%s" % (s[:head], len(s) - n, s[-tail:])


# --- displayed values ---


def mime_bundle(value):
    """The display of a final expression's value: text/plain always, and
    text/markdown for a DataFrame or Series (runner.go's Display)."""
    out = {MIME_TEXT: _plain(value)}
    pd = sys.modules.get("pandas")
    try:
        if pd is not None and isinstance(value, pd.DataFrame):
            out[MIME_MARKDOWN] = _clip(_frame_markdown(value), _DISPLAY_CHARS)
        elif pd is not None and isinstance(value, pd.Series):
            out[MIME_MARKDOWN] = _clip(_series_markdown(value), _DISPLAY_CHARS)
    except BaseException:
        pass
    return out


def _short_repr():
    r = reprlib.Repr()
    r.maxlevel = 4
    r.maxtuple = r.maxlist = r.maxarray = r.maxdeque = r.maxset = r.maxfrozenset = 100
    r.maxdict = 50
    r.maxstring = r.maxlong = r.maxother = _DISPLAY_CHARS
    return r


_REPR = _short_repr()
_BIG_CONTAINER = 1000


def _plain(value):
    try:
        if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > _BIG_CONTAINER:
            s = _REPR.repr(value)  # never builds megabytes
        else:
            s = repr(value)
    except BaseException as e:
        s = "<%s object; repr() failed: %s>" % (type_name(type(value)), type_name(type(e)))
    return _clip_middle(s, _DISPLAY_CHARS, _DISPLAY_CHARS // 2)


def _cell(v):
    s = v if isinstance(v, str) else str(v)
    s = s.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    return _clip(s, _CELL_CHARS)


def _positions(n, keep):
    """Positions shown of n: all, or the first and last keep//2 with None
    for the gap."""
    if n <= keep:
        return list(range(n))
    half = keep // 2
    return list(range(half)) + [None] + list(range(n - (keep - half), n))


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _frame_markdown(df):
    n, m = df.shape
    cols = _positions(m, _TABLE_COLUMNS)
    rows = _positions(n, 2 * _TABLE_ROWS)
    dtypes = df.dtypes
    head = "**DataFrame**: %d rows × %d columns\n\n" % (n, m)
    head += "dtypes: " + ", ".join(
        "…" if j is None else "%s: %s" % (_cell(df.columns[j]), _cell(dtypes.iloc[j])) for j in cols
    )
    header = [""] + ["…" if j is None else _cell(df.columns[j]) for j in cols]
    shown = df.iloc[[i for i in rows if i is not None], [j for j in cols if j is not None]]
    values = shown.values.tolist()
    labels = list(shown.index)
    body, k = [], 0
    for i in rows:
        if i is None:
            body.append(["…"] * len(header))
            continue
        vals, c = values[k], 0
        line = [_cell(labels[k])]
        for j in cols:
            if j is None:
                line.append("…")
            else:
                line.append(_cell(vals[c]))
                c += 1
        body.append(line)
        k += 1
    return head + "\n\n" + _table(header, body)


def _series_markdown(s):
    n = len(s)
    rows = _positions(n, 2 * _TABLE_ROWS)
    name = "" if s.name is None else " %s" % _cell(s.name)
    head = "**Series**%s: %d rows, dtype: %s\n\n" % (name, n, _cell(s.dtype))
    shown = s.iloc[[i for i in rows if i is not None]]
    values, labels = shown.tolist(), list(shown.index)
    body, k = [], 0
    for i in rows:
        if i is None:
            body.append(["…", "…"])
            continue
        body.append([_cell(labels[k]), _cell(values[k])])
        k += 1
    return head + _table(["", "value" if s.name is None else _cell(s.name)], body)


# --- figures ---

_current_capture = None  # the running execution's _FigureCapture
_saved_figures = weakref.WeakSet()  # figures the code saved as artifacts itself
_figure_savefig = None  # Figure.savefig, once patched


class _FigureCapture:
    """Writes the pyplot figures an execution leaves open or shows as PNG
    artifacts FIGURE_NAME_FORMAT, never overwriting a file, and skips one
    the code saved itself."""

    def __init__(self, events):
        self.events, self.next, self.count = events, 1, 0

    def capture_open(self):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return  # matplotlib is never imported here: the code did not
        try:
            from matplotlib._pylab_helpers import Gcf

            figs = [m.canvas.figure for m in sorted(Gcf.get_all_fig_managers(), key=lambda m: m.num)]
        except BaseException:
            return
        for fig in figs:
            if fig not in _saved_figures:
                self.save(fig)
        try:
            plt.close("all")
        except BaseException:
            pass

    def finish(self):
        self.capture_open()

    def save(self, fig):
        if self.count >= MAX_FIGURES or _figure_savefig is None:
            return
        try:
            os.makedirs(ARTIFACTS_DIR, exist_ok=True)
        except OSError:
            pass
        while True:
            name = FIGURE_NAME_FORMAT % self.next
            self.next += 1
            path = os.path.join(ARTIFACTS_DIR, name)
            try:
                f = _real_open(path, "xb")
            except FileExistsError:
                continue  # the code's own file, or an earlier cell's figure
            except OSError as e:
                _warn("figure not saved: %s" % e)
                return
            break
        try:
            with f:
                _figure_savefig(fig, f, format="png", bbox_inches="tight")
        except BaseException as e:
            _warn("figure not saved: %s: %s" % (type_name(type(e)), e))
            try:
                os.unlink(path)
            except OSError:
                pass
            return
        self.count += 1
        # The name only: the size is the worker's reading of the artifact
        # (SECURITY.md case 51).
        self.events.emit({"type": EVENT_FIGURE, "name": name})


def _warn(msg):
    try:
        sys.stderr.write("sandboxd: %s\n" % msg)
    except BaseException:
        pass


def _install_pyplot_hook():
    """Patch pyplot now if it is imported, else when the code imports it:
    never import matplotlib here."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        _patch_pyplot(plt)
    elif not any(isinstance(f, _PyplotFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PyplotFinder())


class _PyplotFinder:
    """Finds matplotlib.pyplot as the other finders do, and patches it once
    loaded."""

    def find_spec(self, name, path, target=None):
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_patch(module):
            exec_module(module)
            _patch_pyplot(module)

        loader.exec_module = exec_and_patch
        return spec


def _patch_pyplot(plt):
    """pyplot.show captures the open figures (and closes them, as a
    notebook's inline backend does) while a capture runs; Figure.savefig
    notes the figures the code saved as artifacts itself (a figure saved
    elsewhere, into a buffer or /tmp, is still captured)."""
    global _figure_savefig
    if getattr(plt, "_sandboxd_patched", False):
        return
    try:
        from matplotlib.figure import Figure
    except BaseException:
        return
    original_savefig = Figure.savefig
    original_show = plt.show

    @functools.wraps(original_savefig)
    def savefig(self, *args, **kwargs):
        r = original_savefig(self, *args, **kwargs)
        target = args[0] if args else kwargs.get("fname")
        if _is_artifact_target(target):
            try:
                _saved_figures.add(self)
            except TypeError:
                pass
        return r

    @functools.wraps(original_show)
    def show(*args, **kwargs):
        capture = _current_capture
        if capture is None:
            return original_show(*args, **kwargs)
        capture.capture_open()

    Figure.savefig = savefig
    plt.show = show
    plt._sandboxd_patched = True
    _figure_savefig = original_savefig


def open_figure_count():
    """How many pyplot figures are open (0 while pyplot is not imported)."""
    if sys.modules.get("matplotlib.pyplot") is None:
        return 0
    try:
        from matplotlib._pylab_helpers import Gcf

        return len(Gcf.get_all_fig_managers())
    except BaseException:
        return 0


def pyplot_patch_state():
    """What _install_pyplot_hook changes, for restore_pyplot_patch_state
    (the zygote's rehearsal puts it back)."""
    plt = sys.modules.get("matplotlib.pyplot")
    figure = sys.modules.get("matplotlib.figure")
    return {
        "meta_path": list(sys.meta_path),
        "plt": plt,
        "patched": plt is not None and getattr(plt, "_sandboxd_patched", False),
        "show": getattr(plt, "show", None),
        "savefig": getattr(getattr(figure, "Figure", None), "savefig", None),
        "figure_savefig": _figure_savefig,
    }


def restore_pyplot_patch_state(state):
    """Undo what _install_pyplot_hook did since pyplot_patch_state."""
    global _figure_savefig
    sys.meta_path[:] = state["meta_path"]
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or state["patched"] or not getattr(plt, "_sandboxd_patched", False):
        return
    if plt is not state["plt"]:
        raise RuntimeError("runner: pyplot was imported during a rehearsal")
    from matplotlib.figure import Figure

    plt.show = state["show"]
    Figure.savefig = state["savefig"]
    del plt._sandboxd_patched
    _figure_savefig = state["figure_savefig"]


def _is_artifact_target(target):
    """savefig's target is a file under ARTIFACTS_DIR: a path, or a file
    object opened by path (its name)."""
    if not isinstance(target, (str, bytes, os.PathLike)):
        target = getattr(target, "name", None)
        if not isinstance(target, (str, bytes)):
            return False  # a buffer: not an artifact
    try:
        path = os.path.realpath(os.fsdecode(os.fspath(target)))
        root = os.path.realpath(ARTIFACTS_DIR)
        return os.path.commonpath([path, root]) == root
    except (TypeError, ValueError, OSError):
        return False


# --- the process: single-shot executions ---


def unbuffered_streams():
    """stdout and stderr as `python3 -u` has them: every write reaches the
    fd at once, so the worker streams output live."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        try:
            old.flush()
        except BaseException:
            pass
        new = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False),
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors=getattr(old, "errors", None) or "strict",
            newline="\n",
            write_through=True,
        )
        _kept_streams.append(old)  # never closed: fds 1 and 2 stay open
        setattr(sys, name, new)
        setattr(sys, "__%s__" % name, new)


_kept_streams = []


def run_file(job, events_fd):
    """Run the job's file as `python3 PATH` would (__name__ == "__main__",
    __file__, sys.argv, sys.path[0], cwd, exit codes and tracebacks) and
    exit. job is runner.go's Job."""
    path = job["path"]
    os.chdir(job.get("cwd") or "/")
    sys.argv[:] = job.get("argv") or [path]
    try:
        sys.orig_argv[:] = ["python3"] + sys.argv
    except AttributeError:
        pass
    # -P left the script's directory out; `python3 path` puts it first.
    sys.path.insert(0, os.path.dirname(path))
    unbuffered_streams()
    events = Events(events_fd)
    # With Job.Done the execution ends on the done event, written on
    # events (kept open for it), rather than on this process's exit.
    ending = events if job.get("done") and events.fd is not None else None

    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__loader__ = SourceFileLoader("__main__", path)
    main.__spec__ = None
    main.__package__ = None
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    opened = _track_open()
    try:
        with _real_open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        sys.stderr.write("python3: can't open file %r: [Errno %d] %s\n" % (path, e.errno, e.strerror))
        _finish(2, main, opened, ending)
    code = run_code(source, path, main.__dict__, events, bool(job.get("display")), bool(job.get("figures")))
    if ending is None:
        events.close()
    _finish(code, main, opened, ending)


def _track_open():
    """Remember every file the user's code opens, so that _finish can flush
    one left open (the interpreter's teardown would have)."""
    import builtins

    opened = weakref.WeakSet()

    @functools.wraps(_real_open)
    def open(*args, **kwargs):
        f = _real_open(*args, **kwargs)
        try:
            opened.add(f)
        except TypeError:
            pass
        return f

    builtins.open = io.open = open
    return opened


def _finish(code, main, opened, ending=None):
    """Exit as Py_FinalizeEx would, without its teardown of every module.

    Tearing down numpy, pandas and matplotlib costs ~100-200 ms of pure
    overhead after the user's code is done. The observable steps are kept,
    in the interpreter's order: join non-daemon threads, run atexit
    callbacks, drop the user's globals (closing their files, running their
    __del__), flush every file the code left open and the standard streams;
    then _exit, or first the done event on ending (Events.done). The
    sandbox is destroyed right after, so nothing else is leaked."""
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
    if ending is not None:
        ending.done(code & 0xFF)
    os._exit(code)


def main(argv):
    """`python3 -P -c RUNNER JOB`: a cold single-shot execution, its events
    on EVENTS_FD when the job says so."""
    job = json.loads(argv[1])
    run_file(job, job.get("events_fd"))


if __name__ == "__main__":
    main(sys.argv)
