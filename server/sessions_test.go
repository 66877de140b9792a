package server

// Sessions through the HTTP API on the real runtime: the agent flow of
// issue 12 (files and Python state across executions), one execution at a
// time, interrupt, timeouts and OOM that end the kernel while the files
// survive, the quota from inside the sandbox and at the file API, and
// hostile paths. Kernels here start cold (pool_size 0), as a pool-less
// worker's do; the warm hand-off is warmpool's to test.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/volume"
)

// newSessionEnv is newEnv whose sessions are deleted when the test ends,
// before the server drains (their volumes would stay mounted otherwise).
func newSessionEnv(t *testing.T, rootfs string, mod func(*config.Config)) *testEnv {
	e := newEnv(t, rootfs, mod)
	t.Cleanup(e.deleteSessions)
	return e
}

func (e *testEnv) deleteSessions() {
	code, _, body := e.do("GET", "/v1/sessions", nil)
	var list sessionList
	if code != http.StatusOK || json.Unmarshal(body, &list) != nil {
		e.t.Errorf("GET /v1/sessions = %d %s", code, body)
		return
	}
	for _, s := range list.Sessions {
		if code, _, body := e.do("DELETE", "/v1/sessions/"+s.ID, nil); code != http.StatusNoContent {
			e.t.Errorf("DELETE session %s = %d %s", s.ID, code, body)
		}
	}
}

// createSession POSTs req to /v1/sessions and decodes the 201.
func (e *testEnv) createSession(req SessionRequest) SessionView {
	e.t.Helper()
	code, _, body := e.do("POST", "/v1/sessions", req)
	if code != http.StatusCreated {
		e.t.Fatalf("POST /v1/sessions = %d: %s", code, body)
	}
	var v SessionView
	if err := json.Unmarshal(body, &v); err != nil {
		e.t.Fatalf("decode session: %v\n%s", err, body)
	}
	return v
}

// sessionExec runs code in session id and decodes the 200.
func (e *testEnv) sessionExec(id string, req SessionExecutionRequest) *ExecutionResponse {
	e.t.Helper()
	code, _, body := e.do("POST", "/v1/sessions/"+id+"/executions", req)
	if code != http.StatusOK {
		e.t.Fatalf("POST /v1/sessions/%s/executions = %d: %s", id, code, body)
	}
	var resp ExecutionResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		e.t.Fatalf("decode response: %v\n%s", err, body)
	}
	if resp.Session == nil {
		e.t.Fatalf("a session's execution without its session block: %s", body)
	}
	return &resp
}

func wantState(t *testing.T, r *ExecutionResponse, state, reason string, generation int64) {
	t.Helper()
	if got := *r.Session; got.State != state || got.Reason != reason || got.KernelGeneration != generation {
		t.Fatalf("session %+v, want state %s reason %q generation %d (stdout %q stderr %q)", got, state, reason, generation, r.Stdout, r.Stderr)
	}
}

// put PUTs data at path in session id and returns the status and body.
func (e *testEnv) put(id, path string, data []byte) (int, []byte) {
	e.t.Helper()
	code, _, body := e.do("PUT", "/v1/sessions/"+id+"/files/"+path, data)
	return code, body
}

const chartCode = `import json, matplotlib.pyplot as plt
fig, ax = plt.subplots()
df.groupby("region")["units"].sum().plot.bar(ax=ax)
fig.savefig("output/artifacts/chart.png")
json.dump({"regions": int(df["region"].nunique())}, open("output/result.json", "w"))
`

