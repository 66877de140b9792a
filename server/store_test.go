package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/results"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// A POST retried with the same request (its first try timed out, say) gets
// the same execution, waiting for it while it runs: the code runs once. The
// request is compared canonically, so a retry serialised otherwise matches;
// another request with the id gets 409.
func TestRetryGetsTheSameExecution(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	first := e.post(ExecutionRequest{ID: "retry-1", Code: "sleep 1; echo ran", Env: map[string]string{"TZ": "UTC", "LANG": "C"}})
	e.waitStatus("retry-1", StatusRunning)
	retry := `{"env": {"LANG": "C", "TZ": "UTC"},
		"code": "sleep 1; echo ran", "id": "retry-1"}`
	code, _, body := e.do("POST", "/v1/executions", retry)
	var again ExecutionResponse
	if code != 200 || json.Unmarshal(body, &again) != nil {
		t.Fatalf("retry while running = %d %s", code, body)
	}
	orig := <-first
	wantExecStatus(t, orig, "succeeded")
	if again.Stdout != "ran\n" || !again.StartedAt.Equal(orig.StartedAt) || !again.FinishedAt.Equal(orig.FinishedAt) {
		t.Fatalf("the retry got another execution: %+v\nfirst: %+v", again, orig)
	}
	// Once finished, a retry gets the stored answer, byte for byte as GET.
	_, _, got := e.do("GET", "/v1/executions/retry-1", nil)
	if code, _, body := e.do("POST", "/v1/executions", retry); code != 200 || !bytes.Equal(body, got) {
		t.Fatalf("retry after the end = %d %s\nGET: %s", code, body, got)
	}
	if code, _, body := e.do("POST", "/v1/executions", ExecutionRequest{ID: "retry-1", Code: "sleep 1; echo other"}); code != http.StatusConflict {
		t.Fatalf("another request with the id = %d %s", code, body)
	}
	if n := e.sandbox.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1", n)
	}
}

// A POST with an id whose client gives up (its HTTP timeout) does not cancel
// the run: the retry gets the finished result, and the code ran once.
func TestRetryAfterClientTimeoutGetsTheResult(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	body := `{"id": "gave-up", "code": "sleep 1; echo ran"}`
	client := &http.Client{Timeout: 300 * time.Millisecond}
	if resp, err := client.Post(e.http.URL+"/v1/executions", "application/json", strings.NewReader(body)); err == nil {
		resp.Body.Close()
		t.Fatalf("the first POST did not time out: %s", resp.Status)
	}
	code, _, got := e.do("POST", "/v1/executions", body)
	var resp ExecutionResponse
	if code != 200 || json.Unmarshal(got, &resp) != nil || resp.Status != "succeeded" || resp.Stdout != "ran\n" {
		t.Fatalf("retry = %d %s", code, got)
	}
	if n := e.sandbox.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1", n)
	}
}

// A finished result survives the worker's restart: a new server on the same
// results_dir answers GET with the same bytes.
func TestResultSurvivesRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	useDir := func(c *config.Config) { c.ResultsDir = dir }
	e := newEnv(t, shellRootfs(t), useDir)
	wantExecStatus(t, e.execute(ExecutionRequest{ID: "kept", Code: "echo kept; head -c 100000 /dev/urandom > /workspace/output/artifacts/r.bin"}), "succeeded")
	_, _, before := e.do("GET", "/v1/executions/kept", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.srv.Drain(ctx)
	e.http.Close()
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}

	e2 := newEnv(t, shellRootfs(t), useDir)
	code, h, after := e2.do("GET", "/v1/executions/kept", nil)
	if code != 200 || !bytes.Equal(before, after) || h.Get("Content-Length") != strconv.Itoa(len(after)) {
		t.Fatalf("after restart: %d (Content-Length %s), %d bytes, before %d", code, h.Get("Content-Length"), len(after), len(before))
	}
	var resp ExecutionResponse
	if err := json.Unmarshal(after, &resp); err != nil {
		t.Fatal(err)
	}
	data, err := base64.StdEncoding.DecodeString(resp.Artifacts[0].ContentBase64)
	sum := sha256.Sum256(data)
	if err != nil || len(data) != 100000 || resp.Artifacts[0].Size != 100000 || resp.Artifacts[0].SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("artifact after restart: %v, %d bytes, %+v", err, len(data), resp.Artifacts[0].Name)
	}
}

