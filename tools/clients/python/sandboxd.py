"""sandboxd: a Python client for the sandboxd execution API.

One module, standard library only (Python 3.8+): copy this file next to an
agent, or put its directory on sys.path.

    import sandboxd

    client = sandboxd.Client("http://127.0.0.1:3100", token="...")
    ex = client.run("print(6 * 7)")
    print(ex.status, ex.stdout)

    with client.create_session() as s:
        s.upload("input/sales.csv", "sales.csv")       # streamed from disk
        s.run("import pandas as pd; df = pd.read_csv('input/sales.csv')")
        ex = s.run("df.describe()")                      # state persists
        for fig in ex.figures:
            fig.save(fig.name)

    for ev in client.stream("for i in range(3): print(i)"):
        if ev.type == "stdout":
            print(ev.text, end="")

Every call returns typed results (dataclasses), raises one exception class
per HTTP refusal (BadRequest, NotFound, SessionBusy, Gone, TooManyRequests, ...)
carrying the server's message, and retries 429/503 refusals honouring
Retry-After (bounded, with jitter). server/README.md in the sandboxd
repository describes the API; README.md next to this file describes the
client.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import hashlib
import http.client
import io
import json
import math
import os
import random
import re
import socket
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__version__ = "0.1.0"

__all__ = [
    "Client", "Session", "Execution", "ExecutionId", "ExecutionError", "TracebackFrame", "Artifact", "Omitted",
    "Display", "Usage", "Policy", "SessionExecInfo", "SessionKernel", "SessionWorkspace",
    "FileEntry", "FileList", "FileInfo", "Profile", "EventStream", "Event", "OutputEvent",
    "StdoutEvent", "StderrEvent", "FigureEvent", "DisplayEvent", "ResultEvent", "ToolResult",
    "SandboxdError", "TransportError", "ProtocolError", "WaitTimeout", "ExecutionFailed",
    "APIError", "ClientError", "BadRequest", "Unauthorized", "Forbidden", "NotFound",
    "RequestTimeout", "Conflict", "SessionBusy", "NotRunning", "Gone", "PayloadTooLarge",
    "UnsupportedMediaType", "RangeNotSatisfiable", "Unprocessable", "TooManyRequests",
    "ServerError", "ServiceUnavailable", "InsufficientStorage",
    "TOOL_SCHEMAS", "RUN_PYTHON_SCHEMA", "tool_definitions",
]

# Statuses an execution ends with; queued and running are live.
FINISHED = frozenset({"succeeded", "failed", "timeout", "oom", "cancelled", "sandbox_error", "interrupted"})

_CHUNK = 64 * 1024
_MAX_ERROR_BODY = 1 << 20

# ---------------------------------------------------------------------------
# Exceptions


class SandboxdError(Exception):
    """Base of every error this module raises."""


class TransportError(SandboxdError):
    """The server could not be reached, or the connection broke (the
    underlying OSError is the __cause__)."""


class ProtocolError(SandboxdError):
    """The server's answer could not be understood, or a download did not
    match its SHA-256."""


class WaitTimeout(SandboxdError, TimeoutError):
    """Client.wait gave up before the execution finished (it still runs)."""


class ExecutionFailed(SandboxdError):
    """Raised by Execution.check() when the code did not succeed. The
    execution is in .execution; str() is the traceback or the reason."""

    def __init__(self, execution: "Execution"):
        self.execution = execution
        if execution.error is not None:
            msg = execution.error.text or f"{execution.error.type}: {execution.error.message}"
        elif execution.error_message:
            msg = f"{execution.status}: {execution.error_message}"
        else:
            msg = f"{execution.status} (exit code {execution.exit_code})"
            if execution.stderr:
                msg += "\n" + execution.stderr[-4000:]
        super().__init__(msg.rstrip("\n"))


class APIError(SandboxdError):
    """The server refused a request. status is the HTTP status, message the
    server's {"error": ...}, code its stable name when it gives one
    (session_busy, not_running), retry_after the Retry-After seconds."""

    status = 0

    def __init__(self, status: int, message: str, *, code: Optional[str] = None,
                 retry_after: Optional[float] = None, method: str = "", path: str = "",
                 body: Optional[bytes] = None):
        self.status = status
        self.message = message
        self.code = code
        self.retry_after = retry_after
        self.method = method
        self.path = path
        self.body = body
        where = f"{method} {path}: " if method else ""
        name = f" {code}" if code else ""
        super().__init__(f"{where}HTTP {status}{name}: {message}")


class ClientError(APIError):
    """A 4xx: the request must change before it can succeed (or, for 409
    and 429, the moment)."""


class BadRequest(ClientError):
    status = 400


class Unauthorized(ClientError):
    """401: the token is missing or wrong."""
    status = 401


class Forbidden(ClientError):
    """403: the Host, Origin or Referer header was refused."""
    status = 403


class NotFound(ClientError):
    status = 404


class RequestTimeout(ClientError):
    """408: the body did not arrive in time (an upload too slow)."""
    status = 408


class Conflict(ClientError):
    status = 409


class SessionBusy(Conflict):
    """409 session_busy: the session runs an execution already (one at a
    time): wait, or interrupt it."""


class NotRunning(Conflict):
    """409 not_running: interrupt while no execution runs."""


class Gone(ClientError):
    """410 owner_gone: the session lives on a worker that has left the
    cluster (its files stay on that node); not retried. A session's owner
    that is only restarting is a 503 instead, which is retried."""
    status = 410


class PayloadTooLarge(ClientError):
    """413: the code, input, files or upload is over a limit or the
    session's quota."""
    status = 413


class UnsupportedMediaType(ClientError):
    """415: e.g. a profile of a file type the profiler does not read."""
    status = 415


class RangeNotSatisfiable(ClientError):
    status = 416


class Unprocessable(ClientError):
    """422: e.g. a file the profiler could not parse."""
    status = 422


class TooManyRequests(ClientError):
    """429: over capacity; retried by the client up to its retries, then
    raised (retry_after says when to try again)."""
    status = 429


class ServerError(APIError):
    """A 5xx."""


class ServiceUnavailable(ServerError):
    """503: not ready, draining, or busy sending answers; retried like 429."""
    status = 503


class InsufficientStorage(ServerError):
    """507: the worker's disk is full."""
    status = 507


_BY_STATUS = {c.status: c for c in (BadRequest, Unauthorized, Forbidden, NotFound, RequestTimeout, Conflict,
                                    Gone, PayloadTooLarge, UnsupportedMediaType, RangeNotSatisfiable, Unprocessable,
                                    TooManyRequests, ServiceUnavailable, InsufficientStorage)}
_BY_CODE = {"session_busy": SessionBusy, "not_running": NotRunning}


def _api_error(status: int, body: bytes, retry_after: Optional[float], method: str, path: str) -> APIError:
    message, code = "", None
    try:
        doc = json.loads(body.decode("utf-8"))
        if isinstance(doc, dict):
            message = str(doc.get("error") or "")
            code = doc.get("code") if isinstance(doc.get("code"), str) else None
    except (ValueError, UnicodeDecodeError):
        pass
    if not message:
        message = body.decode("utf-8", "replace").strip()[:2000] or http.client.responses.get(status, "error")
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ClientError if status >= 400 else APIError
    return cls(status, message, code=code, retry_after=retry_after, method=method, path=path, body=body)


# ---------------------------------------------------------------------------
# Typed results


def _time(v: Any) -> Any:
    """An RFC 3339 time as a datetime (Go writes nanoseconds: cut to
    microseconds); anything else is kept as it came."""
    if not isinstance(v, str):
        return v
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", v)
    if not m:
        return v
    frac = (m.group(2) or "")[:7]
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        return _dt.datetime.fromisoformat(m.group(1) + frac + tz)
    except ValueError:
        return v


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


@dataclass
class Policy:
    timeout_ms: int = 0
    memory_mb: int = 0
    cpus: float = 0
    pids: int = 0
    # The policy's default runtime: set by policies() only; an answer's or
    # a session's runtime is its own top-level runtime.
    runtime: str = ""

    @classmethod
    def from_json(cls, d: Any) -> Optional["Policy"]:
        if not isinstance(d, dict):
            return None
        return cls(d.get("timeout_ms", 0), d.get("memory_mb", 0), d.get("cpus", 0), d.get("pids", 0),
                   d.get("runtime", ""))


