package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// examplesDir holds the scripted agent loop (tools/examples), from this
// package's directory.
const examplesDir = "../../tools/examples"

// agentTranscript is what tools/examples/agent_loop.py --json writes.
type agentTranscript struct {
	SessionID string `json:"session_id"`
	Steps     []struct {
		Step   int    `json:"step"`
		Status string `json:"status"`
		Error  *struct {
			Type    string  `json:"type"`
			Message string  `json:"message"`
			Line    *int    `json:"line"`
			Hint    *string `json:"hint"`
		} `json:"error"`
		Fix     string   `json:"fix"`
		Display []string `json:"display"`
	} `json:"steps"`
	Outcome string `json:"outcome"`
	Reason  string `json:"reason"`
	Chart   *struct {
		Artifact string `json:"artifact"`
		Path     string `json:"path"`
		Bytes    int    `json:"bytes"`
		Width    int    `json:"width"`
		Height   int    `json:"height"`
	} `json:"chart"`
}

// runPython runs python3 with args in dir and env added; it returns the
// combined output and the exit status (-1 when it did not run to an exit).
func runPython(t *testing.T, py, dir string, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit) && exit.Exited():
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("python3 %s: %v\n%s", strings.Join(args, " "), err, out)
		return "", -1
	}
}

// The scripted fixer's rules on the typed errors' shapes, and the chain of
// fixes on the broken analysis: no worker, no root.
func TestAgentLoopFixer(t *testing.T) {
	out, status := runPython(t, python3(t), examplesDir, nil, "-m", "unittest", "-v", "test_agent_loop")
	t.Logf("python3 -m unittest test_agent_loop:\n%s", out)
	if status != 0 {
		t.Fatalf("python3 -m unittest test_agent_loop: exit status %d", status)
	}
}