// The agent flow of issue 12: PUT a CSV, load it, reuse the DataFrame in
// the next execution, write a chart, GET it back; only what an execution
// created or changed is its artifact; the answer is stored as any other.
func TestSessionAgentFlow(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	s := e.createSession(SessionRequest{ID: "analysis", Type: TypeDynamic})
	pol := e.srv.policies[TypeDynamic]
	pol.Name, pol.Runtime = "", "" // not in JSON (the session's runtime is its own)
	if s.ID != "analysis" || s.Type != TypeDynamic || s.Policy != pol || !s.Kernel.Enabled ||
		(s.Kernel.State != session.KernelNone && s.Kernel.State != session.KernelStarting) || s.Workspace.MaxBytes != e.cfg.SessionMaxBytes || s.Workspace.MaxFiles != e.cfg.SessionMaxFiles {
		t.Fatalf("new session %+v", s)
	}
	code, body := e.put("analysis", "data/sales.csv", []byte(salesCSV))
	var fi FileInfo
	if code != http.StatusOK || json.Unmarshal(body, &fi) != nil || fi.Size != int64(len(salesCSV)) || fi.Path != "data/sales.csv" {
		t.Fatalf("PUT = %d %s", code, body)
	}

	r := e.sessionExec("analysis", SessionExecutionRequest{Code: "import pandas as pd\ndf = pd.read_csv('data/sales.csv')\nprint(len(df))"})
	wantExecStatus(t, r, "succeeded")
	wantState(t, r, session.StateNew, session.ReasonFirst, 1)
	if r.Stdout != "5\n" || r.Type != TypeDynamic || len(r.Artifacts) != 0 {
		t.Fatalf("load: %+v", r)
	}
	r = e.sessionExec("analysis", SessionExecutionRequest{Code: "print(int(df['units'].sum()))"})
	wantExecStatus(t, r, "succeeded")
	wantState(t, r, session.StatePreserved, "", 1)
	if r.Stdout != "12\n" {
		t.Fatalf("the DataFrame did not persist: %q %q", r.Stdout, r.Stderr)
	}
	chart := e.sessionExec("analysis", SessionExecutionRequest{Code: chartCode})
	wantExecStatus(t, chart, "succeeded")
	if len(chart.Artifacts) != 1 || chart.Artifacts[0].Name != "chart.png" || chart.Artifacts[0].MediaType != "image/png" ||
		string(chart.Result) != `{"regions":2}` {
		t.Fatalf("chart: artifacts %+v result %s (%v)", chart.Artifacts, chart.Result, chart.ResultError)
	}
	png, _ := base64.StdEncoding.DecodeString(chart.Artifacts[0].ContentBase64)
	// Nothing changed under output/: no artifact, no result.
	r = e.sessionExec("analysis", SessionExecutionRequest{Code: "x = 1"})
	wantExecStatus(t, r, "succeeded")
	if len(r.Artifacts) != 0 || string(r.Result) != "null" || r.ResultError == nil || !strings.Contains(*r.ResultError, "not written by this execution") {
		t.Fatalf("an execution that wrote nothing: artifacts %+v result %s %q", r.Artifacts, r.Result, *r.ResultError)
	}

	code, h, got := e.do("GET", "/v1/sessions/analysis/files/output/artifacts/chart.png", nil)
	if code != http.StatusOK || !bytes.Equal(got, png) || h.Get("Content-Type") != "image/png" ||
		h.Get("ETag") != `"`+chart.Artifacts[0].SHA256+`"` || h.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("GET chart = %d %v (%d bytes, want %d)", code, h, len(got), len(png))
	}
	code, _, got = e.do("GET", "/v1/sessions/analysis/files/output/artifacts/chart.png", nil, "Range", "bytes=1-3")
	if code != http.StatusPartialContent || string(got) != string(png[1:4]) {
		t.Fatalf("GET a range = %d %q", code, got)
	}
	if code, _, _ := e.do("GET", "/v1/sessions/analysis/files/output/artifacts/chart.png", nil, "If-None-Match", h.Get("ETag")); code != http.StatusNotModified {
		t.Fatalf("GET If-None-Match = %d", code)
	}
	code, _, got = e.do("GET", "/v1/sessions/analysis/files?prefix=output/", nil)
	var list FileList
	if code != http.StatusOK || json.Unmarshal(got, &list) != nil || len(list.Files) != 2 ||
		list.Files[0].Name != "output/artifacts/chart.png" || list.Files[1].Name != "output/result.json" {
		t.Fatalf("list = %d %s", code, got)
	}
	// The stored answer is the execution's, session block included.
	code, _, got = e.do("GET", "/v1/executions/"+chart.ID, nil)
	var stored ExecutionResponse
	if code != http.StatusOK || json.Unmarshal(got, &stored) != nil || stored.Session == nil || *stored.Session != *chart.Session ||
		len(stored.Artifacts) != 1 || stored.Artifacts[0].ContentBase64 != chart.Artifacts[0].ContentBase64 {
		t.Fatalf("GET /v1/executions/%s = %d %.300s", chart.ID, code, got)
	}
	code, _, got = e.do("GET", "/v1/sessions/analysis", nil)
	if code != http.StatusOK || json.Unmarshal(got, &s) != nil || s.Kernel.State != session.KernelIdle || s.Kernel.Generation != 1 ||
		s.Workspace.FilesUsed == 0 || s.Workspace.BytesUsed < int64(len(png)) {
		t.Fatalf("GET session = %d %s", code, got)
	}

	// Files sent with an execution land in input/ and persist.
	r = e.sessionExec("analysis", SessionExecutionRequest{Code: "print(open('input/note.txt').read())",
		Files: []File{{Path: "note.txt", ContentBase64: b64("hello")}}})
	if r.Stdout != "hello\n" {
		t.Fatalf("execution files: %q %q", r.Stdout, r.Stderr)
	}
	if code, _, got := e.do("GET", "/v1/sessions/analysis/files/input/note.txt", nil); code != http.StatusOK || string(got) != "hello" {
		t.Fatalf("GET input/note.txt = %d %q", code, got)
	}
	if code, _, _ := e.do("DELETE", "/v1/sessions/analysis/files/input/note.txt", nil); code != http.StatusNoContent {
		t.Fatalf("DELETE file = %d", code)
	}
	if code, _, _ := e.do("GET", "/v1/sessions/analysis/files/input/note.txt", nil); code != http.StatusNotFound {
		t.Fatalf("GET a deleted file = %d", code)
	}
	if code, _, _ := e.do("DELETE", "/v1/sessions/analysis", nil); code != http.StatusNoContent {
		t.Fatalf("DELETE session = %d", code)
	}
	if code, _, _ := e.do("GET", "/v1/sessions/analysis/files/data/sales.csv", nil); code != http.StatusNotFound {
		t.Fatalf("a deleted session's file = %d", code)
	}
}