@dataclass
class Usage:
    wall_ms: int = 0
    cpu_ms: int = 0
    peak_memory_bytes: int = 0
    pids_peak: int = 0

    @classmethod
    def from_json(cls, d: Any) -> Optional["Usage"]:
        if not isinstance(d, dict):
            return None
        return cls(d.get("wall_ms", 0), d.get("cpu_ms", 0), d.get("peak_memory_bytes", 0), d.get("pids_peak", 0))


# The images a tool result carries as images, as server/mcp/result.go
# inlines them: these types (Anthropic refuses image/svg+xml), at most
# MAX_INLINE_IMAGE bytes each and MAX_INLINE_IMAGES per result.
INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
MAX_INLINE_IMAGE = 5 << 20
MAX_INLINE_IMAGES = 16 << 20


@dataclass
class Artifact:
    """A file the code wrote under output/artifacts/ (figures included).
    data decodes content_base64 on first use and checks its SHA-256."""
    name: str
    size: int = 0
    media_type: str = ""
    sha256: str = ""
    width: Optional[int] = None
    height: Optional[int] = None
    content_base64: str = field(default="", repr=False)
    _data: Optional[bytes] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict) -> "Artifact":
        return cls(name=d.get("name", ""), size=d.get("size", 0), media_type=d.get("media_type", ""),
                   sha256=d.get("sha256", ""), width=d.get("width"), height=d.get("height"),
                   content_base64=d.get("content_base64") or "")

    @property
    def data(self) -> bytes:
        if self._data is None:
            try:
                data = base64.b64decode(self.content_base64, validate=True)
            except binascii.Error as e:
                raise ProtocolError(f"artifact {self.name!r}: bad base64: {e}") from None
            if self.sha256 and hashlib.sha256(data).hexdigest() != self.sha256:
                raise ProtocolError(f"artifact {self.name!r}: content does not match its sha256")
            self._data = data
        return self._data

    def text(self, encoding: str = "utf-8") -> str:
        return self.data.decode(encoding)

    def save(self, path: Union[str, os.PathLike]) -> None:
        with open(path, "wb") as f:
            f.write(self.data)

    @property
    def is_image(self) -> bool:
        """An image a model's API takes as an image (PNG, JPEG, GIF, WebP:
        server/mcp's inlineImageTypes); SVG is text, never an image here."""
        return self.media_type in INLINE_IMAGE_TYPES


@dataclass
class Omitted:
    """An artifact the worker did not return, and why (symlink, too_large...)."""
    name: str
    reason: str


@dataclass
class TracebackFrame:
    file: str = ""
    line: Optional[int] = None
    function: str = ""
    source: str = ""


@dataclass
class ExecutionError:
    """The exception the code raised (status "failed"). text reads as
    Python prints the traceback; line is the failing line of the user's
    code; hint (e.g. the DataFrame's columns after a KeyError) when the
    server has one."""
    type: str = ""
    message: str = ""
    line: Optional[int] = None
    offset: Optional[int] = None
    traceback: List[TracebackFrame] = field(default_factory=list)
    text: str = ""
    hint: Optional[str] = None

    @classmethod
    def from_json(cls, d: dict) -> "ExecutionError":
        frames = [TracebackFrame(f.get("file", ""), f.get("line"), f.get("function", ""), f.get("source", ""))
                  for f in _list(d.get("traceback")) if isinstance(f, dict)]
        return cls(type=d.get("type", ""), message=d.get("message", ""), line=d.get("line"),
                   offset=d.get("offset"), traceback=frames, text=d.get("text", ""), hint=d.get("hint"))

    def __str__(self) -> str:
        return self.text or f"{self.type}: {self.message}"


@dataclass
class Display:
    """The value of a final expression: mime type -> representation."""
    mime: Dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.mime.get("text/plain", "")

    @property
    def markdown(self) -> Optional[str]:
        return self.mime.get("text/markdown")

    @classmethod
    def from_json(cls, d: Any) -> "Display":
        return cls(dict(_dict(_dict(d).get("mime"))))


@dataclass
class SessionExecInfo:
    """How a session execution ran: state preserved|new|restarted, reason
    (first_execution, idle_timeout, worker_restart, ...), kernel_ended
    when the kernel died during it."""
    id: str = ""
    kernel_generation: int = 0
    state: str = ""
    reason: Optional[str] = None
    kernel_ended: Optional[str] = None

    @classmethod
    def from_json(cls, d: Any) -> Optional["SessionExecInfo"]:
        if not isinstance(d, dict):
            return None
        return cls(d.get("id", ""), d.get("kernel_generation", 0), d.get("state", ""), d.get("reason"),
                   d.get("kernel_ended"))


@dataclass
class Execution:
    """An execution's answer (or, while queued or running, its live view:
    id, type, status, started_at, policy).

    status: succeeded, failed, timeout, oom, cancelled, sandbox_error,
    interrupted (finished) or queued, running (live). error is the typed
    exception when the code raised; error_message the worker's reason for a
    sandbox_error or interrupted."""
    id: str = ""
    type: str = ""
    status: str = ""
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_omitted_bytes: int = 0
    stderr_omitted_bytes: int = 0
    result: Any = None
    result_error: Optional[str] = None
    error: Optional[ExecutionError] = None
    error_message: Optional[str] = None
    display: List[Display] = field(default_factory=list)
    artifacts: List[Artifact] = field(default_factory=list)
    artifacts_omitted: List[Omitted] = field(default_factory=list)
    limits_hit: List[str] = field(default_factory=list)
    usage: Optional[Usage] = None
    started_at: Any = None
    finished_at: Any = None
    duration_ms: Optional[int] = None
    policy: Optional[Policy] = None
    session: Optional[SessionExecInfo] = None
    runtime: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> "Execution":
        if not isinstance(d, dict):
            raise ProtocolError(f"an execution is a JSON object, got {type(d).__name__}")
        err, err_msg = d.get("error"), None
        if isinstance(err, dict):
            err = ExecutionError.from_json(err)
        elif isinstance(err, str):
            err, err_msg = None, err
        else:
            err = None
        return cls(
            id=d.get("id", ""), type=d.get("type", ""), status=d.get("status", ""),
            exit_code=d.get("exit_code"), signal=d.get("signal"),
            stdout=d.get("stdout") or "", stderr=d.get("stderr") or "",
            stdout_truncated=bool(d.get("stdout_truncated")), stderr_truncated=bool(d.get("stderr_truncated")),
            stdout_omitted_bytes=d.get("stdout_omitted_bytes") or 0,
            stderr_omitted_bytes=d.get("stderr_omitted_bytes") or 0,
            result=d.get("result"), result_error=d.get("result_error"), error=err, error_message=err_msg,
            display=[Display.from_json(x) for x in _list(d.get("display"))],
            artifacts=[Artifact.from_json(a) for a in _list(d.get("artifacts")) if isinstance(a, dict)],
            artifacts_omitted=[Omitted(o.get("name", ""), o.get("reason", ""))
                               for o in _list(d.get("artifacts_omitted")) if isinstance(o, dict)],
            limits_hit=list(_list(d.get("limits_hit"))), usage=Usage.from_json(d.get("usage")),
            started_at=_time(d.get("started_at")), finished_at=_time(d.get("finished_at")),
            duration_ms=d.get("duration_ms"), policy=Policy.from_json(d.get("policy")),
            session=SessionExecInfo.from_json(d.get("session")), runtime=d.get("runtime") or "", raw=d)

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def figures(self) -> List[Artifact]:
        """The image artifacts (captured matplotlib figures and images the
        code saved), in the server's order."""
        return [a for a in self.artifacts if a.is_image]

    def artifact(self, name: str) -> Artifact:
        for a in self.artifacts:
            if a.name == name:
                return a
        raise KeyError(name)

    def check(self) -> "Execution":
        """Return self when it succeeded, else raise ExecutionFailed."""
        if not self.ok:
            raise ExecutionFailed(self)
        return self


@dataclass
class SessionKernel:
    enabled: bool = True
    state: str = ""
    generation: int = 0
    started_at: Any = None
    end_reason: Optional[str] = None


@dataclass
class SessionWorkspace:
    bytes_used: int = 0
    files_used: int = 0
    max_bytes: int = 0
    max_files: int = 0


@dataclass
class FileInfo:
    """A stored file: the answer of an upload or a download."""
    path: str
    size: int
    sha256: str


@dataclass
class FileEntry:
    name: str
    size: int = 0
    mtime: Any = None


