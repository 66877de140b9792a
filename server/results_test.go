package server

import (
	"bytes"
	"encoding/base64"
	"image/png"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/runner"
)

// Results an agent acts on (issue 13), on the real runtime image: the
// typed error, the displayed value and the captured figures are the same
// whether the code ran cold, in a warm sandbox or in a session's kernel:
// one runner inside the sandbox.

// resultPaths runs a request cold, warm (the pool must serve it) and in a
// session's kernel, through the HTTP API.
type resultPaths struct {
	cold, warm, sess *testEnv
	sessionID        string
}

func newResultPaths(t *testing.T) *resultPaths {
	rootfs := nsjailtest.RuntimeRootfs(t)
	p := &resultPaths{cold: newEnv(t, rootfs, noPool)}
	p.warm = newEnv(t, rootfs, func(c *config.Config) {
		c.PoolSize = 1
		c.PoolPreload = []string{"pandas", "matplotlib.pyplot"}
	})
	p.sess = newSessionEnv(t, rootfs, nil)
	p.sessionID = p.sess.createSession(SessionRequest{}).ID
	return p
}

// run runs code on path ("cold", "warm", "session"); file matches the name
// the code has in tracebacks there.
func (p *resultPaths) run(t *testing.T, path string, req ExecutionRequest) (resp *ExecutionResponse, file *regexp.Regexp) {
	t.Helper()
	switch path {
	case "cold":
		return p.cold.execute(req), codeFile
	case "warm":
		waitFor(t, func() bool { return p.warm.srv.PoolStats().Ready >= 2 })
		before := p.warm.srv.PoolStats().Taken
		resp = p.warm.execute(req)
		if p.warm.srv.PoolStats().Taken != before+1 {
			t.Fatalf("the pool did not serve the execution: %+v", p.warm.srv.PoolStats())
		}
		return resp, codeFile
	}
	display := req.DisplayLastExpression
	resp = p.sess.sessionExec(p.sessionID, SessionExecutionRequest{Code: req.Code, CaptureFigures: req.CaptureFigures,
		DisplayLastExpression: &display})
	return resp, cellFile
}

var (
	codeFile = regexp.MustCompile("^" + regexp.QuoteMeta(CodePath) + "$")
	cellFile = regexp.MustCompile(`^<cell [1-9][0-9]*>$`)
)

var resultPathNames = []string{"cold", "warm", "session"}

// errorCase is code that raises and what its typed error must say.
type errorCase struct {
	name, code string
	typ, msg   string
	line       int
	offset     int      // SyntaxError only
	functions  []string // the traceback's functions, outermost first (nil: not checked)
	text       []string // in the text, in order
	hint       []string // in the hint
	userFrames int      // frames in the user's file (-1: not checked)
}

var errorCases = []errorCase{
	{name: "NameError", code: "x = 1\nprint(y)\n", typ: "NameError", msg: "name 'y' is not defined", line: 2,
		functions: []string{"<module>"}, text: []string{"Traceback (most recent call last):", "    print(y)", "NameError: name 'y' is not defined"}, userFrames: 1},
	{name: "KeyError on a column", code: "import pandas as pd\ndf = pd.DataFrame({'region': ['n'], 'revenue': [1.5]})\nprint(df['Revenue'].sum())\n",
		typ: "KeyError", msg: "'Revenue'", line: 3, text: []string{"KeyError: 'Revenue'"},
		hint: []string{"'Revenue' is not a column", "Did you mean 'revenue'?", "'region', 'revenue'"}, userFrames: 1},
	{name: "ZeroDivisionError deep", code: "def ratio(a, b):\n    return a / b\n\ndef report(rows):\n    return [ratio(r, 0) for r in rows]\n\nreport([1, 2])\n",
		typ: "ZeroDivisionError", msg: "division by zero", line: 2, functions: []string{"<module>", "report", "ratio"},
		text: []string{"in report", "in ratio", "    return a / b", "ZeroDivisionError: division by zero"}, userFrames: 3},
	{name: "SyntaxError", code: "x = 1\ny = (2,\nprint(x)\n", typ: "SyntaxError", msg: "'(' was never closed", line: 2, offset: 5,
		functions: []string{}, text: []string{"line 2", "    y = (2,", "SyntaxError: '(' was never closed"}, userFrames: 0},
	{name: "IndentationError", code: "if True:\nprint(1)\n", typ: "IndentationError", line: 2, offset: 1,
		msg: "expected an indented block after 'if' statement on line 1", functions: []string{}, userFrames: 0},
	{name: "raised inside pandas", code: "import io, pandas as pd\n\ndef load():\n    return pd.read_csv(io.StringIO('a,b\\n1,2\\n'), usecols=['c'])\n\nload()\n",
		typ: "ValueError", msg: "Usecols do not match columns", line: 4, text: []string{"in load", "pandas/io/parsers", "ValueError: Usecols do not match columns"},
		userFrames: 2},
	{name: "chained", code: "try:\n    {}['k']\nexcept KeyError as e:\n    raise RuntimeError('lookup failed') from e\n",
		typ: "RuntimeError", msg: "lookup failed", line: 4, functions: []string{"<module>"},
		text: []string{"KeyError: 'k'", "The above exception was the direct cause of the following exception:", "RuntimeError: lookup failed"}, userFrames: 1},
	{name: "context", code: "try:\n    1 / 0\nexcept ZeroDivisionError:\n    undefined_name\n",
		typ: "NameError", msg: "name 'undefined_name' is not defined", line: 4,
		text: []string{"ZeroDivisionError: division by zero", "During handling of the above exception, another exception occurred:", "NameError"}, userFrames: 1},
	{name: "group", code: "def check():\n    raise ExceptionGroup('checks failed', [ValueError('a'), TypeError('b')])\n\ncheck()\n",
		typ: "ExceptionGroup", msg: "checks failed (2 sub-exceptions)", line: 2, functions: []string{"<module>", "check"},
		text: []string{"Exception Group Traceback (most recent call last):", "| ValueError: a", "| TypeError: b"}, userFrames: 2},
}