// kernel: false: every execution is a fresh sandbox on the session's
// files, and says so.
func TestSessionWithoutKernel(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	off := false
	e.createSession(SessionRequest{ID: "nokernel", Kernel: &off})
	r := e.sessionExec("nokernel", SessionExecutionRequest{Code: "x = 1\nopen('kept.txt', 'w').write('k')"})
	wantExecStatus(t, r, "succeeded")
	wantState(t, r, session.StateNew, session.ReasonNoKernel, 1)
	r = e.sessionExec("nokernel", SessionExecutionRequest{Code: "print(open('kept.txt').read())\nprint(x)"})
	wantExecStatus(t, r, "failed")
	wantState(t, r, session.StateNew, session.ReasonNoKernel, 2)
	if r.Stdout != "k\n" || !strings.Contains(r.Stderr, "NameError") {
		t.Fatalf("files kept, state not: %q %q", r.Stdout, r.Stderr)
	}
}

// One execution at a time (409 session_busy), interrupt raises
// KeyboardInterrupt in it and the state survives; interrupt with nothing
// running is 409.
func TestSessionBusyAndInterrupt(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	e.createSession(SessionRequest{ID: "busy"})
	wantExecStatus(t, e.sessionExec("busy", SessionExecutionRequest{Code: "kept = 41"}), "succeeded")
	var wg sync.WaitGroup
	var slow *ExecutionResponse
	wg.Add(1)
	go func() {
		defer wg.Done()
		slow = e.sessionExec("busy", SessionExecutionRequest{Code: "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"})
	}()
	waitFor(t, func() bool {
		_, _, body := e.do("GET", "/v1/sessions/busy", nil)
		var v SessionView
		return json.Unmarshal(body, &v) == nil && v.Kernel.State == session.KernelBusy
	})
	code, _, body := e.do("POST", "/v1/sessions/busy/executions", SessionExecutionRequest{Code: "print(1)"})
	var eb errorBody
	if code != http.StatusConflict || json.Unmarshal(body, &eb) != nil || eb.Code != "session_busy" {
		t.Fatalf("a second execution = %d %s", code, body)
	}
	if code, _, body := e.do("POST", "/v1/sessions/busy/interrupt", nil); code != http.StatusNoContent {
		t.Fatalf("interrupt = %d %s", code, body)
	}
	wg.Wait()
	wantExecStatus(t, slow, "failed")
	if !strings.Contains(slow.Stderr, "KeyboardInterrupt") || slow.Session.KernelEnded != "" {
		t.Fatalf("interrupted: %+v %q", slow.Session, slow.Stderr)
	}
	r := e.sessionExec("busy", SessionExecutionRequest{Code: "print(kept + 1)"})
	wantState(t, r, session.StatePreserved, "", 1)
	if r.Stdout != "42\n" {
		t.Fatalf("state after the interrupt: %q %q", r.Stdout, r.Stderr)
	}
	code, _, body = e.do("POST", "/v1/sessions/busy/interrupt", nil)
	if code != http.StatusConflict || json.Unmarshal(body, &eb) != nil || eb.Code != "not_running" {
		t.Fatalf("interrupt with nothing running = %d %s", code, body)
	}
}