@dataclass
class FileList:
    """A listing; truncated when more files matched than listed (limit) or
    the server's walk stopped at its bound. Iterates over the entries."""
    files: List[FileEntry] = field(default_factory=list)
    truncated: bool = False

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def names(self) -> List[str]:
        return [f.name for f in self.files]


@dataclass
class Profile:
    """A schema preview of a tabular file (rows, columns with dtype, nulls,
    distinct, sample; the first rows), within the server's budget."""
    rows: int = 0
    column_count: int = 0
    columns: List[Dict[str, Any]] = field(default_factory=list)
    head: List[List[Any]] = field(default_factory=list)
    truncated: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def column_names(self) -> List[str]:
        return [c.get("name", "") for c in self.columns]


@dataclass
class Session:
    """A session: a workspace (files) and, with kernel, a Python whose
    variables persist across its executions. Got from Client; its methods
    act on the server (a with block deletes it at the end)."""
    id: str
    type: str = ""
    policy: Optional[Policy] = None
    kernel: Optional[SessionKernel] = None
    workspace: Optional[SessionWorkspace] = None
    idle_timeout_ms: int = 0
    created_at: Any = None
    last_used_at: Any = None
    expires_at: Any = None
    _client: Optional["Client"] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any, client: Optional["Client"] = None) -> "Session":
        if not isinstance(d, dict):
            raise ProtocolError(f"a session is a JSON object, got {type(d).__name__}")
        k, w = _dict(d.get("kernel")), _dict(d.get("workspace"))
        return cls(
            id=d.get("id", ""), type=d.get("type", ""), policy=Policy.from_json(d.get("policy")),
            kernel=SessionKernel(bool(k.get("enabled", True)), k.get("state", ""), k.get("generation", 0),
                                 _time(k.get("started_at")), k.get("end_reason")) if k else None,
            workspace=SessionWorkspace(w.get("bytes_used", 0), w.get("files_used", 0), w.get("max_bytes", 0),
                                       w.get("max_files", 0)) if w else None,
            idle_timeout_ms=d.get("idle_timeout_ms", 0), created_at=_time(d.get("created_at")),
            last_used_at=_time(d.get("last_used_at")), expires_at=_time(d.get("expires_at")), _client=client)

    def _c(self) -> "Client":
        if self._client is None:
            raise SandboxdError("this Session is not bound to a Client (use Client.session(id))")
        return self._client

    def run(self, code: str, **kw: Any) -> Execution:
        """Run code as a cell of this session (see Client.run for options)."""
        return self._c().run(code, session=self.id, **kw)

    def stream(self, code: str, **kw: Any) -> "EventStream":
        return self._c().stream(code, session=self.id, **kw)

    def submit(self, code: str, **kw: Any) -> "ExecutionId":
        return self._c().submit(code, session=self.id, **kw)

    def wait(self, execution_id: str, timeout: Optional[float] = None, poll: float = 0.2) -> Execution:
        """Wait for an execution of this session (Client.wait)."""
        return self._c().wait(execution_id, timeout, poll, session=self.id)

    def interrupt(self) -> None:
        self._c().interrupt(self.id)

    def refresh(self) -> "Session":
        """The session as the server has it now (a new object)."""
        return self._c().get_session(self.id)

    def delete(self) -> None:
        self._c().delete_session(self.id)

    close = delete

    def upload(self, path: str, src: Any, **kw: Any) -> FileInfo:
        return self._c().upload(self.id, path, src, **kw)

    def download(self, path: str, dest: Any) -> FileInfo:
        return self._c().download(self.id, path, dest)

    def read_file(self, path: str) -> bytes:
        return self._c().read_file(self.id, path)

    def list_files(self, prefix: str = "", limit: Optional[int] = None) -> FileList:
        return self._c().list_files(self.id, prefix, limit)

    def delete_file(self, path: str) -> None:
        self._c().delete_file(self.id, path)

    def profile(self, path: str) -> Profile:
        return self._c().profile(self.id, path)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.delete()
        except NotFound:
            pass


# ---------------------------------------------------------------------------
# Streaming events


@dataclass
class Event:
    """A server-sent event. type is its name; id its number in the
    execution (increasing); data the decoded JSON of an event type this
    client does not know."""
    type: str
    id: Optional[str] = None
    data: Any = field(default=None, repr=False)


@dataclass
class OutputEvent(Event):
    text: str = ""


@dataclass
class StdoutEvent(OutputEvent):
    pass


@dataclass
class StderrEvent(OutputEvent):
    pass


@dataclass
class FigureEvent(Event):
    """A figure was captured; its bytes come in the result's artifacts."""
    name: str = ""
    width: Optional[int] = None
    height: Optional[int] = None


@dataclass
class DisplayEvent(Event):
    display: Display = field(default_factory=Display)


@dataclass
class ResultEvent(Event):
    """The last event: the whole answer."""
    execution: Execution = field(default_factory=Execution)


def _typed_event(name: str, ev_id: Optional[str], raw: str) -> Event:
    try:
        data = json.loads(raw) if raw else None
    except ValueError as e:
        raise ProtocolError(f"event {name!r} {ev_id}: data is not JSON: {e}") from None
    d = _dict(data)
    if name == "stdout":
        return StdoutEvent(name, ev_id, data, text=d.get("text", ""))
    if name == "stderr":
        return StderrEvent(name, ev_id, data, text=d.get("text", ""))
    if name == "figure":
        return FigureEvent(name, ev_id, data, name=d.get("name", ""), width=d.get("width"), height=d.get("height"))
    if name == "display":
        return DisplayEvent(name, ev_id, data, display=Display.from_json(d))
    if name == "result":
        return ResultEvent(name, ev_id, data, execution=Execution.from_json(data))
    return Event(name, ev_id, data)


def parse_sse(lines: Iterator[bytes]) -> Iterator[Tuple[str, Optional[str], str]]:
    """(event, id, data) for each event of a text/event-stream, from its
    lines (bytes, with or without their end of line). An event without a
    name is "message"; comments and retry: are skipped; an unfinished last
    event is dropped, as the SSE specification says."""
    name, ev_id, data = "", None, []
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line == "":
            if data or name:
                yield (name or "message", ev_id, "\n".join(data))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
        elif key == "id" and "\0" not in value:
            ev_id = value


class EventStream:
    """The events of one execution, as an iterator (also a context manager
    that closes the connection). streaming is False when the server
    answered with plain JSON (it does not stream): the iterator then yields
    one ResultEvent. A dropped connection is resumed from the last event
    id (GET /v1/executions/{id}/events with Last-Event-ID; a session's
    execution by its session's route, which any worker forwards to the
    session's owner), up to the client's retries in a row. result is the
    Execution once the result event has arrived."""

    def __init__(self, client: "Client", execution_id: str, resp: http.client.HTTPResponse, conn: Any,
                 session: Optional[str] = None):
        self.client = client
        self.execution_id = execution_id
        self.session = session
        self.last_event_id: Optional[str] = None
        self.result: Optional[Execution] = None
        self.reconnects = 0
        self._resp, self._conn = resp, conn
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
        self.streaming = ctype == "text/event-stream"

    def __iter__(self) -> Iterator[Event]:
        try:
            if not self.streaming:
                ex = Execution.from_json(_read_json(self._resp))
                self.result = ex
                yield ResultEvent("result", None, ex.raw, execution=ex)
                return
            failures = 0
            while True:
                try:
                    for name, ev_id, data in parse_sse(iter(self._resp.readline, b"")):
                        ev = _typed_event(name, ev_id, data)
                        if ev_id is not None:
                            self.last_event_id = ev_id
                        failures = 0
                        if isinstance(ev, ResultEvent):
                            self.result = ev.execution
                            yield ev
                            return
                        yield ev
                    err: Optional[BaseException] = None  # EOF before the result
                except (OSError, http.client.HTTPException) as e:
                    err = e
                self._close()
                failures += 1
                if failures > self.client.retries:
                    raise TransportError(f"execution {self.execution_id}: event stream ended before its result "
                                         f"({failures} attempts): {err or 'end of stream'}") from err
                self.client._sleep(self.client._backoff(failures - 1, None))
                self._resume()
        finally:
            self._close()

    def _resume(self) -> None:
        self.reconnects += 1
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        path = _exec_path(self.execution_id, self.session) + "/events"
        self._resp, self._conn = self.client._send("GET", path, headers=headers, idempotent=True,
                                                   read_timeout=self.client._stream_timeout)
        ctype = (self._resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "text/event-stream":
            raise ProtocolError(f"GET {path}: Content-Type {ctype!r}, want text/event-stream")

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def close(self) -> None:
        self._close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()


# ---------------------------------------------------------------------------
# Transport


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, **kw: Any):
        super().__init__("localhost", **kw)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def _q(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class ExecutionId(str):
    """An execution's id (a str) that remembers the session it runs in:
    submit(session=...) returns one, and wait, get_execution, cancel and
    events then use the session's routes for it."""

    session: Optional[str]

    def __new__(cls, value: str, session: Optional[str] = None) -> "ExecutionId":
        self = super().__new__(cls, value)
        self.session = session
        return self


def _exec_path(execution_id: str, session: Optional[str] = None) -> str:
    """An execution's route. A session's execution is asked for under its
    session (/v1/sessions/{sid}/executions/{id}): any worker forwards that
    to the session's owner, which /v1/executions/{id} is not (only the
    worker it lands on answers it). session defaults to the id's own
    (ExecutionId)."""
    if session is None:
        session = getattr(execution_id, "session", None)
    if not session:
        return f"/v1/executions/{_q(execution_id)}"
    return f"/v1/sessions/{_q(session)}/executions/{_q(execution_id)}"


def _qpath(path: str) -> str:
    return urllib.parse.quote(path, safe="/")


def _read_json(resp: http.client.HTTPResponse) -> Any:
    body = resp.read()
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"HTTP {resp.status}: the answer is not JSON: {e}: {body[:200]!r}") from None