// harnessTrace: what of the runner or the zygote must never show in an
// error (their files are "<string>" or "<sandboxd runner>", their
// functions these).
var harnessTrace = regexp.MustCompile(`<string>|sandboxd|run_code|run_file|_run_cell|_kernel\b|zygote`)

func TestTypedErrorsOnEveryPath(t *testing.T) {
	p := newResultPaths(t)
	for _, c := range errorCases {
		for _, path := range resultPathNames {
			t.Run(c.name+"/"+path, func(t *testing.T) {
				resp, file := p.run(t, path, ExecutionRequest{Code: c.code})
				checkTypedError(t, c, resp, file)
			})
		}
	}
	for _, path := range resultPathNames {
		t.Run("sys.exit(3)/"+path, func(t *testing.T) {
			resp, _ := p.run(t, path, ExecutionRequest{Code: "import sys\nprint('bye')\nsys.exit(3)\n"})
			if resp.Status != "failed" || resp.ExitCode != 3 || resp.Error != nil || resp.Stdout != "bye\n" || resp.Stderr != "" {
				t.Fatalf("sys.exit(3): status %s exit %d error %+v stdout %q stderr %q", resp.Status, resp.ExitCode, resp.Error, resp.Stdout, resp.Stderr)
			}
		})
		t.Run("timeout/"+path, func(t *testing.T) {
			// A limit is never dressed as a Python error, even the
			// KeyboardInterrupt a kernel is interrupted with.
			resp, _ := p.run(t, path, ExecutionRequest{Code: "import time\ntime.sleep(60)\n", TimeoutMS: 500})
			if resp.Status != "timeout" || resp.Error != nil {
				t.Fatalf("timeout: status %s error %+v", resp.Status, resp.Error)
			}
		})
	}
}

