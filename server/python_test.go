package server

import (
	"archive/zip"
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// The Python contract on the real runtime image: these run the code the
// Agent sends, through the HTTP API, in real sandboxes.

const salesCSV = "region,product,units,price\nnorth,a,3,2.5\nsouth,a,1,2.5\nnorth,b,2,10\nsouth,b,5,10\nnorth,a,1,2.5\n"

const groupbyCode = `import json, pandas as pd
req = json.load(open("/workspace/input/request.json"))
df = pd.read_csv("/workspace/input/sales.csv")
df["revenue"] = df["units"] * df["price"]
g = df.groupby(req["by"]).agg(units=("units", "sum"), revenue=("revenue", "sum"), n=("units", "size"))
out = {k: {"units": int(r.units), "revenue": float(r.revenue), "n": int(r.n)} for k, r in g.iterrows()}
json.dump({"groups": out, "total": float(df["revenue"].sum())}, open("/workspace/output/result.json", "w"))
print(len(out), "groups")
`

func TestPythonPandasGroupby(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	resp := e.execute(ExecutionRequest{Code: groupbyCode, Input: json.RawMessage(`{"by": "region"}`),
		Files: []File{{Path: "sales.csv", ContentBase64: b64(salesCSV)}}})
	wantExecStatus(t, resp, "succeeded")
	var got struct {
		Groups map[string]struct {
			Units   int     `json:"units"`
			Revenue float64 `json:"revenue"`
			N       int     `json:"n"`
		} `json:"groups"`
		Total float64 `json:"total"`
	}
	if err := json.Unmarshal(resp.Result, &got); err != nil {
		t.Fatalf("result %s: %v", resp.Result, err)
	}
	north, south := got.Groups["north"], got.Groups["south"]
	if len(got.Groups) != 2 || north.Units != 6 || north.Revenue != 30 || north.N != 3 ||
		south.Units != 6 || south.Revenue != 52.5 || south.N != 2 || got.Total != 82.5 {
		t.Fatalf("groupby result = %s", resp.Result)
	}
	if resp.Stdout != "2 groups\n" {
		t.Errorf("stdout = %q", resp.Stdout)
	}
}

func TestPythonMatplotlibPNG(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	resp := e.execute(ExecutionRequest{Code: `import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(4, 3))
ax.bar(["a", "b", "c"], [3, 1, 2]); ax.set_title("units")
fig.savefig("/workspace/output/artifacts/chart.png", dpi=50)
`})
	wantExecStatus(t, resp, "succeeded")
	if len(resp.Artifacts) != 1 || resp.Artifacts[0].Name != "chart.png" || resp.Artifacts[0].MediaType != "image/png" {
		t.Fatalf("artifacts = %+v omitted %+v", resp.Artifacts, resp.ArtifactsOmitted)
	}
	data, _ := base64.StdEncoding.DecodeString(resp.Artifacts[0].ContentBase64)
	if !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) || int64(len(data)) != resp.Artifacts[0].Size {
		t.Fatalf("not a PNG of the stated size: % x (%d bytes, size %d)", data[:min(8, len(data))], len(data), resp.Artifacts[0].Size)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil || cfg.Width != 200 || cfg.Height != 150 {
		t.Fatalf("PNG config = %+v, %v; want 200x150", cfg, err)
	}
}

// An XLSX written with openpyxl is returned as an artifact, read back here
// (it is a valid OOXML zip holding the values), and read back by a second
// execution that gets it as an input file.
func TestPythonXLSXRoundTrip(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	resp := e.execute(ExecutionRequest{Code: `from openpyxl import Workbook
wb = Workbook(); ws = wb.active; ws.title = "Sales"
ws.append(["region", "units"]); ws.append(["north", 6]); ws.append(["south", 7])
wb.save("/workspace/output/artifacts/report.xlsx")
`})
	wantExecStatus(t, resp, "succeeded")
	if len(resp.Artifacts) != 1 || resp.Artifacts[0].MediaType != "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" {
		t.Fatalf("artifacts = %+v", resp.Artifacts)
	}
	data, _ := base64.StdEncoding.DecodeString(resp.Artifacts[0].ContentBase64)
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatalf("xlsx is not a zip: %v", err)
	}
	var sheet, shared string
	for _, f := range zr.File {
		rc, _ := f.Open()
		b, _ := io.ReadAll(rc)
		rc.Close()
		switch f.Name {
		case "xl/worksheets/sheet1.xml":
			sheet = string(b)
		case "xl/sharedStrings.xml":
			shared = string(b)
		}
	}
	if !strings.Contains(sheet, "<v>6</v>") || !strings.Contains(sheet, "<v>7</v>") || !strings.Contains(shared+sheet, "north") {
		t.Fatalf("sheet1.xml lacks the values:\n%s\n%s", sheet, shared)
	}
	back := e.execute(ExecutionRequest{Code: `import json, pandas as pd
df = pd.read_excel("/workspace/input/in/report.xlsx", sheet_name="Sales")
json.dump(dict(zip(df["region"], df["units"].astype(int).tolist())), open("/workspace/output/result.json", "w"))
`, Files: []File{{Path: "in/report.xlsx", ContentBase64: resp.Artifacts[0].ContentBase64}}})
	wantExecStatus(t, back, "succeeded")
	if string(back.Result) != `{"north":6,"south":7}` {
		t.Fatalf("read back = %s", back.Result)
	}
}

