"""Unit tests of the client's own logic: no sandbox, no root.

Where a behaviour needs a server that misbehaves on cue (a refusal with a
given Retry-After, a stream cut in the middle), a small scripted HTTP server
in this process plays it; everything the real worker does is tested against
the real worker in test_sandboxd.py.

    python3 -m unittest -v test_unit
"""

import base64
import hashlib
import http.server
import io
import json
import os
import threading
import unittest

import sandboxd


class Script(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next step of the server's script: a
    function (handler) -> None. Requests are recorded."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _do(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        srv = self.server
        with srv.lock:
            srv.requests.append((self.command, self.path, dict(self.headers), body))
            step = srv.steps.pop(0) if srv.steps else None
        if step is None:
            self.reply(500, {"error": "script ended"})
        else:
            step(self)

    do_GET = do_POST = do_PUT = do_DELETE = _do

    def reply(self, status, doc, headers=None):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


def result_doc(id_="x", stdout="", status="succeeded"):
    return {"id": id_, "type": "dynamic", "status": status, "exit_code": 0, "signal": None, "stdout": stdout,
            "stderr": "", "stdout_truncated": False, "stderr_truncated": False, "result": None, "artifacts": [],
            "artifacts_omitted": [], "limits_hit": [], "usage": {"wall_ms": 1, "cpu_ms": 1, "peak_memory_bytes": 1},
            "started_at": "2025-01-02T03:04:05.123456789Z", "finished_at": "2025-01-02T03:04:06Z",
            "duration_ms": 1, "policy": {"timeout_ms": 30000, "memory_mb": 1024, "cpus": 1, "pids": 128}}


class StubCase(unittest.TestCase):
    def setUp(self):
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Script)
        self.srv.daemon_threads = True
        self.srv.steps, self.srv.requests, self.srv.lock = [], [], threading.Lock()
        threading.Thread(target=self.srv.serve_forever, args=(0.05,), daemon=True).start()
        self.addCleanup(self.srv.server_close)
        self.addCleanup(self.srv.shutdown)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        self.slept = []

    def client(self, **kw):
        c = sandboxd.Client(self.url, token="t0k", timeout=10, **kw)
        c._sleep = self.slept.append  # no real waiting: the delays are recorded
        return c


class RetryTest(StubCase):
    def test_503_then_answer_retries_with_the_same_id(self):
        refuse = lambda h: h.reply(503, {"error": "not ready"}, {"Retry-After": "2"})
        self.srv.steps = [refuse, refuse, lambda h: h.reply(200, result_doc(stdout="ok\n"))]
        ex = self.client(retries=3).run("print('ok')")
        self.assertEqual(ex.stdout, "ok\n")
        self.assertEqual(len(self.srv.requests), 3)
        ids = {json.loads(r[3])["id"] for r in self.srv.requests}
        self.assertEqual(len(ids), 1, "a retry must repeat the same execution id: %s" % ids)
        for r in self.srv.requests:
            self.assertEqual(r[2]["Authorization"], "Bearer t0k")
        self.assertEqual(len(self.slept), 2)
        for d in self.slept:  # never sooner than asked, jitter bounded
            self.assertGreaterEqual(d, 2.0)
            self.assertLessEqual(d, 2.5)

    def test_retries_are_bounded(self):
        refuse = lambda h: h.reply(429, {"error": "over capacity: 1 running, 0 queued"}, {"Retry-After": "1"})
        self.srv.steps = [refuse] * 3
        with self.assertRaises(sandboxd.TooManyRequests) as cm:
            self.client(retries=2).run("1")
        self.assertEqual(cm.exception.retry_after, 1.0)
        self.assertIn("over capacity", cm.exception.message)
        self.assertEqual(len(self.srv.requests), 3)

    def test_retry_after_beyond_the_bound_is_not_waited_for(self):
        self.srv.steps = [lambda h: h.reply(429, {"error": "max sessions"}, {"Retry-After": "60"})]
        with self.assertRaises(sandboxd.TooManyRequests) as cm:
            self.client(retries=5, max_retry_wait=30).create_session()
        self.assertEqual(cm.exception.retry_after, 60.0)
        self.assertEqual(self.slept, [])

    def test_backoff_without_retry_after(self):
        refuse = lambda h: h.reply(503, {"error": "draining"})
        self.srv.steps = [refuse, refuse, refuse, lambda h: h.reply(200, result_doc())]
        self.client(retries=3).run("1")
        caps = [0.5, 1.0, 2.0]
        for d, cap in zip(self.slept, caps):
            self.assertGreaterEqual(d, cap / 2)
            self.assertLessEqual(d, cap)

    def test_non_retryable_body_is_not_resent(self):
        # A pipe-like body (not seekable) cannot be sent twice.
        class Pipe(io.RawIOBase):
            def __init__(self):
                self.left = [b"abc", b"def"]

            def readable(self):
                return True

            def readinto(self, b):
                if not self.left:
                    return 0
                c = self.left.pop(0)
                b[:len(c)] = c
                return len(c)

            def seekable(self):
                return False

        self.srv.steps = [lambda h: h.reply(503, {"error": "busy"}, {"Retry-After": "1"})]
        with self.assertRaises(sandboxd.ServiceUnavailable):
            self.client(retries=3).upload("s", "input/a.txt", Pipe())
        self.assertEqual(len(self.srv.requests), 1)