def _retry_after(v: Optional[str]) -> Optional[float]:
    """Retry-After in seconds: delta-seconds or an HTTP date."""
    if not v:
        return None
    v = v.strip()
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime
        when = parsedate_to_datetime(v)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


class _Body:
    """A request body that can be sent again for a retry: bytes, or a file
    object rewound to where it started (a path is reopened)."""

    def __init__(self, src: Any, content_length: Optional[int] = None):
        self._own: Optional[BinaryIO] = None
        self._src, self._start = src, None
        self.length = content_length
        if isinstance(src, (bytes, bytearray, memoryview)):
            self.length = len(src)
        elif isinstance(src, (str, os.PathLike)):
            self._own = open(src, "rb")
            self.length = os.fstat(self._own.fileno()).st_size if content_length is None else content_length
        elif hasattr(src, "read"):
            try:
                if src.seekable():
                    self._start = src.tell()
                    if self.length is None:
                        self.length = src.seek(0, io.SEEK_END) - self._start
                        src.seek(self._start)
            except (OSError, AttributeError, ValueError):
                self._start = None
        else:
            raise TypeError(f"cannot upload a {type(src).__name__}: give a path, bytes or a binary file object")
        self.sent = False

    def rewindable(self) -> bool:
        return not self.sent or self._own is not None or isinstance(
            self._src, (bytes, bytearray, memoryview)) or self._start is not None

    def get(self) -> Any:
        if self.sent:
            if self._own is not None:
                self._own.seek(0)
            elif self._start is not None:
                self._src.seek(self._start)
        self.sent = True
        if isinstance(self._src, (bytes, bytearray, memoryview)):
            return bytes(self._src)
        return self._own if self._own is not None else self._src

    def close(self) -> None:
        if self._own is not None:
            self._own.close()


# ---------------------------------------------------------------------------
# The client