// A timeout the code ignores and an OOM end the kernel; the files survive,
// and the next execution says why its state is new. A timeout the code
// does not fight only interrupts it.
func TestSessionTimeoutAndOOMEndTheKernelNotTheFiles(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), func(c *config.Config) { c.DynamicMemoryMB = 256 })
	e.createSession(SessionRequest{ID: "ends"})
	r := e.sessionExec("ends", SessionExecutionRequest{Code: "state = 1\nopen('survivor.txt', 'w').write('still here')"})
	wantExecStatus(t, r, "succeeded")

	r = e.sessionExec("ends", SessionExecutionRequest{Code: "while True:\n    pass", TimeoutMS: 1000})
	wantExecStatus(t, r, "timeout")
	if r.Session.KernelEnded != "" {
		t.Fatalf("an interruptible loop ended the kernel: %+v", r.Session)
	}
	r = e.sessionExec("ends", SessionExecutionRequest{Code: "print(state)"})
	wantState(t, r, session.StatePreserved, "", 1)

	r = e.sessionExec("ends", SessionExecutionRequest{Code: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", TimeoutMS: 1000})
	wantExecStatus(t, r, "timeout")
	if r.Session.KernelEnded != "timeout" {
		t.Fatalf("a kernel ignoring the interrupt: %+v", r.Session)
	}
	r = e.sessionExec("ends", SessionExecutionRequest{Code: "print(open('survivor.txt').read())\nprint('state' in globals())"})
	wantState(t, r, session.StateNew, "timeout", 2)
	if r.Stdout != "still here\nFalse\n" {
		t.Fatalf("after the timeout: %q %q", r.Stdout, r.Stderr)
	}

	r = e.sessionExec("ends", SessionExecutionRequest{Code: "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))"})
	wantExecStatus(t, r, "oom")
	if r.Session.KernelEnded != "oom" {
		t.Fatalf("OOM: %+v", r.Session)
	}
	r = e.sessionExec("ends", SessionExecutionRequest{Code: "print(open('survivor.txt').read())"})
	wantState(t, r, session.StateNew, "oom", 3)
	if r.Stdout != "still here\n" {
		t.Fatalf("after the OOM: %q %q", r.Stdout, r.Stderr)
	}
}

// The quota holds from inside the sandbox (ENOSPC to the code, by bytes and
// by files) and at the API (413: an upload, an execution's files; nothing
// written, nothing run).
func TestSessionQuota(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), func(c *config.Config) { c.SessionMaxBytes, c.SessionMaxFiles = 4<<20, 64 })
	e.createSession(SessionRequest{ID: "small"})
	r := e.sessionExec("small", SessionExecutionRequest{Code: `import errno
try:
    with open("big.bin", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
except OSError as e:
    print("bytes", errno.errorcode[e.errno])
import os
os.remove("big.bin")
try:
    for i in range(1000):
        open("f%d" % i, "w").close()
except OSError as e:
    print("files", errno.errorcode[e.errno], i < 64)
for i in range(1000):
    if os.path.exists("f%d" % i):
        os.remove("f%d" % i)
`})
	wantExecStatus(t, r, "succeeded")
	if r.Stdout != "bytes ENOSPC\nfiles ENOSPC True\n" {
		t.Fatalf("inside the sandbox: %q %q", r.Stdout, r.Stderr)
	}
	before := e.sessionUsage("small")
	if code, body := e.put("small", "big.bin", bytes.Repeat([]byte("y"), 5<<20)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("PUT over the quota = %d %s", code, body)
	}
	// Sent without a length: refused once the quota is hit, nothing kept.
	req, _ := http.NewRequest("PUT", e.http.URL+"/v1/sessions/small/files/chunked.bin", io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("z"), 3<<20)), bytes.NewReader(bytes.Repeat([]byte("z"), 3<<20))))
	req.ContentLength = -1
	resp, err := e.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked PUT over the quota = %d", resp.StatusCode)
	}
	ran := e.sandbox.started.Load()
	code, _, body := e.do("POST", "/v1/sessions/small/executions", SessionExecutionRequest{Code: "print(1)",
		Files: []File{{Path: "a.bin", ContentBase64: base64.StdEncoding.EncodeToString(make([]byte, 5<<20))}}})
	wantError(t, code, body, http.StatusRequestEntityTooLarge, "do not fit the session's workspace")
	if n := e.sandbox.started.Load(); n != ran {
		t.Fatalf("a refused execution started %d sandboxes", n-ran)
	}
	if after := e.sessionUsage("small"); after != before {
		t.Fatalf("refusals changed the usage: %+v, then %+v", before, after)
	}
	if _, _, metrics := e.do("GET", "/metrics", nil); !strings.Contains(string(metrics), "sandboxd_session_quota_refusals_total 3\n") {
		t.Errorf("the three refusals are not counted")
	}
	if code, _, body := e.do("GET", "/v1/sessions/small/files", nil); code != http.StatusOK || !strings.Contains(string(body), `"files":[]`) {
		t.Fatalf("files left: %s", body)
	}
}