func TestPythonFailures(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), func(c *config.Config) { c.DynamicMemoryMB = 128 })
	t.Run("syntax error", func(t *testing.T) {
		resp := e.execute(ExecutionRequest{Code: "def broken(:\n    pass\n"})
		wantExecStatus(t, resp, "failed")
		if resp.ExitCode != 1 || !strings.Contains(resp.Stderr, "SyntaxError") || !strings.Contains(resp.Stderr, "main.py") {
			t.Fatalf("exit %d stderr %q", resp.ExitCode, resp.Stderr)
		}
		if string(resp.Result) != "null" || resp.ResultError == nil || !strings.Contains(*resp.ResultError, "missing") {
			t.Fatalf("result %s error %v", resp.Result, resp.ResultError)
		}
	})
	t.Run("exception", func(t *testing.T) {
		resp := e.execute(ExecutionRequest{Code: "raise ValueError('boom')"})
		wantExecStatus(t, resp, "failed")
		if !strings.Contains(resp.Stderr, "Traceback") || !strings.Contains(resp.Stderr, "ValueError: boom") {
			t.Fatalf("stderr %q", resp.Stderr)
		}
	})
	t.Run("oom", func(t *testing.T) {
		resp := e.execute(ExecutionRequest{Code: "x = bytearray(512 * 1024 * 1024)\nprint('survived')"})
		wantExecStatus(t, resp, "oom")
		if !hasLimit(resp, "memory") || strings.Contains(resp.Stdout, "survived") {
			t.Fatalf("limits %v stdout %q", resp.LimitsHit, resp.Stdout)
		}
	})
	t.Run("invalid result", func(t *testing.T) {
		resp := e.execute(ExecutionRequest{Code: "open('/workspace/output/result.json', 'w').write('{nope')"})
		wantExecStatus(t, resp, "succeeded")
		if string(resp.Result) != "null" || resp.ResultError == nil || !strings.Contains(*resp.ResultError, "not valid JSON") {
			t.Fatalf("result %s error %v", resp.Result, resp.ResultError)
		}
	})
	t.Run("legacy crash", func(t *testing.T) {
		code, _, body := e.do("POST", "/execute", LegacyRequest{Code: "import ctypes\nprint('x', flush=True)\nctypes.string_at(0)"})
		var got LegacyResponse
		if code != 200 || json.Unmarshal(body, &got) != nil ||
			got != (LegacyResponse{Output: "x\n", Error: "execution crashed with SIGSEGV", Status: LegacyCriticalError}) {
			t.Fatalf("POST /execute = %d %s", code, body)
		}
	})
	// The server is still fine after all of it.
	wantExecStatus(t, e.execute(ExecutionRequest{Code: "print(1)"}), "succeeded")
}