class CapacityTest(StubCase):
    def test_capacity(self):
        doc = {"worker_id": "node-a", "ready": True, "draining": False,
               "executions": {"slots": 2, "running": 1, "free_slots": 1, "queued": 0, "max_queued": 16},
               "warm_pool": {"size": {"dynamic/default": 1, "skill/default": 1},
                             "ready": {"dynamic/default": 1, "skill/default": 0}, "starting": 1},
               "sessions": {"available": True, "active": 1, "busy": 0, "idle": 1, "max": 64,
                            "idle_memory_bytes": 1, "idle_memory_limit_bytes": 2}}
        self.srv.steps = [lambda h: h.reply(429, {"error": "busy"}, {"Retry-After": "1"}), lambda h: h.reply(200, doc)]
        self.assertEqual(self.client().capacity(), doc)
        self.assertEqual([(r[0], r[1]) for r in self.srv.requests], [("GET", "/v1/capacity")] * 2)
        self.assertEqual(self.srv.requests[0][2]["Authorization"], "Bearer t0k")


class ErrorTest(StubCase):
    def check(self, status, doc, cls, code=None):
        self.srv.steps = [lambda h: h.reply(status, doc)]
        with self.assertRaises(cls) as cm:
            self.client(retries=0).get_session("s1")
        e = cm.exception
        self.assertIsInstance(e, sandboxd.APIError)
        self.assertEqual(e.status, status)
        self.assertEqual(e.code, code)
        if isinstance(doc, dict):
            self.assertEqual(e.message, doc["error"])
            self.assertIn(doc["error"], str(e))

    def test_each_status_has_its_class(self):
        for status, cls in [(400, sandboxd.BadRequest), (401, sandboxd.Unauthorized), (403, sandboxd.Forbidden),
                            (404, sandboxd.NotFound), (408, sandboxd.RequestTimeout), (409, sandboxd.Conflict),
                            (410, sandboxd.Gone), (413, sandboxd.PayloadTooLarge), (415, sandboxd.UnsupportedMediaType),
                            (416, sandboxd.RangeNotSatisfiable), (422, sandboxd.Unprocessable),
                            (429, sandboxd.TooManyRequests), (500, sandboxd.ServerError),
                            (503, sandboxd.ServiceUnavailable), (507, sandboxd.InsufficientStorage),
                            (418, sandboxd.ClientError)]:
            with self.subTest(status=status):
                self.check(status, {"error": "message %d" % status}, cls)

    def test_codes(self):
        self.check(409, {"error": "session is busy", "code": "session_busy"}, sandboxd.SessionBusy, "session_busy")
        self.check(409, {"error": "nothing runs", "code": "not_running"}, sandboxd.NotRunning, "not_running")

    def test_a_body_that_is_not_json(self):
        self.srv.steps = [lambda h: (h.send_response(502), h.send_header("Content-Length", "7"), h.end_headers(),
                                     h.wfile.write(b"bad gw\n"))]
        with self.assertRaises(sandboxd.ServerError) as cm:
            self.client(retries=0).get_session("s1")
        self.assertEqual(cm.exception.message, "bad gw")

    def test_refused_connection(self):
        c = sandboxd.Client("http://127.0.0.1:1", retries=0)
        with self.assertRaises(sandboxd.TransportError):
            c.get_session("s")