func (e *testEnv) sessionUsage(id string) session.WorkspaceInfo {
	e.t.Helper()
	code, _, body := e.do("GET", "/v1/sessions/"+id, nil)
	var v SessionView
	if code != http.StatusOK || json.Unmarshal(body, &v) != nil {
		e.t.Fatalf("GET session = %d %s", code, body)
	}
	return v.Workspace
}

// SECURITY.md cases 38 and 46 over HTTP: what the code leaves in its
// workspace (links, FIFOs) and hostile paths and ids in the URL are refused
// without blocking, and never reach outside the volume.
func TestSessionHostileFilePaths(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	e.createSession(SessionRequest{ID: "hostile"})
	r := e.sessionExec("hostile", SessionExecutionRequest{Code: `import os
os.symlink("/etc/passwd", "link")
os.mkfifo("fifo")
os.makedirs("dir")
os.symlink("/etc", "dirlink")
open("ok.txt", "w").write("ok")
`})
	wantExecStatus(t, r, "succeeded")
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"GET", "link", 409}, {"GET", "fifo", 409}, {"PUT", "fifo", 409}, {"GET", "dir", 409},
		{"GET", "dirlink/passwd", 409}, {"PUT", "dirlink/x", 409}, {"DELETE", "fifo", 409},
		{"GET", "%2e%2e/%2e%2e/etc/passwd", 400}, {"GET", "a/%2e%2e/%2e%2e/b", 400}, {"PUT", "..%2fx", 400},
		{"GET", "a%00b", 400}, {"GET", strings.Repeat("n", 300), 400}, {"GET", "a//b", 400}, {"GET", "", 400},
		{"GET", "missing", 404}, {"GET", "ok.txt", 200},
	} {
		code, _, body := e.do(c.method, "/v1/sessions/hostile/files/"+c.path, "x")
		if code != c.status {
			t.Errorf("%s %.40s = %d %s, want %d", c.method, c.path, code, body, c.status)
		}
	}
	_, _, body := e.do("GET", "/v1/sessions/hostile/files", nil)
	var list FileList
	if json.Unmarshal(body, &list) != nil || len(list.Files) != 1 || list.Files[0].Name != "ok.txt" {
		t.Fatalf("list shows only regular files: %s", body)
	}
	for _, id := range []string{"..", "%2e%2e", "a%2fb", strings.Repeat("s", 100), "-x", "nope"} {
		if code, _, body := e.do("GET", "/v1/sessions/"+id+"/files/ok.txt", nil); code != http.StatusNotFound {
			t.Errorf("session id %.30q = %d %s", id, code, body)
		}
	}
}