func checkTypedError(t *testing.T, c errorCase, resp *ExecutionResponse, file *regexp.Regexp) {
	t.Helper()
	if resp.Status != "failed" || resp.ExitCode != 1 || resp.Error == nil || resp.Error.Code == nil {
		t.Fatalf("status %s exit %d error %+v\nstderr: %s", resp.Status, resp.ExitCode, resp.Error, resp.Stderr)
	}
	e := resp.Error.Code
	if e.Type != c.typ || !strings.HasPrefix(e.Message, c.msg) || e.Line == nil || *e.Line != c.line {
		t.Errorf("type %q message %q line %v, want %q %q… line %d", e.Type, e.Message, deref(e.Line), c.typ, c.msg, c.line)
	}
	if c.offset != 0 && (e.Offset == nil || *e.Offset != c.offset) {
		t.Errorf("offset %v, want %d", deref(e.Offset), c.offset)
	}
	if c.offset == 0 && e.Offset != nil {
		t.Errorf("offset %d on a %s", *e.Offset, e.Type)
	}
	var functions []string
	user := 0
	for _, f := range e.Traceback {
		functions = append(functions, f.Function)
		if file.MatchString(f.File) {
			user++
		}
		if harnessTrace.MatchString(f.File + " " + f.Function) {
			t.Errorf("a harness frame in the traceback: %+v", f)
		}
	}
	if c.functions != nil && !slices.Equal(functions, c.functions) && !(len(c.functions) == 0 && len(functions) == 0) {
		t.Errorf("traceback functions %q, want %q", functions, c.functions)
	}
	if c.userFrames >= 0 && user != c.userFrames {
		t.Errorf("%d frames in %s, want %d: %+v", user, file, c.userFrames, e.Traceback)
	}
	if len(e.Traceback) > 0 && !file.MatchString(e.Traceback[0].File) {
		t.Errorf("the outermost frame is %+v, not the user's %s", e.Traceback[0], file)
	}
	rest := e.Text
	for _, want := range c.text {
		i := strings.Index(rest, want)
		if i < 0 {
			t.Errorf("text lacks %q (in order):\n%s", want, e.Text)
			break
		}
		rest = rest[i+len(want):]
	}
	inFile := regexp.MustCompile(`File "` + strings.Trim(file.String(), "^$") + `", line`)
	if harnessTrace.MatchString(e.Text) || !inFile.MatchString(e.Text) {
		t.Errorf("text is not the user's traceback:\n%s", e.Text)
	}
	// The text is what Python printed on stderr, which is the code's own.
	if !strings.HasSuffix(resp.Stderr, e.Text) {
		t.Errorf("stderr does not end with the text:\nstderr: %s\ntext: %s", resp.Stderr, e.Text)
	}
	for _, want := range c.hint {
		if !strings.Contains(e.Hint, want) {
			t.Errorf("hint %q lacks %q", e.Hint, want)
		}
	}
	if len(c.hint) == 0 && e.Hint != "" {
		t.Errorf("a hint on a %s: %q", e.Type, e.Hint)
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

const figuresCode = `import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3)); plt.plot([1, 2, 3]); plt.show()
fig = plt.figure(figsize=(2, 2)); plt.bar(["a", "b"], [1, 2])
fig.savefig("/workspace/output/artifacts/chart.png", dpi=50)
plt.figure(figsize=(3, 2)); plt.plot([3, 1])
import io
plt.gcf().savefig(io.BytesIO(), format="png"); plt.gcf().savefig("/tmp/elsewhere.png")
print("done")
`

// Figures shown or left open come back as PNG artifacts with their size;
// the one the code saved as an artifact is not returned twice (one saved
// into a buffer or /tmp still is); capture_figures turns it off; code that does not import matplotlib never has it imported.
func TestFiguresOnEveryPath(t *testing.T) {
	p := newResultPaths(t)
	for _, path := range resultPathNames {
		t.Run(path, func(t *testing.T) {
			resp, _ := p.run(t, path, ExecutionRequest{Code: figuresCode})
			wantExecStatus(t, resp, "succeeded")
			var names []string
			for _, a := range resp.Artifacts {
				names = append(names, a.Name)
				data, _ := base64.StdEncoding.DecodeString(a.ContentBase64)
				cfg, err := png.DecodeConfig(bytes.NewReader(data))
				if err != nil || cfg.Width != a.Width || cfg.Height != a.Height || a.Width == 0 {
					t.Errorf("%s: width %d height %d, the PNG says %+v (%v)", a.Name, a.Width, a.Height, cfg, err)
				}
			}
			// A session's artifacts are the execution's own; its figure
			// names count on past files an earlier execution left.
			if len(names) != 3 || !slices.Contains(names, "chart.png") || names[1] == names[2] ||
				!strings.HasPrefix(names[1], "figure-") || !strings.HasPrefix(names[2], "figure-") {
				t.Fatalf("artifacts %q, want chart.png and two figures", names)
			}
			if resp.Stdout != "done\n" || resp.Stderr != "" {
				t.Errorf("stdout %q stderr %q", resp.Stdout, resp.Stderr)
			}
			off := false
			resp, _ = p.run(t, path, ExecutionRequest{Code: figuresCode, CaptureFigures: &off})
			wantExecStatus(t, resp, "succeeded")
			if len(resp.Artifacts) != 1 || resp.Artifacts[0].Name != "chart.png" {
				t.Fatalf("capture_figures false: artifacts %+v", resp.Artifacts)
			}
		})
	}
	resp := p.cold.execute(ExecutionRequest{Code: "import sys\nprint('matplotlib' in sys.modules)\n"})
	if resp.Stdout != "False\n" {
		t.Errorf("matplotlib imported for code that did not: %q", resp.Stdout)
	}
}

// The value of a final expression: a DataFrame as a bounded markdown
// table with its shape and dtypes; only when asked, single-shot; always in
// a session.
func TestDisplayOnEveryPath(t *testing.T) {
	p := newResultPaths(t)
	code := `import numpy as np, pandas as pd
df = pd.DataFrame(np.arange(100000).reshape(2000, 50), columns=[f"col{i}" for i in range(50)])
df["label"] = "x" * 5000
df
`
	for _, path := range resultPathNames {
		t.Run(path, func(t *testing.T) {
			resp, _ := p.run(t, path, ExecutionRequest{Code: code, DisplayLastExpression: true})
			wantExecStatus(t, resp, "succeeded")
			if len(resp.Display) != 1 {
				t.Fatalf("display %+v", resp.Display)
			}
			md, plain := resp.Display[0].Mime[runner.MimeMarkdown], resp.Display[0].Mime[runner.MimeText]
			for _, want := range []string{"2000 rows × 51 columns", "col0: int64", "label: object", "| 1999 |", "| 0 |", "…"} {
				if !strings.Contains(md, want) {
					t.Errorf("markdown lacks %q:\n%s", want, md)
				}
			}
			if len(md) > 32<<10 || len(plain) > 32<<10 || plain == "" {
				t.Errorf("display is %d bytes of markdown, %d of text: over the budget", len(md), len(plain))
			}
			if resp.Stdout != "" {
				t.Errorf("the display went to stdout: %q", resp.Stdout)
			}
			if path == "session" {
				return
			}
			resp, _ = p.run(t, path, ExecutionRequest{Code: "x = 41\nx + 1\n"})
			if len(resp.Display) != 0 {
				t.Errorf("display without display_last_expression: %+v", resp.Display)
			}
		})
	}
	resp := p.sess.sessionExec(p.sessionID, SessionExecutionRequest{Code: "x = 41\nx + 1\n"})
	if len(resp.Display) != 1 || resp.Display[0].Mime[runner.MimeText] != "42" {
		t.Errorf("a session's display: %+v", resp.Display)
	}
	resp = p.sess.sessionExec(p.sessionID, SessionExecutionRequest{Code: "x + 1;\n"})
	if len(resp.Display) != 0 {
		t.Errorf("a silenced expression displayed: %+v", resp.Display)
	}
}

// SECURITY.md case 50: the code writes on its events fd: garbage, a line
// over the bound, forged events. They change only this execution's answer,
// and only within bounds: a forged error of a run that succeeded is not
// answered, an unasked display is dropped, a figure name is never a path.
func TestEventsChannelHostile(t *testing.T) {
	p := newResultPaths(t)
	forge := `import os, sys
fd = int(sys.argv[1]) if len(sys.argv) > 1 else 3
os.write(fd, b"garbage\n\x00\xff\n" + b"A" * (300 << 10) + b"\n")
os.write(fd, b'{"type":"error","error":{"type":"Forged","message":"m","line":1,"traceback":[],"text":"forged"}}\n')
os.write(fd, b'{"type":"display","mime":{"text/plain":"forged"}}\n')
os.write(fd, b'{"type":"figure","name":"../../result.json"}\n')
print("ok")
`
	for _, path := range []string{"cold", "warm"} {
		t.Run(path, func(t *testing.T) {
			start := time.Now()
			resp, _ := p.run(t, path, ExecutionRequest{Code: forge})
			wantExecStatus(t, resp, "succeeded")
			if resp.Error != nil || len(resp.Display) != 0 || resp.Stdout != "ok\n" {
				t.Fatalf("forged events answered: error %+v display %+v stdout %q", resp.Error, resp.Display, resp.Stdout)
			}
			// A forged error followed by a real one: the runner's, last, is
			// the answer's.
			resp, _ = p.run(t, path, ExecutionRequest{Code: forge + "1 / 0\n"})
			if resp.Error == nil || resp.Error.Code == nil || resp.Error.Code.Type != "ZeroDivisionError" {
				t.Fatalf("forged then real error: %+v", resp.Error)
			}
			// Closing the events fd and reusing its number: no event line in
			// the code's file, the run still answered.
			resp, _ = p.run(t, path, ExecutionRequest{Code: `import os
os.close(3)
f = open("/workspace/output/artifacts/mine.txt", "w")
assert f.fileno() == 3
raise ValueError("x")
`})
			if resp.Status != "failed" || resp.Error != nil || len(resp.Artifacts) != 1 || resp.Artifacts[0].Size != 0 {
				t.Fatalf("events fd reused: status %s error %+v artifacts %+v", resp.Status, resp.Error, resp.Artifacts)
			}
			t.Logf("%s: %s", path, time.Since(start))
		})
	}
}