class StreamTest(StubCase):
    def sse_start(self, h):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()

    def test_resume_after_a_dropped_connection(self):
        def first(h):
            self.sse_start(h)
            h.wfile.write(b'id: 1\nevent: stdout\ndata: {"text": "a\\n"}\n\n'
                          b': a comment\n'
                          b'id: 2\nevent: figure\ndata: {"name": "figure-1.png", "width": 640, "height": 480}\n\n'
                          b'id: 3\nevent: stdout\ndata: {"text": "lost')  # cut in the middle of an event
            h.wfile.flush()
            h.close_connection = True

        def second(h):
            self.sse_start(h)
            doc = result_doc(stdout="a\nb\n")
            h.wfile.write(b'id: 3\nevent: stdout\ndata: {"text": "b\\n"}\n\n'
                          b'id: 4\nevent: display\ndata: {"mime": {"text/plain": "2"}}\n\n'
                          b'id: 5\nevent: result\ndata: ' + json.dumps(doc).encode() + b'\n\n')
            h.close_connection = True

        self.srv.steps = [first, second]
        es = self.client(retries=2).stream("print('a'); print('b')", id="ex1")
        self.assertTrue(es.streaming)
        evs = list(es)
        self.assertEqual([e.type for e in evs], ["stdout", "figure", "stdout", "display", "result"])
        self.assertIsInstance(evs[0], sandboxd.StdoutEvent)
        self.assertEqual((evs[1].name, evs[1].width, evs[1].height), ("figure-1.png", 640, 480))
        self.assertEqual(evs[2].text, "b\n")
        self.assertEqual(evs[3].display.text, "2")
        self.assertEqual(es.result.stdout, "a\nb\n")
        self.assertEqual(es.reconnects, 1)
        method, path, headers, _ = self.srv.requests[1]
        self.assertEqual((method, path), ("GET", "/v1/executions/ex1/events"))
        self.assertEqual(headers.get("Last-Event-ID"), "2")
        self.assertEqual(headers.get("Accept"), "text/event-stream")

    def test_a_session_stream_resumes_under_its_session(self):
        # A session's execution is resumed by its session's route, which any
        # worker forwards to the session's owner (/v1/executions/{id} is
        # answered only where it lands).
        def first(h):
            self.sse_start(h)
            h.wfile.write(b'id: 1\nevent: stdout\ndata: {"text": "a\\n"}\n\n')
            h.close_connection = True

        def second(h):
            self.sse_start(h)
            h.wfile.write(b'id: 2\nevent: result\ndata: ' + json.dumps(result_doc("ex3", "a\n")).encode() + b'\n\n')
            h.close_connection = True

        self.srv.steps = [first, second]
        es = self.client(retries=2).session("se-1").stream("print('a')", id="ex3")
        self.assertEqual([e.type for e in es], ["stdout", "result"])
        self.assertEqual([r[:2] for r in self.srv.requests],
                         [("POST", "/v1/sessions/se-1/executions"), ("GET", "/v1/sessions/se-1/executions/ex3/events")])
        self.assertEqual(self.srv.requests[1][2].get("Last-Event-ID"), "1")

    def test_a_server_that_does_not_stream(self):
        self.srv.steps = [lambda h: h.reply(200, result_doc(stdout="1\n"))]
        es = self.client().stream("print(1)")
        self.assertFalse(es.streaming)
        evs = list(es)
        self.assertEqual(len(evs), 1)
        self.assertIsInstance(evs[0], sandboxd.ResultEvent)
        self.assertEqual(evs[0].execution.stdout, "1\n")

    def test_gives_up_after_its_retries(self):
        # An event resets the count (progress); two connections in a row
        # without one exceed retries=1.
        def cut(h, event=b""):
            self.sse_start(h)
            h.wfile.write(event)
            h.close_connection = True

        self.srv.steps = [lambda h: cut(h, b'id: 1\nevent: stdout\ndata: {"text": "a"}\n\n'), cut]
        es = self.client(retries=1).stream("x", id="ex2")
        with self.assertRaises(sandboxd.TransportError):
            list(es)
        self.assertEqual(len(self.srv.requests), 2)
        self.assertEqual(self.srv.requests[1][2].get("Last-Event-ID"), "1")

    def test_parse_sse(self):
        lines = [b"event: a\r\n", b"data: 1\r\n", b"data: 2\r\n", b"\r\n", b"data:x\n", b"\n", b"retry: 5\n",
                 b"event: unfinished\n"]
        self.assertEqual(list(sandboxd.parse_sse(iter(lines))), [("a", None, "1\n2"), ("message", None, "x")])