// The schema preview parses in a sandbox; unsupported and unparsable files
// get clear 415 and 422 answers. Parquet needs pyarrow, which the forky
// image has and the trixie one does not: with it, a real file is profiled
// and a broken one is a 422; without, any .parquet is a 415.
func TestSessionProfile(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	_, err := os.Stat(filepath.Join(rootfs, "usr/lib/python3/dist-packages/pyarrow"))
	pyarrow := err == nil
	e := newSessionEnv(t, rootfs, nil)
	e.createSession(SessionRequest{ID: "prof"})
	csv := "id,name,score\n1,a,2.5\n2,,3.5\n3,c,\n"
	for p, data := range map[string]string{"t.csv": csv, "bad.csv": "a\n\"open\n", "t.parquet": "PAR1junk", "t.txt": "x", "t.json": `[{"a": 1}, {"a": null}]`} {
		if code, body := e.put("prof", p, []byte(data)); code != http.StatusOK {
			t.Fatalf("PUT %s = %d %s", p, code, body)
		}
	}
	code, h, body := e.do("GET", "/v1/sessions/prof/files/t.csv?profile=1", nil)
	var prof struct {
		Rows    int `json:"rows"`
		Columns []struct {
			Name     string `json:"name"`
			Dtype    string `json:"dtype"`
			Nulls    int    `json:"nulls"`
			Distinct *int   `json:"distinct"`
			Sample   []any  `json:"sample"`
		} `json:"columns"`
		Head [][]any `json:"head"`
	}
	if code != http.StatusOK || h.Get("Content-Type") != "application/json" || json.Unmarshal(body, &prof) != nil {
		t.Fatalf("profile = %d %s", code, body)
	}
	var names, dtypes []string
	for _, c := range prof.Columns {
		names, dtypes = append(names, c.Name), append(dtypes, c.Dtype)
	}
	if prof.Rows != 3 || !slices.Equal(names, []string{"id", "name", "score"}) || !slices.Equal(dtypes, []string{"int64", "object", "float64"}) ||
		prof.Columns[1].Nulls != 1 || prof.Columns[2].Nulls != 1 || *prof.Columns[0].Distinct != 3 || len(prof.Head) != 3 {
		t.Fatalf("profile: %s", body)
	}
	if code, _, body := e.do("GET", "/v1/sessions/prof/files/t.json?profile=1", nil); code != http.StatusOK || !strings.Contains(string(body), `"rows": 2`) {
		t.Fatalf("json profile = %d %s", code, body)
	}
	parquet := struct {
		status int
		msg    string
	}{415, "pyarrow"}
	if pyarrow {
		parquet.status, parquet.msg = 422, "t.parquet could not be parsed: ArrowInvalid"
		r := e.sessionExec("prof", SessionExecutionRequest{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2, None]}).to_parquet('r.parquet')"})
		if r.Status != "succeeded" {
			t.Fatalf("to_parquet: %s %s", r.Status, r.Stderr)
		}
		if code, _, body := e.do("GET", "/v1/sessions/prof/files/r.parquet?profile=1", nil); code != http.StatusOK || !strings.Contains(string(body), `"rows": 3`) {
			t.Fatalf("parquet profile = %d %s", code, body)
		}
	}
	for p, want := range map[string]struct {
		status int
		msg    string
	}{
		"bad.csv":   {422, "ParserError"},
		"t.parquet": parquet,
		"t.txt":     {415, ".csv, .xlsx, .json and .parquet"},
		"none.csv":  {404, "no such file"},
	} {
		code, _, body := e.do("GET", "/v1/sessions/prof/files/"+p+"?profile=1", nil)
		wantError(t, code, body, want.status, want.msg)
	}
}

// startUpload sends a PUT's headers and first bytes on a raw connection.
func startUpload(t *testing.T, e *testEnv, path string, contentLength int, first string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", e.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	auth := ""
	if e.token != "" {
		auth = "Authorization: Bearer " + e.token + "\r\n"
	}
	fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %d\r\n\r\n%s", path, auth, contentLength, first)
	return c
}