// SECURITY.md case 31: results are bounded by bytes on disk
// (results_max_bytes), the oldest evicted first.
func TestResultsBoundedByBytes(t *testing.T) {
	const budget = 1536 << 10
	e := newEnv(t, shellRootfs(t), func(c *config.Config) {
		c.MaxArtifactBytes, c.MaxArtifactsBytes = 256<<10, 256<<10
		c.MaxStdoutBytes, c.MaxStderrBytes, c.MaxResultBytes = 4<<10, 4<<10, 4<<10
		c.ResultsMaxBytes = budget
	})
	for i := range 8 {
		wantExecStatus(t, e.execute(ExecutionRequest{ID: fmt.Sprintf("b%d", i),
			Code: "head -c 250000 /dev/urandom > /workspace/output/artifacts/r.bin"}), "succeeded")
	}
	for i, want := range []int{404, 404, 200, 200, 200, 200, 200, 200} {
		if code, _, body := e.do("GET", fmt.Sprintf("/v1/executions/b%d", i), nil); code != want {
			t.Errorf("GET b%d = %d, want %d (%.100s)", i, code, want, body)
		}
	}
	count, bytes := e.srv.results.Stats()
	if count != 6 || bytes > budget || bytes < 6*250000 {
		t.Errorf("store holds %d results, %d bytes (budget %d)", count, bytes, budget)
	}
	if runs := runDirs(t, e.cfg.ResultsDir); len(runs) != count {
		t.Errorf("%d run directories for %d results", len(runs), count)
	}
	_, _, m := e.do("GET", "/metrics", nil)
	gauge := regexp.MustCompile(`(?m)^sandboxd_results_bytes (\S+)$`).FindSubmatch(m)
	if !strings.Contains(string(m), "sandboxd_results_stored 6\n") || gauge == nil || string(gauge[1]) != strconv.FormatFloat(float64(bytes), 'g', -1, 64) {
		t.Errorf("/metrics lacks the store's size (%d bytes): %q", bytes, gauge)
	}
}

func runDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, en := range entries {
		if results.ValidRun(en.Name()) {
			out = append(out, en.Name())
		}
	}
	return out
}

// An expired result's files are removed by the janitor, with no request;
// its id is then free for a new execution.
func TestResultsExpireWithoutRequests(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) { c.ResultsTTLMS = 300 })
	wantExecStatus(t, e.execute(ExecutionRequest{ID: "short", Code: "echo a > /workspace/output/artifacts/a"}), "succeeded")
	waitFor(t, func() bool { return len(runDirs(t, e.cfg.ResultsDir)) == 0 })
	if code, _, _ := e.do("GET", "/v1/executions/short", nil); code != 404 {
		t.Fatalf("GET after the TTL = %d", code)
	}
	wantExecStatus(t, e.execute(ExecutionRequest{ID: "short", Code: "echo b"}), "succeeded")
}

// The sandbox and the workspace are named by the worker, never by the
// client's id: reusing an id right after its result expired cannot meet the
// previous run's sandbox while it is still being removed.
func TestRunNameIsNotTheClientID(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) { c.ResultsTTLMS = 1 })
	runName := regexp.MustCompile(`^run-[0-9a-f]{20}$`)
	seen := map[string]bool{}
	for i := range 5 {
		// Each result expires at once: the id is free for the next.
		waitFor(t, func() bool { code, _, _ := e.do("GET", "/v1/executions/reused", nil); return code == 404 })
		wantExecStatus(t, e.execute(ExecutionRequest{ID: "reused", Code: fmt.Sprintf("echo %d", i)}), "succeeded")
		spec := e.sandbox.lastSpec()
		ws := filepath.Base(spec.Workspace)
		if !runName.MatchString(spec.ID) || seen[spec.ID] || !strings.HasPrefix(ws, workspace.ColdPrefix+spec.ID+"-") {
			t.Fatalf("run %d: sandbox %q, workspace %q", i, spec.ID, ws)
		}
		seen[spec.ID] = true
	}
}
