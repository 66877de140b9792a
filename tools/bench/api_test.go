package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeAPI answers POST /v1/executions like sandboxd serve would, with
// answer(n) choosing the response of the n-th request (from 1).
func fakeAPI(t *testing.T, answer func(n int64, req map[string]any) (int, any)) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/executions" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusNotFound)
			return
		}
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		code, body := answer(n.Add(1), req)
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func okResponse(w Workload) map[string]any {
	resp := map[string]any{"id": "x", "status": "succeeded", "exit_code": 0, "stdout": w.Stdout}
	if w.Artifact != "" {
		png := base64.StdEncoding.EncodeToString(append(append([]byte{}, pngSignature...), "rest"...))
		resp["artifacts"] = []map[string]any{{"name": w.Artifact, "size": 12, "content_base64": png}}
	}
	return resp
}

func TestExecuteChecksEverything(t *testing.T) {
	cases := []struct {
		name    string
		w       Workload
		mutate  func(map[string]any)
		code    int
		wantErr string
	}{
		{"ok print", workloadPrint, nil, 200, ""},
		{"ok pandas", workloadPandas, nil, 200, ""},
		{"failed status", workloadPrint, func(m map[string]any) { m["status"] = "failed"; m["exit_code"] = 1 }, 200, `status "failed"`},
		{"wrong stdout", workloadPrint, func(m map[string]any) { m["stdout"] = "2\n" }, 200, "stdout"},
		{"missing artifact", workloadPandas, func(m map[string]any) { delete(m, "artifacts") }, 200, "artifact groupby.png missing"},
		{"artifact not png", workloadPandas, func(m map[string]any) {
			m["artifacts"] = []map[string]any{{"name": "groupby.png", "content_base64": base64.StdEncoding.EncodeToString([]byte("GIF89a"))}}
		}, 200, "not a PNG"},
		{"http 429", workloadPrint, nil, 429, "HTTP 429"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := fakeAPI(t, func(_ int64, req map[string]any) (int, any) {
				if req["code"] != c.w.Code || req["type"] != "dynamic" {
					return 400, map[string]any{"error": "bad request body"}
				}
				resp := okResponse(c.w)
				if c.mutate != nil {
					c.mutate(resp)
				}
				return c.code, resp
			})
			err := newAPIClient(srv.URL).execute(context.Background(), c.w)
			if c.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, c.wantErr)
			}
		})
	}
}

func TestRunLoadCountsAndBounds(t *testing.T) {
	var inFlight, maxInFlight atomic.Int64
	srv := fakeAPI(t, func(n int64, _ map[string]any) (int, any) {
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := maxInFlight.Load()
			if cur <= m || maxInFlight.CompareAndSwap(m, cur) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		if n%5 == 0 {
			return 200, map[string]any{"status": "failed", "exit_code": 1}
		}
		return 200, okResponse(workloadPrint)
	})
	c := newAPIClient(srv.URL)
	r := c.runLoad(context.Background(), workloadPrint, 4, 40, time.Minute, nil)
	if len(r.Latencies)+r.Failures != 40 || r.Failures != 8 {
		t.Errorf("successes %d failures %d, want 32 and 8", len(r.Latencies), r.Failures)
	}
	if len(r.Errors) != 1 {
		t.Errorf("distinct errors %v, want 1", r.Errors)
	}
	// Never more than the concurrency; and the workers do overlap (each
	// request takes 5 ms, so even a loaded machine runs two at once).
	if m := maxInFlight.Load(); m > 4 || m < 2 {
		t.Errorf("max in flight %d, want 2..4", m)
	}
	// The time bound stops sending.
	r = c.runLoad(context.Background(), workloadPrint, 1, 1000, 30*time.Millisecond, nil)
	if !r.Truncated || len(r.Latencies)+r.Failures >= 1000 {
		t.Errorf("time bound ignored: %d sent, truncated=%v", len(r.Latencies)+r.Failures, r.Truncated)
	}
}

func TestPoolMetrics(t *testing.T) {
	text := `# HELP sandboxd_pool_sandboxes Warm sandboxes by state.
# TYPE sandboxd_pool_sandboxes gauge
sandboxd_pool_sandboxes{policy="dynamic",state="ready"} 3
sandboxd_pool_sandboxes{policy="dynamic",state="starting"} 1
sandboxd_pool_sandboxes{policy="skill",state="ready"} 4
sandboxd_pool_refill_failures_total{policy="dynamic"} 2
sandboxd_executions_total{status="succeeded"} 10
`
	st := poolMetrics(text)
	if !st.HasReady || st.Ready != 3 || st.Starting != 1 {
		t.Errorf("state %+v, want ready 3 and starting 1 (dynamic policy only)", st)
	}
	if len(st.Lines) != 4 {
		t.Errorf("pool lines %v, want the 4 pool samples", st.Lines)
	}
	if poolMetrics("sandboxd_executions_total 1\n").HasReady {
		t.Errorf("no pool metric: want HasReady false")
	}
	// sandboxd's own names: unlabelled gauges.
	st = poolMetrics("sandboxd_pool_size 4\nsandboxd_pool_ready 7\nsandboxd_pool_starting 1\nsandboxd_pool_idle_memory_bytes 5e+08\n")
	if !st.HasReady || st.Ready != 7 || st.Starting != 1 {
		t.Errorf("unlabelled gauges: got %+v", st)
	}
}

// TestDescendants checks the process-tree walk the pool-memory and
// pool-ready measurements rely on, with a real child and grandchild.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		d := descendants(cmd.Process.Pid)
		if len(d) == 1 {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", d[0]))
			switch strings.TrimSpace(string(comm)) {
			case "sleep":
			case "sh":
				// Forked but not yet exec'd: look again.
				time.Sleep(10 * time.Millisecond)
				continue
			default:
				t.Fatalf("descendant %d is %q, want sleep", d[0], comm)
			}
			if !slices.Contains(descendants(os.Getpid()), d[0]) {
				t.Fatalf("grandchild %d not below the test process", d[0])
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("descendants of sh: %v, want its one sleep", descendants(cmd.Process.Pid))
}