// SECURITY.md case 44: an upload is streamed to disk within bounds. One
// larger than the quota is refused from its Content-Length, unread; one
// that trickles is cut (408) once it falls behind the pace; one whose
// client goes away is dropped; none leaves a byte in the volume, and a big
// one is not cut by read_timeout while it keeps the pace.
func TestSessionUploadsAreBounded(t *testing.T) {
	e := newSessionEnv(t, shellRootfs(t), func(c *config.Config) {
		c.SessionMaxBytes = 64 << 20
		c.ReadHeaderTimeout = config.Duration(200 * time.Millisecond)
		c.ReadTimeout = config.Duration(500 * time.Millisecond)
	})
	e.createSession(SessionRequest{ID: "up", Kernel: new(bool)})
	before := e.sessionUsage("up")

	c := startUpload(t, e, "/v1/sessions/up/files/huge.bin", 1<<40, "")
	code, body := readResponse(t, c)
	wantError(t, code, []byte(body), http.StatusRequestEntityTooLarge, "more than a session's workspace holds")

	c = startUpload(t, e, "/v1/sessions/up/files/slow.bin", 10<<20, strings.Repeat("s", 1000))
	code, body = readResponse(t, c)
	wantError(t, code, []byte(body), http.StatusRequestTimeout, "upload too slow")

	c = startUpload(t, e, "/v1/sessions/up/files/cut.bin", 10<<20, strings.Repeat("c", 100_000))
	waitFor(t, func() bool { return len(e.srv.uploads) == 1 })
	c.Close()
	waitFor(t, func() bool { return len(e.srv.uploads) == 0 })

	if after := e.sessionUsage("up"); after != before {
		t.Fatalf("refused uploads left something: %+v, then %+v", before, after)
	}
	if _, _, body := e.do("GET", "/v1/sessions/up/files", nil); !strings.Contains(string(body), `"files":[]`) {
		t.Fatalf("files left: %s", body)
	}

	// 8 MiB at a steady pace takes longer than read_timeout: not cut.
	pr := pacedBody()
	req, _ := http.NewRequest("PUT", e.http.URL+"/v1/sessions/up/files/paced.bin", pr)
	req.ContentLength = 8 << 20
	resp, err := e.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var fi FileInfo
	if resp.StatusCode != http.StatusOK || json.Unmarshal(got, &fi) != nil || fi.Size != 8<<20 {
		t.Fatalf("a paced 8 MiB upload = %d %s", resp.StatusCode, got)
	}
	// Downloads are paced the same way: the whole file, past write_timeout's
	// start.
	code, _, data := e.do("GET", "/v1/sessions/up/files/paced.bin", nil)
	if code != http.StatusOK || len(data) != 8<<20 {
		t.Fatalf("GET = %d, %d bytes", code, len(data))
	}
}

// With the pool on, a session's kernel is a warm sandbox of its policy
// (the kernel starter's spec matches the policy's template): the data
// stack is imported already, no sandbox is started cold, and the pool
// counts it taken. The metrics show the session.
func TestSessionKernelFromTheWarmPool(t *testing.T) {
	for _, forks := range []bool{false, true} {
		t.Run(map[bool]string{false: "import", true: "forks"}[forks], func(t *testing.T) {
			testSessionKernelFromTheWarmPool(t, forks)
		})
	}
}