class SessionExecutionTest(StubCase):
    def test_submit_then_wait_cancel_and_events_under_the_session(self):
        running = {"id": "ex4", "type": "dynamic", "status": "running", "started_at": None,
                   "policy": {"timeout_ms": 30000, "memory_mb": 1024, "cpus": 1, "pids": 128}}
        self.srv.steps = [
            lambda h: h.reply(202, {"id": "ex4", "status": "running"},
                              {"Location": "/v1/sessions/se-1/executions/ex4"}),
            lambda h: h.reply(200, running),
            lambda h: h.reply(200, result_doc("ex4")),
            lambda h: h.reply(200, result_doc("ex4", status="cancelled")),
        ]
        c = self.client()
        eid = c.session("se-1").submit("x", id="ex4")
        self.assertIsInstance(eid, str)
        self.assertEqual((eid, eid.session), ("ex4", "se-1"))
        self.assertEqual(c.wait(eid).status, "succeeded")
        self.assertEqual(c.cancel(eid).status, "cancelled")
        self.assertEqual([r[:2] for r in self.srv.requests], [
            ("POST", "/v1/sessions/se-1/executions"),
            ("GET", "/v1/sessions/se-1/executions/ex4"),
            ("GET", "/v1/sessions/se-1/executions/ex4"),
            ("DELETE", "/v1/sessions/se-1/executions/ex4"),
        ])

    def test_explicit_session_and_plain_ids(self):
        self.srv.steps = [lambda h: h.reply(200, result_doc("a/b")), lambda h: h.reply(200, result_doc("ex5")),
                          lambda h: h.reply(200, result_doc("ex6")), lambda h: h.reply(200, result_doc("ex6"))]
        c = self.client()
        c.get_execution("a/b", session="se 2")
        c.session("se-3").wait("ex5")
        c.wait("ex6")  # a plain id: the execution's own route
        sub = c.submit("x", id="ex6")  # not a session's: no session
        self.assertIsNone(sub.session)
        self.assertEqual([r[:2] for r in self.srv.requests], [
            ("GET", "/v1/sessions/se%202/executions/a%2Fb"),
            ("GET", "/v1/sessions/se-3/executions/ex5"),
            ("GET", "/v1/executions/ex6"),
            ("POST", "/v1/executions"),
        ])