class Client:
    """A connection to one sandboxd worker.

    base_url: http://HOST:PORT, https://HOST:PORT or unix:///path/to.sock
    (the worker_socket). token: the worker_token (sent as Authorization:
    Bearer). timeout: seconds a connect or a read may wait (an execution's
    own timeout_ms is added to it for its call). retries: how many times a
    429 or 503 refusal (and a dropped connection of a call that is safe to
    repeat) is retried, each after Retry-After (or an exponential backoff)
    plus jitter; a Retry-After above max_retry_wait is not waited for (the
    error is raised). headers: added to every request.

    A Client holds no connection between calls: it can be shared by
    threads."""

    def __init__(self, base_url: str = "http://127.0.0.1:3100", token: Optional[str] = None,
                 timeout: float = 60.0, retries: int = 3, *, max_retry_wait: float = 30.0,
                 headers: Optional[Mapping[str, str]] = None):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https", "unix"):
            raise ValueError(f"base_url {base_url!r}: the scheme must be http, https or unix")
        if u.scheme == "unix":
            self._unix, self._prefix = u.path, ""
            self._host, self._port = "localhost", None
            if not self._unix:
                raise ValueError(f"base_url {base_url!r}: unix:///path/to/socket")
        else:
            if not u.hostname:
                raise ValueError(f"base_url {base_url!r}: no host")
            self._unix, self._prefix = None, u.path.rstrip("/")
            self._host, self._port = u.hostname, u.port
        self._scheme = u.scheme
        self.base_url = base_url
        self.token = token
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.max_retry_wait = max_retry_wait
        self.headers = dict(headers or {})
        self._stream_timeout = max(timeout, 300.0)
        self._rand = random.Random()
        self._rand_lock = threading.Lock()

    @classmethod
    def from_env(cls, **kw: Any) -> "Client":
        """A client for $SANDBOXD_URL (default http://127.0.0.1:3100) with
        $SANDBOXD_TOKEN."""
        return cls(os.environ.get("SANDBOXD_URL", "http://127.0.0.1:3100"),
                   token=os.environ.get("SANDBOXD_TOKEN") or None, **kw)

    def __repr__(self) -> str:
        return f"sandboxd.Client({self.base_url!r})"

    # -- transport --

    def _connect(self, read_timeout: Optional[float]) -> http.client.HTTPConnection:
        t = read_timeout if read_timeout is not None else self.timeout
        if self._unix is not None:
            return _UnixConnection(self._unix, timeout=t, blocksize=_CHUNK)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=t, blocksize=_CHUNK)
        return http.client.HTTPConnection(self._host, self._port, timeout=t, blocksize=_CHUNK)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _backoff(self, attempt: int, retry_after: Optional[float]) -> float:
        """Retry-After plus up to a quarter more (never sooner than the
        server asked, and retries of many clients spread out); without it
        an exponential backoff from 0.5 s (at most 8 s), full jitter."""
        with self._rand_lock:
            if retry_after is not None:
                return retry_after + self._rand.uniform(0, max(0.25, retry_after / 4))
            cap = min(8.0, 0.5 * (2 ** attempt))
            return self._rand.uniform(cap / 2, cap)

    def _send(self, method: str, path: str, *, body: Any = None, json_body: Any = None,
              headers: Optional[Mapping[str, str]] = None, idempotent: bool = False,
              read_timeout: Optional[float] = None, ok: Sequence[int] = (),
              content_length: Optional[int] = None) -> Tuple[http.client.HTTPResponse, Any]:
        """Send a request, retrying 429/503 (and, when idempotent, a broken
        connection); answer the response of a status < 400 (or in ok) with
        its connection (the caller reads and closes), or raise."""
        h = {"Accept": "application/json", "User-Agent": f"sandboxd-python/{__version__}"}
        h.update(self.headers)
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        data: Optional[_Body] = None
        if json_body is not None:
            data = _Body(json.dumps(json_body, ensure_ascii=False).encode("utf-8"))
            h["Content-Type"] = "application/json"
        elif body is not None:
            data = body if isinstance(body, _Body) else _Body(body, content_length)
            h.setdefault("Content-Type", "application/octet-stream")
        if headers:
            h.update(headers)
        if data is not None and data.length is not None:
            h["Content-Length"] = str(data.length)
        url = self._prefix + path
        attempt = 0
        while True:
            conn = self._connect(read_timeout)
            try:
                resp = self._exchange(conn, method, url, data, h)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if idempotent and attempt < self.retries and (data is None or data.rewindable()):
                    self._sleep(self._backoff(attempt, None))
                    attempt += 1
                    continue
                raise TransportError(f"{method} {path}: {e.__class__.__name__}: {e}") from e
            if resp.status < 400 or resp.status in ok:
                return resp, conn
            try:
                err_body = resp.read(_MAX_ERROR_BODY)
            except (OSError, http.client.HTTPException):
                err_body = b""
            finally:
                conn.close()
            err = _api_error(resp.status, err_body, _retry_after(resp.getheader("Retry-After")), method, path)
            if (resp.status in (429, 503) and attempt < self.retries
                    and (err.retry_after is None or err.retry_after <= self.max_retry_wait)
                    and (data is None or data.rewindable())):
                self._sleep(self._backoff(attempt, err.retry_after))
                attempt += 1
                continue
            raise err

    @staticmethod
    def _exchange(conn: http.client.HTTPConnection, method: str, url: str, data: Optional[_Body],
                  h: Mapping[str, str]) -> http.client.HTTPResponse:
        try:
            if data is None:
                conn.request(method, url, headers=dict(h))
            else:
                # Without a Content-Length, http.client sends a file
                # object chunked, a block at a time.
                conn.request(method, url, body=data.get(), headers=dict(h))
        except (BrokenPipeError, ConnectionResetError):
            # The server may answer before it reads the whole body (413 on a
            # Content-Length over the quota) and close: read that answer.
            try:
                return conn.getresponse()
            except (OSError, http.client.HTTPException):
                pass
            raise
        return conn.getresponse()

    def _call(self, method: str, path: str, *, want: Sequence[int] = (200,), **kw: Any) -> Any:
        """A JSON call: the decoded answer (None for 204)."""
        resp, conn = self._send(method, path, **kw)
        try:
            if resp.status == 204:
                resp.read()
                return None
            if resp.status not in want:
                raise ProtocolError(f"{method} {path}: unexpected HTTP {resp.status}")
            return _read_json(resp)
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(f"{method} {path}: reading the answer: {e}") from e
        finally:
            conn.close()

    def _exec_timeout(self, timeout_ms: Optional[int]) -> float:
        """The read timeout of an execution call: the client's, or the
        execution's own plus a minute for the sandbox and the answer."""
        t = self._stream_timeout
        if timeout_ms:
            t = max(t, timeout_ms / 1000 + 60)
        return t

    # -- executions --

    @staticmethod
    def _files(files: Any) -> Optional[List[dict]]:
        if files is None:
            return None
        items = files.items() if isinstance(files, Mapping) else files
        out = []
        for item in items:
            if isinstance(item, Mapping):
                out.append(dict(item))
                continue
            path, content = item
            if isinstance(content, str):
                content = content.encode("utf-8")
            elif isinstance(content, (os.PathLike,)):
                with open(content, "rb") as f:
                    content = f.read()
            out.append({"path": path, "content_base64": base64.b64encode(bytes(content)).decode("ascii")})
        return out

    def _exec_request(self, code: str, *, session: Optional[str], id: Optional[str], type: Optional[str],
                      input: Any, files: Any, timeout_ms: Optional[int], env: Optional[Mapping[str, str]],
                      extra: Mapping[str, Any]) -> Tuple[str, str, dict]:
        if not isinstance(code, str):
            raise TypeError("code must be a str")
        req: Dict[str, Any] = {"id": id or "py-" + uuid.uuid4().hex[:24], "code": code}
        if session is None:
            if type is not None:
                req["type"] = type
            if input is not None:
                req["input"] = input
            path = "/v1/executions"
        else:
            if type is not None or input is not None:
                raise TypeError("a session execution takes no type or input (the session has them)")
            path = f"/v1/sessions/{_q(session)}/executions"
        f = self._files(files)
        if f is not None:
            req["files"] = f
        if timeout_ms is not None:
            req["timeout_ms"] = int(timeout_ms)
        if env:
            req["env"] = dict(env)
        for k, v in extra.items():
            if v is not None:
                req[k] = v
        return path, req["id"], req

    def run(self, code: str, *, session: Optional[str] = None, id: Optional[str] = None,
            type: Optional[str] = None, input: Any = None, files: Any = None,
            timeout_ms: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
            **extra: Any) -> Execution:
        """Run code and answer when it has finished (any status: check
        .ok or call .check()).

        session: run in that session (else a fresh single-use sandbox).
        id: the execution's id; one is generated when absent, so that a
        retry after a dropped connection answers the same execution and
        never runs the code twice. type: the policy (dynamic, skill).
        input: any JSON, /workspace/input/request.json. files: {path:
        bytes|str} or [(path, bytes)], written under input/. timeout_ms:
        at most the policy's. env: names from the worker's allowed_env.
        extra: further request fields (display_last_expression=True,
        capture_figures=False, ...), sent when not None."""
        path, _, req = self._exec_request(code, session=session, id=id, type=type, input=input, files=files,
                                          timeout_ms=timeout_ms, env=env, extra=extra)
        return Execution.from_json(self._call("POST", path, json_body=req, idempotent=True,
                                              read_timeout=self._exec_timeout(timeout_ms)))

    def stream(self, code: str, *, session: Optional[str] = None, id: Optional[str] = None,
               type: Optional[str] = None, input: Any = None, files: Any = None,
               timeout_ms: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
               **extra: Any) -> EventStream:
        """Run code and iterate over its events as they happen:
        StdoutEvent/StderrEvent (text), FigureEvent, DisplayEvent, then one
        ResultEvent (the answer of run). Options as for run."""
        path, exec_id, req = self._exec_request(code, session=session, id=id, type=type, input=input, files=files,
                                                timeout_ms=timeout_ms, env=env, extra=extra)
        resp, conn = self._send("POST", path, json_body=req, idempotent=True,
                                headers={"Accept": "text/event-stream"},
                                read_timeout=self._exec_timeout(timeout_ms))
        return EventStream(self, exec_id, resp, conn, session=session)

    def events(self, execution_id: str, last_event_id: Optional[str] = None, *,
               session: Optional[str] = None) -> EventStream:
        """Attach to the events of a running or finished execution (after
        last_event_id when given). session: the session it runs in (an
        ExecutionId knows its own), whose route reaches it through any
        worker."""
        session = session if session is not None else getattr(execution_id, "session", None)
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        resp, conn = self._send("GET", _exec_path(execution_id, session) + "/events", headers=headers,
                                idempotent=True, read_timeout=self._stream_timeout)
        es = EventStream(self, execution_id, resp, conn, session=session)
        es.last_event_id = last_event_id
        return es

    def submit(self, code: str, *, session: Optional[str] = None, id: Optional[str] = None,
               type: Optional[str] = None, input: Any = None, files: Any = None,
               timeout_ms: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
               **extra: Any) -> ExecutionId:
        """Start code without waiting (Prefer: respond-async) and return the
        execution id, for wait() or get_execution(): an ExecutionId (a str)
        that knows its session, so that they ask any worker for it. A
        server that does not answer asynchronously runs it to the end
        first; wait() works the same."""
        path, exec_id, req = self._exec_request(code, session=session, id=id, type=type, input=input, files=files,
                                                timeout_ms=timeout_ms, env=env, extra=extra)
        doc = self._call("POST", path, json_body=req, idempotent=True, want=(200, 202),
                         headers={"Prefer": "respond-async"}, read_timeout=self._exec_timeout(timeout_ms))
        return ExecutionId(_dict(doc).get("id") or exec_id, session)

    def get_execution(self, execution_id: str, *, session: Optional[str] = None) -> Execution:
        """The execution: its live view while queued or running (status
        queued|running), then its result. session: the session it runs in
        (an ExecutionId knows its own), whose route reaches it through any
        worker."""
        return Execution.from_json(self._call("GET", _exec_path(execution_id, session), idempotent=True,
                                              read_timeout=self._stream_timeout))

    def wait(self, execution_id: str, timeout: Optional[float] = None, poll: float = 0.2, *,
             session: Optional[str] = None) -> Execution:
        """Poll until the execution has finished and return it; after
        timeout seconds raise WaitTimeout (it goes on running). session: as
        for get_execution."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = poll
        while True:
            ex = self.get_execution(execution_id, session=session)
            if ex.finished:
                return ex
            if deadline is not None and time.monotonic() + delay > deadline:
                raise WaitTimeout(f"execution {execution_id} still {ex.status} after {timeout} s")
            self._sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def cancel(self, execution_id: str, *, session: Optional[str] = None) -> Execution:
        """Cancel an execution (the sandbox is killed); answers it, with
        status cancelled, or its live view if it has not ended yet.
        session: as for get_execution."""
        return Execution.from_json(self._call("DELETE", _exec_path(execution_id, session),
                                              want=(200, 202), read_timeout=self._stream_timeout))

    def policies(self) -> Dict[str, Policy]:
        doc = _dict(self._call("GET", "/v1/policies", idempotent=True))
        return {k: Policy.from_json(v) for k, v in _dict(doc.get("policies")).items()}

    def capacity(self) -> Dict[str, Any]:
        """What the worker can take now (GET /v1/capacity, server/README.md):
        free slots and the queue, warm sandboxes kept and ready per
        template (policy/runtime),
        sessions and the idle kernels' memory, and its worker_id when set;
        the server's document as a dict."""
        return _dict(self._call("GET", "/v1/capacity", idempotent=True))

    def runtimes(self) -> List[Dict[str, Any]]:
        """The runtimes a request may name (run(..., runtime=NAME),
        create_session(runtime=NAME)), each a dict: name, default, image,
        digest, python and packages ({name: version}) from its image."""
        doc = _dict(self._call("GET", "/v1/runtimes", idempotent=True))
        return [_dict(r) for r in _list(doc.get("runtimes"))]

    def ready(self) -> bool:
        """Whether the worker is ready to run code (/readyz)."""
        try:
            resp, conn = self._send("GET", "/readyz", ok=(503,))
        except (TransportError, APIError):
            return False
        try:
            resp.read()
            return resp.status == 200
        finally:
            conn.close()

    # -- sessions --

    def create_session(self, id: Optional[str] = None, *, type: Optional[str] = None,
                       kernel: Optional[bool] = None, idle_timeout_ms: Optional[int] = None,
                       runtime: Optional[str] = None) -> Session:
        """Create a session (a with block deletes it at its end). runtime:
        the name of one of the worker's runtimes (runtimes())."""
        req: Dict[str, Any] = {}
        for k, v in (("id", id), ("type", type), ("runtime", runtime), ("kernel", kernel), ("idle_timeout_ms", idle_timeout_ms)):
            if v is not None:
                req[k] = v
        # Not idempotent on a broken connection: a second POST of a created
        # session would be 409 (with an id) or a second session (without).
        return Session.from_json(self._call("POST", "/v1/sessions", json_body=req, want=(201,)), self)

    def get_session(self, session_id: str) -> Session:
        return Session.from_json(self._call("GET", f"/v1/sessions/{_q(session_id)}", idempotent=True), self)

    def session(self, session_id: str) -> Session:
        """A handle on an existing session (no request is made)."""
        return Session(id=session_id, _client=self)

    def list_sessions(self) -> List[Session]:
        doc = _dict(self._call("GET", "/v1/sessions", idempotent=True))
        return [Session.from_json(s, self) for s in _list(doc.get("sessions"))]

    def delete_session(self, session_id: str) -> None:
        """Delete a session: a running execution is cancelled, its files
        are removed."""
        self._call("DELETE", f"/v1/sessions/{_q(session_id)}", want=(204,), idempotent=True)

    def interrupt(self, session_id: str) -> None:
        """KeyboardInterrupt in the session's running code (NotRunning when
        none runs); its state survives."""
        self._call("POST", f"/v1/sessions/{_q(session_id)}/interrupt", want=(204,))

    # -- files --

    def _file_path(self, session_id: str, path: str) -> str:
        if not path or path.startswith("/"):
            raise ValueError(f"file path {path!r}: relative to /workspace, e.g. input/data.csv")
        return f"/v1/sessions/{_q(session_id)}/files/{_qpath(path)}"

    def upload(self, session_id: str, path: str, src: Any, *, content_length: Optional[int] = None) -> FileInfo:
        """Store src at path (relative to the session's /workspace), replacing
        it whole. src: a local path (str or PathLike; streamed from disk),
        bytes, or a binary file object (streamed; with content_length or a
        seekable one sent with its length, else chunked). Retried on 429/503
        when the body can be sent again (a path, bytes, a seekable file)."""
        body = _Body(src, content_length)
        try:
            doc = _dict(self._call("PUT", self._file_path(session_id, path), body=body, idempotent=True,
                                   read_timeout=self._stream_timeout))
        finally:
            body.close()
        return FileInfo(doc.get("path", path), doc.get("size", 0), doc.get("sha256", ""))

    def download(self, session_id: str, path: str, dest: Any) -> FileInfo:
        """Stream the file at path to dest: a local path (written to a
        temporary file beside it, renamed when complete and its SHA-256
        checked against the server's ETag) or a binary file object."""
        resp, conn = self._send("GET", self._file_path(session_id, path), idempotent=True,
                                headers={"Accept": "*/*"}, read_timeout=self._stream_timeout)
        try:
            etag = (resp.getheader("ETag") or "").strip('"')
            if isinstance(dest, (str, os.PathLike)):
                d = os.path.dirname(os.path.abspath(dest))
                fd, tmp = tempfile.mkstemp(prefix=".sandboxd-", dir=d)
                try:
                    with os.fdopen(fd, "wb") as f:
                        size, digest = self._copy(resp, f)
                        self._check_sum(path, etag, digest)
                    os.replace(tmp, dest)
                except BaseException:
                    os.unlink(tmp)
                    raise
            else:
                size, digest = self._copy(resp, dest)
                self._check_sum(path, etag, digest)
            return FileInfo(path, size, digest)
        except (OSError, http.client.HTTPException) as e:
            if isinstance(e, OSError) and not isinstance(e, (ConnectionError, socket.timeout)):
                raise
            raise TransportError(f"GET {path}: {e}") from e
        finally:
            conn.close()

    @staticmethod
    def _copy(resp: http.client.HTTPResponse, f: BinaryIO) -> Tuple[int, str]:
        h, n = hashlib.sha256(), 0
        while True:
            chunk = resp.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            f.write(chunk)
            n += len(chunk)
        return n, h.hexdigest()

    @staticmethod
    def _check_sum(path: str, etag: str, digest: str) -> None:
        if re.fullmatch(r"[0-9a-f]{64}", etag) and etag != digest:
            raise ProtocolError(f"download of {path!r}: SHA-256 {digest} is not the server's {etag}")

    def read_file(self, session_id: str, path: str) -> bytes:
        """The file's bytes (in memory: use download for big files)."""
        buf = io.BytesIO()
        self.download(session_id, path, buf)
        return buf.getvalue()

    def read_range(self, session_id: str, path: str, offset: int, length: int) -> Tuple[bytes, str, int]:
        """At most length bytes of the file from offset (an HTTP Range
        request): (bytes, media type, the file's size). RangeNotSatisfiable
        when offset is at or past the end (or the file is empty)."""
        resp, conn = self._send("GET", self._file_path(session_id, path), idempotent=True,
                                headers={"Accept": "*/*", "Range": f"bytes={offset}-{offset + length - 1}"})
        try:
            media_type = (resp.getheader("Content-Type") or "").split(";")[0].strip()
            m = re.fullmatch(r"bytes \d+-\d+/(\d+)", resp.getheader("Content-Range") or "")
            data = resp.read(length + 1)[:length] if resp.status == 200 else resp.read()
            size = int(m.group(1)) if m else int(resp.getheader("Content-Length") or len(data))
            return data, media_type, size
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(f"GET {path}: {e}") from e
        finally:
            conn.close()

    def list_files(self, session_id: str, prefix: str = "", limit: Optional[int] = None) -> FileList:
        q = {}
        if prefix:
            q["prefix"] = prefix
        if limit is not None:
            q["limit"] = str(limit)
        qs = ("?" + urllib.parse.urlencode(q)) if q else ""
        doc = _dict(self._call("GET", f"/v1/sessions/{_q(session_id)}/files{qs}", idempotent=True))
        return FileList([FileEntry(f.get("name", ""), f.get("size", 0), _time(f.get("mtime")))
                         for f in _list(doc.get("files")) if isinstance(f, dict)], bool(doc.get("truncated")))

    def delete_file(self, session_id: str, path: str) -> None:
        self._call("DELETE", self._file_path(session_id, path), want=(204,), idempotent=True)

    def profile(self, session_id: str, path: str) -> Profile:
        """A schema preview of a .csv, .xlsx or .json file (rows, columns,
        dtypes, samples, head), parsed in a sandbox."""
        doc = _dict(self._call("GET", self._file_path(session_id, path) + "?profile=1", idempotent=True,
                               read_timeout=self._stream_timeout))
        return Profile(doc.get("rows", 0), doc.get("column_count", 0),
                       [c for c in _list(doc.get("columns")) if isinstance(c, dict)],
                       _list(doc.get("head")), bool(doc.get("truncated")), doc)

    # -- function calling --

    def call_tool(self, name: str, arguments: Union[str, Mapping[str, Any], None]) -> "ToolResult":
        """Carry out a run_python function call (arguments as the model gave
        them: a JSON string or a dict), its result as the MCP server's
        run_python gives it (ToolResult.from_execution). The other tools of
        TOOL_SCHEMAS are the MCP server's (sandboxd mcp, or /mcp): this client
        does not re-implement them; offer the model run_python alone
        (tool_definitions(names=["run_python"])) or use the MCP server.
        Refusals and bad arguments become an error result for the model, not
        an exception; a transport failure is raised."""
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
            if not isinstance(args, dict):
                raise ValueError("the arguments are not a JSON object")
        except ValueError as e:
            return ToolResult(f"invalid arguments: {e}", is_error=True)
        if name != "run_python":
            return ToolResult(f"tool {name!r} is not carried out by this client: only run_python "
                              f"(the others are the MCP server's: sandboxd mcp)", is_error=True)
        try:
            return self._tool_run_python(**args)
        except TypeError as e:
            return ToolResult(f"invalid arguments for {name}: {e}", is_error=True)
        except (APIError, ValueError) as e:
            return ToolResult(f"{name} refused: {getattr(e, 'message', e)}", is_error=True)

    def _tool_run_python(self, code: str, session_id: Optional[str] = None, timeout_s: Optional[float] = None,
                         files: Optional[List[Mapping[str, str]]] = None,
                         runtime: Optional[str] = None) -> "ToolResult":
        if runtime is not None and session_id is not None:
            raise ValueError("runtime is for a call without session_id: a session runs on its own runtime")
        ex = self.run(code, session=session_id, files=[_tool_file(f) for f in files] if files else None,
                      timeout_ms=math.ceil(min(timeout_s, 1e9) * 1000) if timeout_s and timeout_s > 0 else None,
                      runtime=runtime)
        return ToolResult.from_execution(ex)