func testSessionKernelFromTheWarmPool(t *testing.T, forks bool) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), func(c *config.Config) {
		c.PoolSize = 1
		c.PoolPreload = []string{"pandas"}
		c.PoolTemplateForks = forks
	})
	deadline := time.Now().Add(2 * time.Minute)
	for e.srv.PoolStats().Ready < 2 { // one per policy
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", e.srv.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.createSession(SessionRequest{ID: "warm", Type: TypeSkill})
	r := e.sessionExec("warm", SessionExecutionRequest{Code: "import sys\nprint('pandas' in sys.modules)\nopen('w.txt', 'w').write('w')"})
	wantExecStatus(t, r, "succeeded")
	wantState(t, r, session.StateNew, session.ReasonFirst, 1)
	if r.Stdout != "True\n" || r.Policy.MemoryMB != e.cfg.SkillMemoryMB {
		t.Fatalf("a warm kernel: %q %q %+v", r.Stdout, r.Stderr, r.Policy)
	}
	if st := e.srv.PoolStats(); st.Taken != 1 || e.sandbox.started.Load() != 0 {
		t.Fatalf("pool %+v, %d cold sandboxes", st, e.sandbox.started.Load())
	}
	if code, _, body := e.do("GET", "/v1/sessions/warm/files/w.txt", nil); code != http.StatusOK || string(body) != "w" {
		t.Fatalf("the warm kernel's workspace is not the session's: %d %q", code, body)
	}
	_, _, metrics := e.do("GET", "/metrics", nil)
	for _, want := range []string{"sandboxd_sessions 1", "sandboxd_sessions_busy 0", "sandboxd_session_idle_kernels 1",
		`sandboxd_session_kernel_starts_total{reason="new/first_execution"} 1`, "sandboxd_session_quota_refusals_total 0"} {
		if !strings.Contains(string(metrics), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// With session_spare_kernels, a kernel of the default type waits in a
// spare volume (SECURITY.md case 62): the next default-type session
// adopts it (its 201 says idle, started before the session), its first
// execution says new/first_execution and runs there with the data stack
// imported, and the refill starts the next one. A skill session never
// takes it. The gauge says ready or missing.
func TestSessionSpareKernel(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), func(c *config.Config) {
		c.PoolSize = 1
		c.PoolPreload = []string{"pandas"}
		c.SessionSpareKernels = 1
	})
	spareReady := func() {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			_, _, m := e.do("GET", "/metrics", nil)
			if strings.Contains(string(m), `sandboxd_session_spare_kernels{state="ready"} 1`+"\n") &&
				strings.Contains(string(m), `sandboxd_session_spare_kernels{state="missing"} 0`+"\n") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no spare kernel ready: pool %+v, sessions %+v", e.srv.PoolStats(), e.srv.SessionStats())
			}
		}
	}
	spareReady()
	v := e.createSession(SessionRequest{ID: "spare"})
	if v.Kernel.State != session.KernelIdle || v.Kernel.StartedAt == nil || !v.Kernel.StartedAt.Before(v.CreatedAt) {
		t.Fatalf("201 with a spare kernel ready: kernel %+v, created at %s", v.Kernel, v.CreatedAt)
	}
	r := e.sessionExec("spare", SessionExecutionRequest{Code: "import sys\nprint('pandas' in sys.modules)"})
	wantExecStatus(t, r, "succeeded")
	wantState(t, r, session.StateNew, session.ReasonFirst, 1)
	if r.Stdout != "True\n" || e.sandbox.started.Load() != 0 {
		t.Fatalf("a spare kernel: %q %q, %d cold sandboxes", r.Stdout, r.Stderr, e.sandbox.started.Load())
	}
	spareReady()
	sk := e.createSession(SessionRequest{ID: "skill", Type: TypeSkill})
	if sk.Kernel.StartedAt != nil && sk.Kernel.StartedAt.Before(sk.CreatedAt) {
		t.Fatalf("a skill session adopted the default type's spare kernel: %+v", sk.Kernel)
	}
	r = e.sessionExec("skill", SessionExecutionRequest{Code: "print(1)"})
	wantState(t, r, session.StateNew, session.ReasonFirst, 1)
	spareReady()
	for _, id := range []string{"spare", "skill"} {
		if code, _, body := e.do("DELETE", "/v1/sessions/"+id, nil); code != http.StatusNoContent {
			t.Fatalf("DELETE %s = %d %s", id, code, body)
		}
	}
}

// The drain lets a session's execution finish, then stops every kernel
// (nothing of its sandbox is left) and keeps the session's files, mounted
// for the next worker.
func TestSessionDrainStopsKernelsKeepsFiles(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	e.createSession(SessionRequest{ID: "drained"})
	done := make(chan *ExecutionResponse, 1)
	go func() {
		done <- e.sessionExec("drained", SessionExecutionRequest{Code: "import time\ntime.sleep(1)\nopen('kept.txt', 'w').write('k')"})
	}()
	waitFor(t, func() bool { return e.srv.SessionStats().Busy == 1 })
	e.srv.Drain(context.Background())
	wantExecStatus(t, <-done, "succeeded")
	if err := nsjailtest.CheckNoLeftovers(testStateRoot, testCgroupParent); err != nil {
		t.Fatalf("a kernel outlived the drain: %v", err)
	}
	dir := filepath.Join(e.cfg.SessionsDir, "drained", "volume")
	data, err := os.ReadFile(filepath.Join(dir, "mnt", "kept.txt"))
	if err != nil || string(data) != "k" || len(mountsUnder(e.cfg.SessionsDir)) != 1 {
		t.Fatalf("files after the drain: %q %v, mounts %v", data, err, mountsUnder(e.cfg.SessionsDir))
	}
	if err := volume.Remove(dir); err != nil {
		t.Fatal(err)
	}
}
