package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// The API end to end on a real sandbox: code, input JSON and files in;
// stdout, stderr, result.json and an artifact out; GET returns the same.
func TestExecuteEndToEnd(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	resp := e.execute(ExecutionRequest{
		ID:    "e2e-1",
		Code:  "echo hi; echo oops >&2; cat /workspace/input/request.json; echo; cat /workspace/input/data/a.txt\nprintf '{\"x\": [1, 2]}' > /workspace/output/result.json\nprintf abc > /workspace/output/artifacts/t.txt\nid -u; pwd\n",
		Input: json.RawMessage(`{"q": 42}`),
		Files: []File{{Path: "data/a.txt", ContentBase64: b64("file-a\n")}},
		Env:   map[string]string{"TZ": "UTC"},
	})
	wantExecStatus(t, resp, "succeeded")
	if want := fmt.Sprintf("hi\n{\"q\":42}\nfile-a\n%d\n%s\n", inside.UID, inside.Workspace); resp.Stdout != want {
		t.Errorf("stdout = %q, want %q", resp.Stdout, want)
	}
	if resp.Stderr != "oops\n" {
		t.Errorf("stderr = %q", resp.Stderr)
	}
	if string(resp.Result) != `{"x":[1,2]}` || resp.ResultError != nil {
		t.Errorf("result = %s (error %v)", resp.Result, resp.ResultError)
	}
	sum := sha256.Sum256([]byte("abc"))
	if len(resp.Artifacts) != 1 || resp.Artifacts[0] != (Artifact{Name: "t.txt", Size: 3, MediaType: "text/plain",
		SHA256: hex.EncodeToString(sum[:]), ContentBase64: b64("abc")}) {
		t.Errorf("artifacts = %+v", resp.Artifacts)
	}
	if resp.ID != "e2e-1" || resp.Type != "dynamic" || resp.Runtime != "default" || resp.Policy != (Policy{TimeoutMS: 30000, MemoryMB: 1024, CPUs: 1, Pids: 128}) {
		t.Errorf("id/type/policy = %s %s %+v", resp.ID, resp.Type, resp.Policy)
	}
	if resp.FinishedAt.Before(resp.StartedAt) || resp.Usage.WallMS <= 0 || resp.Usage.PeakMemoryBytes <= 0 {
		t.Errorf("timings/usage = %v %v %+v", resp.StartedAt, resp.FinishedAt, resp.Usage)
	}
	code, _, body := e.do("GET", "/v1/executions/e2e-1", nil)
	var got ExecutionResponse
	if code != 200 || json.Unmarshal(body, &got) != nil || got.Stdout != resp.Stdout || got.Status != resp.Status {
		t.Errorf("GET = %d %s", code, body)
	}
	e.wantNoWorkspaces()
	if n := e.sandbox.started.Load(); n != 1 {
		t.Errorf("%d sandboxes started, want 1", n)
	}
}

// The request's env reaches the run; nothing of the worker's own env does
// (SECURITY.md case 13).
func TestExecuteEnv(t *testing.T) {
	t.Setenv("SANDBOXD_SECRET_TEST", "leak")
	e := newEnv(t, shellRootfs(t), nil)
	resp := e.execute(ExecutionRequest{Code: "env | sort", Env: map[string]string{"TZ": "Europe/Paris", "LANG": "de_DE.UTF-8"}})
	wantExecStatus(t, resp, "succeeded")
	for _, want := range []string{"TZ=Europe/Paris", "LANG=de_DE.UTF-8", "HOME=/tmp", "MPLBACKEND=Agg", "OMP_NUM_THREADS=1"} {
		if !strings.Contains(resp.Stdout, want+"\n") {
			t.Errorf("env lacks %s:\n%s", want, resp.Stdout)
		}
	}
	if strings.Contains(resp.Stdout, "SANDBOXD_SECRET_TEST") || strings.Contains(resp.Stdout, "LANG=C.UTF-8") {
		t.Errorf("unexpected env:\n%s", resp.Stdout)
	}
}

func TestPoliciesAndProbes(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	code, _, body := e.do("GET", "/v1/policies", nil)
	var pr policiesResponse
	if code != 200 || json.Unmarshal(body, &pr) != nil || pr.Default != "dynamic" ||
		pr.Policies["skill"] != (policyView{Policy: Policy{TimeoutMS: 120000, MemoryMB: 2048, CPUs: 1, Pids: 128}, Runtime: "default"}) {
		t.Fatalf("policies = %d %s", code, body)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, _, body := e.do("GET", p, nil); code != 200 {
			t.Errorf("%s = %d %s", p, code, body)
		}
	}
	// A server whose rootfs is not ready refuses executions with 503.
	srv, err := New(Deps{Config: e.otherConfig(), Sandbox: e.sandbox, Logger: quietLog,
		ResolveRootfs: e.srv.resolve})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rec := newRecorder(srv, "GET", "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("readyz before Prepare = %d", rec.Code)
	}
	rec = newRecorder(srv, "POST", "/v1/executions", `{"code":"echo"}`)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("execution before Prepare = %d %s", rec.Code, rec.Body)
	}
	if n := e.sandbox.started.Load(); n != 0 {
		t.Errorf("%d sandboxes started", n)
	}
}

func TestMetricsCountExecutions(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	wantExecStatus(t, e.execute(ExecutionRequest{Code: "true"}), "succeeded")
	wantExecStatus(t, e.execute(ExecutionRequest{Code: "exit 3", Type: "skill"}), "failed")
	e.do("POST", "/v1/executions", "{bad")
	_, _, body := e.do("GET", "/metrics", nil)
	for _, want := range []string{
		`sandboxd_executions_total{status="succeeded",type="dynamic"} 1`,
		`sandboxd_executions_total{status="failed",type="skill"} 1`,
		`sandboxd_requests_rejected_total{reason="bad_request"} 1`,
		`sandboxd_execution_duration_seconds_count{type="dynamic"} 1`,
		"sandboxd_executions_in_flight 0", "sandboxd_executions_queued 0",
		"sandboxd_pool_size 0", "sandboxd_pool_ready 0", "sandboxd_pool_taken_total 0",
		"sandboxd_pool_refill_failures_total 0", "sandboxd_pool_idle_memory_bytes 0",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func hasLimit(r *ExecutionResponse, l string) bool { return slices.Contains(r.LimitsHit, l) }

// A rootfs the sandbox's unprivileged root cannot reach is refused at
// Prepare, with the reason on /readyz, rather than failing every start.
func TestPrepareRefusesUnreachableRootfs(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	hidden := filepath.Join(t.TempDir(), "rootfs") // t.TempDir is 0700
	if err := os.Mkdir(hidden, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Deps{Config: e.otherConfig(), Sandbox: e.sandbox, Logger: quietLog,
		ResolveRootfs: dirRootfs(hidden)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "needs o+x on every parent") {
		t.Fatalf("Prepare = %v", err)
	}
	rec := newRecorder(srv, "GET", "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "cannot reach the rootfs") {
		t.Fatalf("readyz = %d %s", rec.Code, rec.Body)
	}
}