def _tool_file(f: Mapping[str, str]) -> Tuple[str, bytes]:
    if "text" in f and f.get("text") is not None:
        return f["path"], str(f["text"]).encode("utf-8")
    return f["path"], base64.b64decode(f.get("content_base64") or "", validate=True)


# ---------------------------------------------------------------------------
# Tool schemas for function-calling APIs: the MCP server's tools (sandboxd
# serve /mcp, sandboxd mcp), so that a model sees the same tools whichever
# way it reaches sandboxd. _TOOLS_JSON is server/mcp/tools.json verbatim;
# TestPythonToolSchemasMatchMCP (cmd/sandboxd/pyclient_test.go) fails when
# the two differ: copy the file here again.

_TOOLS_JSON = r'''[
  {
    "name": "run_python",
    "title": "Run Python",
    "description": "Run Python 3 code in a fresh, isolated Linux sandbox with pandas, numpy, scipy, scikit-learn, statsmodels, matplotlib, seaborn and openpyxl installed. There is no network access. The working directory is /workspace; files you pass in `files` appear under /workspace/input/. To return a chart or file, save it under /workspace/output/artifacts/ (for example plt.savefig('output/artifacts/chart.png')): images come back as images, other files as resource links. Open matplotlib figures are captured as PNG images too. Without session_id every call starts from scratch; with the session_id of a session made by create_session, variables, imports, DataFrames and files persist between calls, as in a notebook. The answer gives stdout, then the Python traceback if the code raised (or the end of stderr), and is marked as an error when the code failed, timed out or ran out of memory: read the traceback, fix the code and call again.",
    "inputSchema": {
      "type": "object",
      "properties": {
        "code": {
          "type": "string",
          "description": "The Python source to run, as a script (or a notebook cell in a session). print() what you want to see."
        },
        "session_id": {
          "type": "string",
          "description": "Run in this session (from create_session): the Python state and the files of earlier calls are kept. Omit for a one-off run in a fresh sandbox."
        },
        "timeout_s": {
          "type": "number",
          "exclusiveMinimum": 0,
          "description": "Stop the code after this many seconds (default and maximum: the server's policy, typically 30)."
        },
        "files": {
          "type": "array",
          "description": "Files written under /workspace/input/ before the code runs (in a session they stay there). Give each file's content as text or as base64, not both.",
          "items": {
            "type": "object",
            "properties": {
              "path": {
                "type": "string",
                "description": "Path relative to /workspace/input/, for example \"sales.csv\" or \"data/2024.json\"; no \"..\", not absolute."
              },
              "text": {
                "type": "string",
                "description": "The file's content as UTF-8 text (CSV, JSON, Python, ...)."
              },
              "content_base64": {
                "type": "string",
                "description": "The file's content, base64-encoded (for binary files such as .xlsx or .png)."
              }
            },
            "required": ["path"],
            "additionalProperties": false
          }
        },
        "runtime": {
          "type": "string",
          "pattern": "^[a-z][a-z0-9_-]{0,31}$",
          "description": "The runtime (set of installed packages) to run on, by name, for a call without session_id (a session has its own, chosen at create_session). Omit for the default; the worker's runtimes and their package versions are listed at GET /v1/runtimes."
        }
      },
      "required": ["code"],
      "additionalProperties": false
    }
  },
  {
    "name": "create_session",
    "title": "Create a Python session",
    "description": "Create a session: a persistent workspace (files kept between calls) and a long-lived Python process, so that later run_python calls with its session_id reuse loaded data, variables and imports. Use it when a task needs several steps on the same data; upload data once with upload_file, then run code on it. Returns the session_id. Close it with close_session when done; an unused session expires on its own.",
    "inputSchema": {
      "type": "object",
      "properties": {
        "session_id": {
          "type": "string",
          "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
          "description": "An id to give the session (letters, digits, '_', '.', '-'; up to 64). Omit to get a generated one."
        },
        "kernel": {
          "type": "boolean",
          "description": "Keep a long-lived Python process whose variables persist (default true). false: every run starts a fresh Python on the session's files."
        },
        "idle_timeout_s": {
          "type": "number",
          "exclusiveMinimum": 0,
          "description": "Stop the Python process after this many idle seconds (its variables are lost, the files stay). Default: the server's, typically 20 minutes."
        },
        "runtime": {
          "type": "string",
          "pattern": "^[a-z][a-z0-9_-]{0,31}$",
          "description": "The runtime (set of installed packages) of the session's Python, by name. Omit for the default; the worker's runtimes and their package versions are listed at GET /v1/runtimes."
        }
      },
      "additionalProperties": false
    }
  },
  {
    "name": "close_session",
    "title": "Close a session",
    "description": "Delete a session: its Python process is stopped (a running execution is cancelled) and its files are removed. Call it when the task is done.",
    "inputSchema": {
      "type": "object",
      "properties": {
        "session_id": {
          "type": "string",
          "description": "The session to delete."
        }
      },
      "required": ["session_id"],
      "additionalProperties": false
    }
  },
  {
    "name": "upload_file",
    "title": "Upload a file to a session",
    "description": "Write a file into a session's workspace (replacing any file at that path), for the session's code to read. Paths are relative to /workspace, the code's working directory: upload \"input/sales.csv\" and read it with pd.read_csv(\"input/sales.csv\"). Give the content as text or as base64, not both.",
    "inputSchema": {
      "type": "object",
      "properties": {
        "session_id": {
          "type": "string",
          "description": "The session (from create_session)."
        },
        "path": {
          "type": "string",
          "description": "Path relative to /workspace, for example \"input/sales.csv\"; no \"..\", not absolute. Parent directories are made."
        },
        "text": {
          "type": "string",
          "description": "The file's content as UTF-8 text."
        },
        "content_base64": {
          "type": "string",
          "description": "The file's content, base64-encoded (for binary files)."
        }
      },
      "required": ["session_id", "path"],
      "additionalProperties": false
    }
  },
  {
    "name": "read_file",
    "title": "Read a session file",
    "description": "Read a file from a session's workspace (a path relative to /workspace, for example \"output/summary.csv\"). Text comes back as text, from offset for at most max_bytes bytes; an image comes back as an image; another binary file as a resource link with its size.",
    "inputSchema": {
      "type": "object",
      "properties": {
        "session_id": {
          "type": "string",
          "description": "The session (from create_session)."
        },
        "path": {
          "type": "string",
          "description": "Path relative to /workspace."
        },
        "offset": {
          "type": "integer",
          "minimum": 0,
          "description": "Byte offset to start reading text at (default 0)."
        },
        "max_bytes": {
          "type": "integer",
          "minimum": 1,
          "maximum": 1048576,
          "description": "At most this many bytes of text (default 65536)."
        }
      },
      "required": ["session_id", "path"],
      "additionalProperties": false
    }
  },
  {
    "name": "list_files",
    "title": "List session files",
    "description": "List the files in a session's workspace (paths relative to /workspace, with their sizes), optionally only those whose path starts with prefix, for example \"output/\".",
    "inputSchema": {
      "type": "object",
      "properties": {
        "session_id": {
          "type": "string",
          "description": "The session (from create_session)."
        },
        "prefix": {
          "type": "string",
          "description": "Only paths starting with this, for example \"input/\" or \"output/artifacts/\"."
        }
      },
      "required": ["session_id"],
      "additionalProperties": false
    }
  }
]'''