// The agent loop of tools/examples against a real `sandboxd serve` on the
// runtime image (issue 13's example): in a session it uploads a CSV, runs
// the broken analysis, and fixes it from the typed errors alone: a
// SyntaxError (its line and offset), a KeyError on a column (the hint's
// column names), a ZeroDivisionError deep in a user function (the failing
// line is the function's), a NameError (Python's suggestion); then the
// fifth run succeeds, its final expression is displayed, and the captured
// figure, figure-1.png, which the code never saved, is written as a PNG. With a step limit of two it gives up
// (exit status 1, no chart). Either way its session is deleted.
func TestAgentLoopExample(t *testing.T) {
	nsjailtest.RequireRoot(t)
	py := python3(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	dirs := t.TempDir()
	// A failed run may leave session volumes mounted; the temporary
	// directory can only be removed without them.
	t.Cleanup(func() { unmountBelow(t, dirs) })
	token := randomToken(t)
	w := startWorker(t, "agentloop", rootfs, "EXECUTION_SESSIONS_DIR="+filepath.Join(dirs, "sessions"),
		"EXECUTION_WORKER_TOKEN="+token)
	env := []string{"SANDBOXD_URL=" + w.base, "SANDBOXD_TOKEN=" + token}
	out := t.TempDir()

	t.Run("fixed", func(t *testing.T) {
		chart, js := filepath.Join(out, "chart.png"), filepath.Join(out, "fixed.json")
		text, status := runPython(t, py, examplesDir, env, "agent_loop.py", "--out", chart, "--json", js)
		t.Logf("agent_loop.py:\n%s", text)
		if status != 0 {
			t.Fatalf("agent_loop.py: exit status %d, want 0", status)
		}
		tr := readTranscript(t, js)
		if tr.Outcome != "succeeded" {
			t.Fatalf("outcome %q (%s), want succeeded", tr.Outcome, tr.Reason)
		}
		var types []string
		for i, s := range tr.Steps {
			last := i == len(tr.Steps)-1
			switch {
			case last && (s.Status != "succeeded" || s.Error != nil):
				t.Errorf("step %d: status %q, error %+v: want succeeded without an error", s.Step, s.Status, s.Error)
			case last:
			case s.Status != "failed" || s.Error == nil:
				t.Fatalf("step %d: status %q, error %+v: want failed with a typed error", s.Step, s.Status, s.Error)
			default:
				types = append(types, s.Error.Type)
				if s.Error.Line == nil || *s.Error.Line <= 0 || s.Fix == "" {
					t.Errorf("step %d: %s at line %v, fix %q: want its line and a fix", s.Step, s.Error.Type, s.Error.Line, s.Fix)
				}
			}
		}
		want := []string{"SyntaxError", "KeyError", "ZeroDivisionError", "NameError"}
		if !reflect.DeepEqual(types, want) {
			t.Fatalf("errors %v, want %v", types, want)
		}
		if h := tr.Steps[1].Error.Hint; h == nil || !strings.Contains(*h, "'region'") {
			t.Errorf("KeyError hint %v: want the DataFrame's columns, 'region' among them", h)
		}
		if !strings.Contains(tr.Steps[1].Fix, "from the error's hint") {
			t.Errorf("KeyError fix %q: want the column the hint gave", tr.Steps[1].Fix)
		}
		// The analysis ends with an expression: its value comes back as a
		// markdown table.
		if d := tr.Steps[len(tr.Steps)-1].Display; len(d) != 1 || !strings.Contains(d[0], "| West | 5750.0 |") {
			t.Errorf("display %q: want the revenue by region as a markdown table", d)
		}
		if !strings.Contains(text, "step 5: succeeded") || !strings.Contains(text, "West:   +nan %") {
			t.Errorf("transcript without the successful step or its output:\n%s", text)
		}

		c := tr.Chart
		if c == nil || c.Artifact != "figure-1.png" || c.Path != chart {
			t.Fatalf("chart %+v: want the captured figure-1.png written to %s", c, chart)
		}
		data, err := os.ReadFile(chart)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s is not a PNG: %v", chart, err)
		}
		if len(data) != c.Bytes || cfg.Width != c.Width || cfg.Height != c.Height || cfg.Width < 100 || cfg.Height < 100 {
			t.Errorf("chart %d bytes, %dx%d; the worker said %d bytes, %dx%d", len(data), cfg.Width, cfg.Height,
				c.Bytes, c.Width, c.Height)
		}
	})

	t.Run("step limit", func(t *testing.T) {
		chart, js := filepath.Join(out, "limited.png"), filepath.Join(out, "limited.json")
		text, status := runPython(t, py, examplesDir, env, "agent_loop.py", "--out", chart, "--json", js, "--max-steps", "2")
		t.Logf("agent_loop.py --max-steps 2:\n%s", text)
		if status != 1 {
			t.Fatalf("agent_loop.py --max-steps 2: exit status %d, want 1 (gave up)", status)
		}
		tr := readTranscript(t, js)
		if tr.Outcome != "gave_up" || len(tr.Steps) != 2 || tr.Chart != nil {
			t.Fatalf("outcome %q after %d steps, chart %+v: want gave_up after 2, no chart", tr.Outcome, len(tr.Steps), tr.Chart)
		}
		// The first failure was fixed; the second is not (no step is left).
		if tr.Steps[0].Fix == "" || tr.Steps[1].Fix != "" || !strings.Contains(tr.Reason, "after 2 steps") {
			t.Errorf("fixes %q, %q, reason %q: want a fix after step 1 only, and the step limit as the reason",
				tr.Steps[0].Fix, tr.Steps[1].Fix, tr.Reason)
		}
		if _, err := os.Stat(chart); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a chart was written after giving up: %v", err)
		}
	})

	if left := sessionsLeft(t, w.base, token); len(left) > 0 {
		t.Errorf("sessions left by the agent loop: %v", left)
	}
	w.stop(t)
	if left := mountsBelow(t, dirs); len(left) > 0 {
		t.Fatalf("mounts left below the sessions directory: %v", left)
	}
}

func readTranscript(t *testing.T, path string) agentTranscript {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tr agentTranscript
	if err := json.Unmarshal(data, &tr); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, data)
	}
	return tr
}

// sessionsLeft lists the worker's sessions.
func sessionsLeft(t *testing.T, base, token string) []string {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/sessions: HTTP %d, %v", resp.StatusCode, err)
	}
	var ids []string
	for _, s := range list.Sessions {
		ids = append(ids, s.ID)
	}
	return ids
}