class TypesTest(unittest.TestCase):
    def test_typed_error_and_artifacts(self):
        png = b"\x89PNG\r\n\x1a\nfake"
        doc = result_doc(status="failed")
        doc.update({
            "exit_code": 1,
            "error": {"type": "KeyError", "message": "'revenue'", "line": 3,
                      "traceback": [{"file": "/workspace/code/main.py", "line": 3, "function": "<module>",
                                     "source": "df['revenue']"}],
                      "text": "Traceback (most recent call last):\n  ...\nKeyError: 'revenue'\n",
                      "hint": "columns: region, sales"},
            "display": [{"mime": {"text/plain": "42", "text/markdown": "**42**"}}],
            "artifacts": [{"name": "figure-1.png", "size": len(png), "media_type": "image/png",
                           "sha256": hashlib.sha256(png).hexdigest(), "width": 1, "height": 2,
                           "content_base64": base64.b64encode(png).decode()},
                          {"name": "bad.txt", "size": 1, "media_type": "text/plain", "sha256": "0" * 64,
                           "content_base64": "eA=="}],
            "stdout_omitted_bytes": 10,
        })
        ex = sandboxd.Execution.from_json(doc)
        self.assertFalse(ex.ok)
        self.assertEqual(ex.error.type, "KeyError")
        self.assertEqual(ex.error.traceback[0].line, 3)
        self.assertEqual(ex.display[0].markdown, "**42**")
        self.assertEqual(ex.started_at.microsecond, 123456)
        self.assertEqual([a.name for a in ex.figures], ["figure-1.png"])
        self.assertIsNone(ex.artifacts[0]._data, "decoded before use")
        self.assertEqual(ex.artifact("figure-1.png").data, png)
        with self.assertRaises(sandboxd.ProtocolError):
            ex.artifact("bad.txt").data  # sha256 mismatch
        with self.assertRaises(sandboxd.ExecutionFailed) as cm:
            ex.check()
        self.assertIn("KeyError: 'revenue'", str(cm.exception))
        tr = sandboxd.ToolResult.from_execution(ex)
        self.assertTrue(tr.is_error)
        self.assertIn("Hint: columns: region, sales", tr.text)
        self.assertEqual([a.name for a in tr.links], ["bad.txt"])
        self.assertEqual(len(tr.images), 1)
        self.assertNotIn("content_base64", json.dumps(tr.structured))
        self.assertEqual(tr.anthropic_content()[1]["source"]["media_type"], "image/png")

    def test_legacy_error_string(self):
        doc = result_doc(status="sandbox_error")
        doc["error"] = "the sandbox could not start"
        ex = sandboxd.Execution.from_json(doc)
        self.assertIsNone(ex.error)
        self.assertEqual(ex.error_message, "the sandbox could not start")
        self.assertIn("could not start", str(sandboxd.ExecutionFailed(ex)))

    def test_tool_definitions(self):
        for style, key in [("openai", None), ("anthropic", "input_schema"), ("mcp", "inputSchema"),
                           ("openai-responses", "parameters")]:
            defs = sandboxd.tool_definitions(style)
            self.assertEqual([d.get("name") or d["function"]["name"] for d in defs],
                             ["run_python", "create_session", "close_session", "upload_file", "read_file",
                              "list_files"])
            schema = defs[0]["function"]["parameters"] if style == "openai" else defs[0][key]
            self.assertEqual(schema, sandboxd.RUN_PYTHON_SCHEMA)
            self.assertIsNot(schema, sandboxd.RUN_PYTHON_SCHEMA)
        with self.assertRaises(ValueError):
            sandboxd.tool_definitions("other")
        self.assertEqual(sandboxd.tool_definitions("mcp"), list(sandboxd.TOOL_SCHEMAS.values()))

    def test_tool_result_fixture(self):
        """ToolResult is server/mcp's run_python result, text for text:
        both are checked against server/mcp/testdata/tool_results.json."""
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                            "server", "mcp", "testdata", "tool_results.json")
        with open(path, encoding="utf-8") as f:
            cases = json.load(f)
        self.assertGreater(len(cases), 5)
        for c in cases:
            with self.subTest(c["name"]):
                tr = sandboxd.ToolResult.from_execution(sandboxd.Execution.from_json(c["answer"]))
                self.assertEqual(tr.text, c["text"])
                self.assertEqual(tr.is_error, c["is_error"])
                self.assertEqual([a.name for a in tr.images], c["images"])
                self.assertEqual([a.name for a in tr.links], c["links"])

    def test_tool_result_image_types_and_caps(self):
        """As server/mcp: PNG, JPEG, GIF, WebP only (never SVG), 5 MiB each,
        16 MiB per result; the rest are links."""
        mb = 1 << 20
        arts = [("a.png", "image/png", 5 * mb), ("s.svg", "image/svg+xml", 10), ("b.jpg", "image/jpeg", 5 * mb),
                ("big.png", "image/png", 5 * mb + 1), ("c.webp", "image/webp", 5 * mb), ("d.gif", "image/gif", 2 * mb),
                ("e.gif", "image/gif", mb), ("t.csv", "text/csv", 3)]
        ex = sandboxd.Execution.from_json({"id": "x", "status": "succeeded", "artifacts": [
            {"name": n, "media_type": t, "size": z} for n, t, z in arts]})
        tr = sandboxd.ToolResult.from_execution(ex)
        self.assertEqual([a.name for a in tr.images], ["a.png", "b.jpg", "c.webp", "e.gif"])
        self.assertEqual([a.name for a in tr.links], ["s.svg", "big.png", "d.gif", "t.csv"])
        self.assertFalse(sandboxd.Artifact("s.svg", media_type="image/svg+xml").is_image)
        self.assertEqual(tr.anthropic_content()[-1]["text"], "Artifacts: s.svg, big.png, d.gif, t.csv")

    def test_call_tool_refuses_bad_calls_as_results(self):
        c = sandboxd.Client("http://127.0.0.1:1", retries=0)
        for name, args in [("nope", {}), ("run_python", "{not json"), ("run_python", {"kode": "1"}),
                           ("upload_file", {"session_id": "s", "path": "a", "text": "x"}), ("list_files", {})]:
            with self.subTest(name=name, args=args):
                r = c.call_tool(name, args)
                self.assertTrue(r.is_error, r)

    def test_base_urls(self):
        self.assertEqual(sandboxd.Client("unix:///run/sandboxd.sock")._unix, "/run/sandboxd.sock")
        self.assertEqual(sandboxd.Client("http://h:1/prefix/")._prefix, "/prefix")
        for bad in ["ftp://h", "http://", "unix://"]:
            with self.assertRaises(ValueError):
                sandboxd.Client(bad)


if __name__ == "__main__":
    unittest.main()
