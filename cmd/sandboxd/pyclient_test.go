package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// pyClientDir is the Python client (tools/clients/python), from this
// package's directory (go test runs in it).
const pyClientDir = "../../tools/clients/python"

// python3 is the interpreter the client's tests run with; the test is
// skipped without one (tools/deps/install.sh test installs Debian's).
func python3(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found (tools/deps/install.sh test installs it): the Python client is not tested")
	}
	return py
}

// runUnittest runs `python3 -m unittest -v module` in the client's
// directory with env added, logs its output, and fails the test when a
// Python test failed.
func runUnittest(t *testing.T, py, module string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v", module)
	cmd.Dir = pyClientDir
	cmd.Env = append(os.Environ(), append([]string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest %s:\n%s", module, out)
	if err != nil {
		t.Fatalf("python3 -m unittest %s: %v", module, err)
	}
}

// The client's own logic (retries, Retry-After, stream resume, error
// classes, typed results, tool schemas): no worker, no root.
func TestPythonClientUnit(t *testing.T) {
	runUnittest(t, python3(t), "test_unit")
}

// The Python client against a real `sandboxd serve` on the runtime image:
// single-shot and session runs, files up and down (streamed), refusals as
// exceptions, the token, a 429 waited out (max_concurrent=1, max_queued=0:
// the test fills the one slot), and issue 13's streaming and typed results
// when the worker has them (skipped with the reason otherwise).
func TestPythonClient(t *testing.T) {
	nsjailtest.RequireRoot(t)
	py := python3(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	dirs := t.TempDir()
	// A failed run may leave session volumes mounted; the temporary
	// directory can only be removed without them.
	t.Cleanup(func() { unmountBelow(t, dirs) })
	token := randomToken(t)
	w := startWorker(t, "pyclient", rootfs, "EXECUTION_SESSIONS_DIR="+filepath.Join(dirs, "sessions"),
		"EXECUTION_WORKER_TOKEN="+token, "EXECUTION_MAX_CONCURRENT=1", "EXECUTION_MAX_QUEUED=0")

	runUnittest(t, py, "test_sandboxd", "SANDBOXD_URL="+w.base, "SANDBOXD_TOKEN="+token)

	// Every session a Python test made was deleted by it.
	var list struct {
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	req, _ := http.NewRequest("GET", w.base+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/sessions: HTTP %d, %v", resp.StatusCode, err)
	}
	if len(list.Sessions) > 0 {
		t.Errorf("sessions left by the Python tests: %+v", list.Sessions)
	}
	w.stop(t)
	if left := mountsBelow(t, dirs); len(left) > 0 {
		t.Fatalf("mounts left below the sessions directory: %v", left)
	}
}

// mcpToolsJSON is the MCP server's tool definitions (package server/mcp
// embeds it): the Python client's function-calling schemas must be the
// same, so that a model sees the same tools however it reaches sandboxd.
const mcpToolsJSON = "../../server/mcp/tools.json"

// The Python client's tools (sandboxd.tool_definitions("mcp")) are
// server/mcp/tools.json: name, title, description and input schema, in
// order. Skipped where server/mcp has no tools.json (before the MCP server
// was merged).
func TestPythonToolSchemasMatchMCP(t *testing.T) {
	py := python3(t)
	data, err := os.ReadFile(mcpToolsJSON)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("%s does not exist: no MCP server to compare the Python client's tool schemas with", mcpToolsJSON)
	}
	if err != nil {
		t.Fatal(err)
	}
	var want any
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("%s: %v", mcpToolsJSON, err)
	}
	cmd := exec.Command(py, "-c", "import json, sandboxd; print(json.dumps(sandboxd.tool_definitions('mcp')))")
	cmd.Dir = pyClientDir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	var got any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("sandboxd.tool_definitions('mcp'): %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("tools/clients/python/sandboxd.py's _TOOLS_JSON differs from %s: copy the file into it again\npython: %s\nmcp:    %s",
			mcpToolsJSON, out, data)
	}
}

func randomToken(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