_TOOLS: List[Dict[str, Any]] = json.loads(_TOOLS_JSON)

# name -> {name, title, description, inputSchema}, in the MCP server's order.
TOOL_SCHEMAS: Dict[str, Dict[str, Any]] = {t["name"]: t for t in _TOOLS}

RUN_PYTHON_SCHEMA: Dict[str, Any] = TOOL_SCHEMAS["run_python"]["inputSchema"]


def tool_definitions(style: str = "openai", names: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """The tools entries for a function-calling API: style "openai" (Chat
    Completions: {"type": "function", "function": {name, description,
    parameters}}), "openai-responses" ({"type": "function", name, ...}),
    "anthropic" ({name, description, input_schema}) or "mcp" ({name, title,
    description, inputSchema}, as the MCP server lists them). names: a
    subset (default all)."""
    out = []
    for name in names or list(TOOL_SCHEMAS):
        t = json.loads(json.dumps(TOOL_SCHEMAS[name]))  # a copy the caller may change
        schema = t["inputSchema"]
        if style == "openai":
            out.append({"type": "function", "function": {"name": name, "description": t["description"],
                                                         "parameters": schema}})
        elif style == "openai-responses":
            out.append({"type": "function", "name": name, "description": t["description"], "parameters": schema})
        elif style == "anthropic":
            out.append({"name": name, "description": t["description"], "input_schema": schema})
        elif style == "mcp":
            out.append(t)
        else:
            raise ValueError(f"style {style!r}: openai, openai-responses, anthropic or mcp")
    return out


@dataclass
class ToolResult:
    """What to give the model back for a run_python call, as the MCP
    server's run_python gives it (server/mcp/result.go): text (the same
    text: stdout, displayed values, the error as Python prints it or the end
    of stderr, how the run ended), images (the image artifacts inlined, with
    the same types and caps), links (the other artifacts, which MCP sends as
    resource links), is_error, structured (the whole answer without artifact
    bytes). tools/clients/python/test_unit.py and server/mcp's
    TestToolResultFixture check both against server/mcp/testdata/
    tool_results.json."""
    text: str
    is_error: bool = False
    images: List[Artifact] = field(default_factory=list)
    structured: Optional[Dict[str, Any]] = None
    execution: Optional[Execution] = field(default=None, repr=False)
    links: List[Artifact] = field(default_factory=list)

    @classmethod
    def from_execution(cls, ex: Execution) -> "ToolResult":
        images, links, inlined = [], [], 0
        for a in ex.artifacts:
            if a.is_image and a.size <= MAX_INLINE_IMAGE and inlined + a.size <= MAX_INLINE_IMAGES:
                images.append(a)
                inlined += a.size
            else:
                links.append(a)
        structured = {k: v for k, v in ex.raw.items() if k != "artifacts"}
        structured["artifacts"] = [{k: v for k, v in a.items() if k != "content_base64"}
                                   for a in _list(ex.raw.get("artifacts")) if isinstance(a, dict)]
        return cls(_answer_text(ex.raw), is_error=ex.status != "succeeded", images=images,
                   structured=structured, execution=ex, links=links)

    def anthropic_content(self) -> List[Dict[str, Any]]:
        """The content of an Anthropic tool_result block: the text, the
        images, and the names of the other artifacts."""
        out: List[Dict[str, Any]] = [{"type": "text", "text": self.text}]
        for a in self.images:
            out.append({"type": "image", "source": {"type": "base64", "media_type": a.media_type,
                                                    "data": a.content_base64}})
        if self.links:
            out.append({"type": "text", "text": "Artifacts: " + ", ".join(a.name for a in self.links)})
        return out


# _answer_text is server/mcp/result.go's answerText, line for line: the
# fixture server/mcp/testdata/tool_results.json pins both.
def _answer_text(d: Mapping[str, Any]) -> str:
    parts = []
    note = _session_note(_dict(d.get("session")))
    if note:
        parts.append(note)
    stdout = d.get("stdout") or ""
    if stdout:
        out = stdout.rstrip("\n")
        if (d.get("stdout_omitted_bytes") or 0) > 0:
            out += f"\n[stdout: {d['stdout_omitted_bytes']} bytes omitted from the middle]"
        elif d.get("stdout_truncated"):
            out += "\n[stdout truncated]"
        parts.append(out)
    for disp in _list(d.get("display")):
        mime = _dict(_dict(disp).get("mime"))
        shown = mime.get("text/markdown") or mime.get("text/plain")
        if shown:
            parts.append(shown)
    err = d.get("error")
    typed = err if isinstance(err, dict) and (err.get("text") or err.get("type")) else None
    if typed is not None:
        parts.append((typed.get("text") or f"{typed.get('type', '')}: {typed.get('message', '')}").rstrip("\n"))
        if typed.get("hint"):
            parts.append("Hint: " + typed["hint"])
    elif d.get("stderr"):
        parts.append(_stderr_tail(d))
    status = _status_line(d)
    if status:
        parts.append(status)
    result = d.get("result")
    if result is not None:
        shown = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
        parts.append("output/result.json: " + shown if len(shown.encode()) <= 4000 else
                     f"output/result.json: {len(shown.encode())} bytes (in structuredContent.result)")
    elif isinstance(d.get("result_error"), str) and not d["result_error"].endswith(" is missing"):
        parts.append("output/result.json: " + d["result_error"])
    for o in _list(d.get("artifacts_omitted")):
        o = _dict(o)
        parts.append(f"artifact {o.get('name', '')} not returned: {o.get('reason', '')}")
    return "\n\n".join(parts) or "(no output)"


def _session_note(s: Mapping[str, Any]) -> str:
    notes = []
    reason = s.get("reason") or ""
    if s.get("state") in ("new", "restarted") and reason not in ("", "first_execution", "kernel_disabled"):
        notes.append(f"Note: this session's Python was restarted before this run ({reason}): "
                     f"variables from earlier calls are gone, files are kept.")
    if s.get("kernel_ended"):
        notes.append(f"Note: this session's Python ended during this run ({s['kernel_ended']}): "
                     f"the next call starts a fresh one, files are kept.")
    return "\n".join(notes)


def _stderr_tail(d: Mapping[str, Any]) -> str:
    b = (d.get("stderr") or "").encode()
    cut = len(b) > 4000
    if cut:
        i = len(b) - 4000
        while i < len(b) and b[i] & 0xC0 == 0x80:
            i += 1
        b = b[i:]
    s = b.decode("utf-8", "replace").rstrip("\n")
    if cut or d.get("stderr_truncated") or (d.get("stderr_omitted_bytes") or 0) > 0:
        return "[stderr, last part]\n" + s
    return "[stderr]\n" + s


def _status_line(d: Mapping[str, Any]) -> str:
    status = d.get("status", "")
    msg = d.get("error") if isinstance(d.get("error"), str) else ""
    if status == "succeeded":
        return ""
    if status == "failed":
        if d.get("signal") is not None:
            return f"Failed: killed by {d['signal']}."
        return f"Failed with exit code {d.get('exit_code') or 0}."
    if status == "timeout":
        t = (_dict(d.get("policy")).get("timeout_ms") or 0) / 1000
        return (f"Timed out: stopped after {t:.3g} s (the time limit). Make the code faster, work on a sample, "
                f"or pass a larger timeout_s if the policy allows it.")
    if status == "oom":
        return (f"Out of memory: killed at the {_dict(d.get('policy')).get('memory_mb') or 0} MiB limit. "
                f"Use less memory (smaller dtypes, chunks, fewer copies).")
    if status == "cancelled":
        return "Cancelled before it finished."
    if status == "interrupted":
        return "Interrupted: the worker restarted while this ran; the code may have run in part. " + msg
    return f"Status {status}. {msg}".strip()