// The warm pool through the HTTP API: with the pool on, a script's response
// is the one the pool-off server gives, and the pool served it.
func TestPoolThroughAPI(t *testing.T) {
	for _, forks := range []bool{false, true} {
		t.Run(map[bool]string{false: "import", true: "forks"}[forks], func(t *testing.T) {
			testPoolThroughAPI(t, forks)
		})
	}
}

func testPoolThroughAPI(t *testing.T, forks bool) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	cold := newEnv(t, rootfs, noPool)
	warm := newEnv(t, rootfs, func(c *config.Config) {
		c.PoolSize = 1
		c.PoolPreload = []string{"pandas", "matplotlib.pyplot"}
		c.PoolTemplateForks = forks
	})
	deadline := time.Now().Add(2 * time.Minute)
	for warm.srv.PoolStats().Ready < 2 { // one per policy
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", warm.srv.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	st := warm.srv.PoolStats()
	t.Logf("pool ready: %d sandboxes hold %d MiB idle", st.Ready, st.IdleMemoryBytes>>20)
	req := ExecutionRequest{Code: groupbyCode + `
import matplotlib.pyplot as plt, os, socket
plt.plot([1, 2, 3]); plt.savefig("/workspace/output/artifacts/c.png", dpi=40)
os.symlink("/etc/passwd", "/workspace/output/artifacts/link")
print(sorted(os.listdir("/workspace")), sorted(os.listdir("/workspace/input")), socket.gethostname())
`, Input: json.RawMessage(`{"by": "product"}`), Files: []File{{Path: "sales.csv", ContentBase64: b64(salesCSV)}}}
	c := cold.execute(req)
	before := warm.srv.PoolStats().Taken
	w := warm.execute(req)
	if warm.srv.PoolStats().Taken != before+1 {
		t.Fatalf("the pool did not serve the execution: %+v", warm.srv.PoolStats())
	}
	wantExecStatus(t, c, "succeeded")
	if c.Status != w.Status || c.ExitCode != w.ExitCode || c.Stdout != w.Stdout || c.Stderr != w.Stderr ||
		string(c.Result) != string(w.Result) || !jsonEqual(c.Artifacts, w.Artifacts) ||
		!jsonEqual(c.ArtifactsOmitted, w.ArtifactsOmitted) || !jsonEqual(c.LimitsHit, w.LimitsHit) || c.Policy != w.Policy {
		t.Fatalf("pool on and off differ:\noff: %+v\non:  %+v", c, w)
	}
	if len(w.Artifacts) != 1 || len(w.ArtifactsOmitted) != 1 || w.ArtifactsOmitted[0].Reason != workspace.ReasonSymlink {
		t.Fatalf("artifacts %+v omitted %+v", w.Artifacts, w.ArtifactsOmitted)
	}
	// A request that sets a variable (Python reads them at start-up) runs
	// cold, same answer, counted.
	before = warm.srv.PoolStats().Taken
	coldBefore := warm.sandbox.started.Load()
	for _, env := range []map[string]string{{"LANG": "C"}, {"TZ": "UTC"}} {
		l := warm.execute(ExecutionRequest{Code: "import os; print(os.environ['LANG'], os.environ.get('TZ'))", Env: env})
		if want := fmt.Sprintf("%s %s\n", cmp.Or(env["LANG"], "C.UTF-8"), cmp.Or(env["TZ"], "None")); l.Stdout != want || warm.srv.PoolStats().Taken != before {
			t.Fatalf("env %v: %q, want %q; taken %d→%d", env, l.Stdout, want, before, warm.srv.PoolStats().Taken)
		}
	}
	// Those cold runs went through Deps.Sandbox, the wrapper every cold run
	// goes through, as the warm one did not.
	if n := warm.sandbox.started.Load() - coldBefore; n != 2 {
		t.Fatalf("Deps.Sandbox ran %d of the pool's 2 cold fallbacks", n)
	}
	// A request that cannot be written into the claimed sandbox's
	// workspace (the sandbox, which owns it, put a name in the way:
	// SECURITY.md case 73) runs cold, same answer, counted; the claim is
	// released and the pool refills.
	waitFor(t, func() bool { return warm.srv.PoolStats().Ready >= 2 })
	planted, _ := filepath.Glob(filepath.Join(warm.cfg.WorkRoot, workspace.WarmPrefix+"*"))
	for _, dir := range planted {
		if err := os.WriteFile(filepath.Join(dir, inside.CodeDir), []byte("in the way"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	coldBefore = warm.sandbox.started.Load()
	if r := warm.execute(ExecutionRequest{Code: "print(3)"}); r.Stdout != "3\n" || warm.srv.PoolStats().Taken != before ||
		warm.srv.PoolStats().FallbackWrite != 1 || warm.sandbox.started.Load() != coldBefore+1 || len(planted) != 2 {
		t.Fatalf("a warm workspace with a name in the way (%d planted): %+v, stats %+v, cold runs %d", len(planted), r,
			warm.srv.PoolStats(), warm.sandbox.started.Load()-coldBefore)
	}
	for _, dir := range planted { // the other policy's sandbox, unclaimed, can serve again
		os.Remove(filepath.Join(dir, inside.CodeDir))
	}
	// Cancel and timeout of a warm execution: killed, reported, cleaned.
	waitFor(t, func() bool { return warm.srv.PoolStats().Ready >= 2 })
	before = warm.srv.PoolStats().Taken
	done := warm.post(ExecutionRequest{ID: "warm-cancel", Code: "import time; print('up', flush=True); time.sleep(1008)"})
	// Taken counts a warm execution once it is done; Ready drops at once,
	// and the refill waits for the execution.
	waitFor(t, func() bool { return warm.srv.PoolStats().Ready == 1 })
	warm.waitStatus("warm-cancel", StatusRunning)
	// Its policy's pool is empty now: with forks, code that imports part
	// of the preload gets a fork made for it (the server's path decides
	// that from the request's code, before any workspace exists), and
	// code that imports none of it runs cold; without, both run cold.
	forksBefore, coldBefore := warm.srv.PoolStats().ExecForks, warm.sandbox.started.Load()
	if r := warm.execute(ExecutionRequest{Code: "import pandas as pd\nprint(pd.__name__)"}); r.Stdout != "pandas\n" {
		t.Fatalf("pandas with the pool empty: %+v", r)
	}
	if r := warm.execute(ExecutionRequest{Code: "print(2)"}); r.Stdout != "2\n" {
		t.Fatalf("print with the pool empty: %+v", r)
	}
	wantForks, wantCold := map[bool]uint64{false: 0, true: 1}[forks], map[bool]int64{false: 2, true: 1}[forks]
	if got, cold := warm.srv.PoolStats().ExecForks-forksBefore, warm.sandbox.started.Load()-coldBefore; got != wantForks || cold != wantCold {
		t.Fatalf("with the pool empty: %d forked on demand and %d cold, want %d and %d", got, cold, wantForks, wantCold)
	}
	time.Sleep(200 * time.Millisecond)
	if code, _, body := warm.do("DELETE", "/v1/executions/warm-cancel", nil); code != 200 {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	if r := <-done; r.Status != "cancelled" {
		t.Fatalf("warm cancel: %+v", r)
	}
	waitFor(t, func() bool { return warm.srv.PoolStats().Ready >= 2 })
	to := warm.execute(ExecutionRequest{Code: "import time; time.sleep(1009)", TimeoutMS: 300})
	wantExecStatus(t, to, "timeout")
	if warm.srv.PoolStats().Taken != before+2 {
		t.Fatalf("the pool did not serve the cancel and timeout runs: %+v", warm.srv.PoolStats())
	}
	wantNoProcess(t, "time.sleep(1008)")
	wantNoProcess(t, "time.sleep(1009)")
	_, _, body := warm.do("GET", "/metrics", nil)
	for _, want := range []string{"sandboxd_pool_size 1", "sandboxd_pool_taken_total 3", "sandboxd_pool_refill_failures_total 0",
		`sandboxd_pool_fallback_total{reason="env"} 2`, `sandboxd_pool_fallback_total{reason="dead"} 0`,
		`sandboxd_pool_fallback_total{reason="write"} 1`} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(string(body), "sandboxd_pool_idle_memory_bytes ") || strings.Contains(string(body), "sandboxd_pool_idle_memory_bytes 0\n") {
		t.Errorf("/metrics has no idle memory for the ready sandboxes")
	}
	// With forks, one template for both policies (by default their
	// environments agree, and the rest is the limits each fork's shell
	// sets: warmpool's templateKey); none without.
	templates := map[bool]string{false: "sandboxd_pool_templates 0\n", true: "sandboxd_pool_templates 1\n"}[forks]
	if !strings.Contains(string(body), templates) || strings.Contains(string(body), "sandboxd_pool_template_forks_total 0\n") == forks {
		t.Errorf("/metrics: want %q, template forks counted only with forks:\n%s", templates, body)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// The runner ends every execution with its done event (runner.Job.Done):
// the answer is the code's exit as Python's would be (exit codes, atexit
// output, a forked child that ends the script too), cold and warm. And
// SECURITY.md case 72: code that writes a done event itself ends its own
// execution there, with the exit code it wrote and the output written
// before, instead of running into its timeout: the word decides only what
// the code could decide anyway.
func TestDoneEvent(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	cold := newEnv(t, rootfs, noPool)
	warm := newEnv(t, rootfs, func(c *config.Config) {
		c.PoolSize = 1
		c.PoolTemplateForks = true
	})
	// A zygote's code process says the word as a fork's does (the same
	// runner, handed off by zygote.py instead of G).
	zygote := newEnv(t, rootfs, func(c *config.Config) {
		c.PoolSize = 1
		c.PoolTemplateForks = false
	})
	waitFor(t, func() bool { return warm.srv.PoolStats().Ready >= 2 })
	cases := []struct {
		name, code, stdout string
		exit               int
	}{
		{"exit code", "import sys\nprint('x')\nsys.exit(3)", "x\n", 3},
		{"exception", "raise ValueError('boom')", "", 1},
		{"os._exit", "import os\nprint('x', flush=True)\nos._exit(4)", "x\n", 4},
		{"atexit", "import atexit\natexit.register(lambda: print('bye'))\nprint('x')", "x\nbye\n", 0},
		{"fork falls through", "import os\npid = os.fork()\nif pid:\n    os.waitpid(pid, 0)\nprint('parent' if pid else 'child')", "child\nparent\n", 0},
		{"forged done", "import os, time\nprint('before', flush=True)\nos.write(3, b'{\"type\":\"done\",\"exit_code\":7}\\n')\ntime.sleep(60)\nprint('after')", "before\n", 7},
	}
	for _, env := range []struct {
		name string
		e    *testEnv
	}{{"cold", cold}, {"warm", warm}, {"zygote", zygote}} {
		for _, tc := range cases {
			t.Run(env.name+"/"+tc.name, func(t *testing.T) {
				pooled := env.e != cold
				if pooled {
					waitFor(t, func() bool { return env.e.srv.PoolStats().Ready >= 2 })
				}
				taken := env.e.srv.PoolStats().Taken
				r := env.e.execute(ExecutionRequest{Code: tc.code, TimeoutMS: 20000})
				if r.ExitCode != tc.exit || r.Stdout != tc.stdout {
					t.Fatalf("status %s exit %d stdout %q stderr %.300q, want exit %d stdout %q", r.Status, r.ExitCode, r.Stdout, r.Stderr, tc.exit, tc.stdout)
				}
				if pooled && env.e.srv.PoolStats().Taken != taken+1 {
					t.Fatalf("the pool did not serve it: %+v", env.e.srv.PoolStats())
				}
			})
		}
	}
}
