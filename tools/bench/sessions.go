package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The sessions section (issue 12): what a conversation costs on a session
// against the same work done as single-shot executions, on one started
// server with the warm pool on.

// SessionsResult is the sessions section of the report.
type SessionsResult struct {
	PoolSize int `json:"pool_size"`
	// CreateFirst is POST /v1/sessions then the first print(1) in it, the
	// pool full before each (a kernel that finds a ready warm sandbox).
	CreateFirst Summary `json:"create_first_print"`
	// LiveExec is print(1) in a session whose kernel is alive.
	LiveExec Summary     `json:"live_exec_print"`
	TenStep  *TenStep    `json:"ten_step,omitempty"`
	Memory   *SessionMem `json:"idle_memory,omitempty"`
	// IdleKernels is the memory of idle sessions whose kernel ran one cell
	// and holds no data (issue 17's M2).
	IdleKernels *IdleKernels `json:"idle_kernels_before_data,omitempty"`
	Errors      []string     `json:"errors,omitempty"`
}

// TenStep is a ten-step analysis of one CSV: load it, nine groupbys, a
// chart, in one session (uploaded once, loaded once) and as ten
// single-shot executions (each sends the file and loads it again).
type TenStep struct {
	CSVBytes       int64     `json:"csv_bytes"`
	SessionMS      float64   `json:"session_ms"` // upload + ten executions
	SessionUpload  float64   `json:"session_upload_ms"`
	SessionSteps   []float64 `json:"session_steps_ms"`
	SingleShotMS   float64   `json:"single_shot_ms"`
	SingleShotStep []float64 `json:"single_shot_steps_ms"`
	// Ratio is single-shot time over session time (> 1: the session wins).
	Ratio float64 `json:"ratio"`
}

// SessionMem is the memory of idle sessions whose kernel imported pandas
// and loaded the CSV into a DataFrame.
type SessionMem struct {
	Sessions        int     `json:"sessions"`
	CSVBytes        int64   `json:"csv_bytes"`
	MedianPSSMiB    float64 `json:"median_pss_mib"`
	MedianCgroupMiB float64 `json:"median_cgroup_mib"`
	// ServerMeanMiB is the worker's own view: its idle kernels' memory
	// (sandboxd_session_idle_kernel_memory_bytes, their cgroups' charge)
	// over their number (sandboxd_session_idle_kernels).
	ServerMeanMiB float64 `json:"server_mean_mib"`
	HostMemGiB    float64 `json:"host_mem_gib"`
	// Fit is how many such sessions the host's memory holds at the median
	// cgroup charge (what the kernel's memory limit counts).
	Fit int `json:"fit"`
}

// tenStepCode are the session's ten steps; the single-shot variant
// prefixes each with the load (tenStepLoad).
var tenStepCode = []string{
	"import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(len(df))\n",
	"print(df.groupby('region')['amount'].sum().round(2).shape[0])\n",
	"print(df.groupby('product')['amount'].mean().shape[0])\n",
	"print(df.groupby(['region', 'product']).size().shape[0])\n",
	"print(df.groupby('day')['qty'].sum().shape[0])\n",
	"print(df.groupby('region')['qty'].describe().shape[0])\n",
	"print(df.groupby('product')['amount'].quantile(0.9).shape[0])\n",
	"print(df.groupby('customer')['amount'].sum().nlargest(10).shape[0])\n",
	"print(df.groupby(['day', 'region'])['amount'].max().shape[0])\n",
	`import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import os
os.makedirs('output/artifacts', exist_ok=True)
g = df.groupby('day')['amount'].sum()
fig, ax = plt.subplots(figsize=(6, 3), dpi=80)
ax.plot(g.index, g.values)
fig.savefig('output/artifacts/daily.png')
plt.close(fig)
print(len(g))
`,
}

// tenStepLoad loads the file a single-shot execution got in files[].
const tenStepLoad = "import pandas as pd\ndf = pd.read_csv('input/data.csv')\n"

// makeCSV is a deterministic sales table of about size bytes.
func makeCSV(size int) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	regions := []string{"north", "south", "east", "west", "centre"}
	var b bytes.Buffer
	b.Grow(size + 256)
	b.WriteString("day,region,product,customer,qty,amount\n")
	for b.Len() < size {
		fmt.Fprintf(&b, "2026-%02d-%02d,%s,p%03d,c%05d,%d,%.2f\n", 1+rng.IntN(12), 1+rng.IntN(28),
			regions[rng.IntN(len(regions))], rng.IntN(200), rng.IntN(20000), 1+rng.IntN(50), rng.Float64()*1000)
	}
	return b.Bytes()
}

// sessionClient adds the session calls to apiClient.
type sessionClient struct{ *apiClient }

func (c sessionClient) do(ctx context.Context, method, path, ctype string, body io.Reader) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return 0, nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

func (c sessionClient) doJSON(ctx context.Context, method, path string, in any, out any) error {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	status, data, err := c.do(ctx, method, path, "application/json", body)
	if err != nil {
		return err
	}
	if status/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, status, firstLine(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

type sessionExec struct {
	executionResponse
	Session struct {
		State  string `json:"state"`
		Reason string `json:"reason"`
	} `json:"session"`
}

// exec runs code in session id and checks it succeeded with stdout want
// ("" : any).
func (c sessionClient) exec(ctx context.Context, id, code, want string) (sessionExec, error) {
	var r sessionExec
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+id+"/executions", map[string]any{"code": code}, &r); err != nil {
		return r, err
	}
	if r.Status != "succeeded" || (want != "" && r.Stdout != want) {
		return r, fmt.Errorf("session execution: status %s, stdout %q (want %q), stderr %q, error %q", r.Status, r.Stdout, want, lastLines(r.Stderr, 3), r.Error)
	}
	return r, nil
}

func (c sessionClient) create(ctx context.Context) (string, error) {
	var s struct {
		ID string `json:"id"`
	}
	err := c.doJSON(ctx, http.MethodPost, "/v1/sessions", map[string]any{"type": "dynamic"}, &s)
	return s.ID, err
}

func (c sessionClient) remove(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/sessions/"+id, nil, nil)
}

func (c sessionClient) put(ctx context.Context, id, path string, data []byte) error {
	status, body, err := c.do(ctx, http.MethodPut, "/v1/sessions/"+id+"/files/"+path, "application/octet-stream", bytes.NewReader(data))
	if err != nil {
		return err
	}
	if status/100 != 2 {
		return fmt.Errorf("PUT %s: HTTP %d: %s", path, status, firstLine(body))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// sessionsOptions size the section.
type sessionsOptions struct {
	N        int // create+first and live-exec samples
	CSVBytes int
	MemN     int // idle sessions measured
	// LatencyOnly stops after the two latencies (no ten-step, no memory).
	LatencyOnly bool
	// IdleN sessions are measured idle before they load data (0: not).
	IdleN int
	// IdleOnly measures only that.
	IdleOnly bool
}

// runSessions measures the sessions section against srv, a server started
// with the pool on (poolSize per policy).
func runSessions(ctx context.Context, srv *serverProc, poolSize int, o sessionsOptions, logf func(string, ...any)) *SessionsResult {
	c := sessionClient{srv.client}
	res := &SessionsResult{PoolSize: poolSize}
	fail := func(format string, a ...any) {
		msg := fmt.Sprintf(format, a...)
		logf("sessions: %s", msg)
		res.Errors = append(res.Errors, msg)
	}
	// The spare kernels first: after a session adopted one, the refill
	// takes a warm sandbox for the next ~0.1 s later, and the pool then
	// refills that one.
	wait := func() {
		if err := waitSpareKernels(ctx, srv, time.Minute); err != nil {
			fail("spare kernels not refilled: %v", err)
		}
		if err := waitPool(ctx, srv, poolSize, poolSize*policyCount(ctx, srv.client), 2*time.Minute); err != nil {
			fail("pool did not refill: %v", err)
		}
	}

	if o.IdleOnly {
		if o.IdleN > 0 {
			res.IdleKernels = idleKernels(ctx, srv, c, o.IdleN, wait, fail, logf)
		}
		return res
	}

	// Create + first print(1), a full pool before each.
	var lat []time.Duration
	failures := 0
	for i := 0; i < o.N && ctx.Err() == nil; i++ {
		wait()
		t0 := time.Now()
		id, err := c.create(ctx)
		if err == nil {
			_, err = c.exec(ctx, id, "print(1)\n", "1\n")
		}
		d := time.Since(t0)
		if err != nil {
			failures++
			fail("create+first: %v", err)
		} else {
			lat = append(lat, d)
		}
		if id != "" {
			c.remove(ctx, id)
		}
	}
	res.CreateFirst = Summarize(lat, failures, 0)
	logf("sessions: create + first print(1): p50 %.2f ms p99 %.2f ms (n=%d)", res.CreateFirst.P50MS, res.CreateFirst.P99MS, res.CreateFirst.N)

	// print(1) in a live kernel.
	if id, err := c.create(ctx); err != nil {
		fail("create: %v", err)
	} else {
		if _, err := c.exec(ctx, id, "x = 1\n", ""); err != nil {
			fail("live warm-up: %v", err)
		}
		// The pool refills the sandbox this session's kernel came from
		// (a preload: ~0.5 s of CPU at the background CPU weight) after its first
		// execution: measured after it, as a conversation's later steps
		// run on a worker that is not refilling.
		wait()
		lat, failures = nil, 0
		for i := 0; i < o.N*4 && ctx.Err() == nil; i++ {
			t0 := time.Now()
			r, err := c.exec(ctx, id, "print(1)\n", "1\n")
			if err == nil && r.Session.State != "preserved" {
				err = fmt.Errorf("state %s (%s), want preserved", r.Session.State, r.Session.Reason)
			}
			if err != nil {
				failures++
				fail("live exec: %v", err)
				continue
			}
			lat = append(lat, time.Since(t0))
		}
		res.LiveExec = Summarize(lat, failures, 0)
		logf("sessions: print(1) in a live kernel: p50 %.2f ms p99 %.2f ms (n=%d)", res.LiveExec.P50MS, res.LiveExec.P99MS, res.LiveExec.N)
		c.remove(ctx, id)
	}

	if o.LatencyOnly {
		return res
	}
	if o.IdleN > 0 {
		res.IdleKernels = idleKernels(ctx, srv, c, o.IdleN, wait, fail, logf)
	}
	csv := makeCSV(o.CSVBytes)
	res.TenStep = tenStep(ctx, c, csv, wait, fail, logf)
	res.Memory = sessionMemory(ctx, srv, c, csv, o.MemN, fail, logf)
	return res
}

func tenStep(ctx context.Context, c sessionClient, csv []byte, wait func(), fail func(string, ...any), logf func(string, ...any)) *TenStep {
	ts := &TenStep{CSVBytes: int64(len(csv))}
	wait()
	t0 := time.Now()
	id, err := c.create(ctx)
	if err != nil {
		fail("ten-step: create: %v", err)
		return nil
	}
	defer c.remove(ctx, id)
	if err := c.put(ctx, id, "data.csv", csv); err != nil {
		fail("ten-step: %v", err)
		return nil
	}
	ts.SessionUpload = ms(time.Since(t0))
	for i, code := range tenStepCode {
		s0 := time.Now()
		if _, err := c.exec(ctx, id, code, ""); err != nil {
			fail("ten-step: session step %d: %v", i+1, err)
			return nil
		}
		ts.SessionSteps = append(ts.SessionSteps, ms(time.Since(s0)))
	}
	ts.SessionMS = ms(time.Since(t0))

	file := map[string]string{"path": "data.csv", "content_base64": base64.StdEncoding.EncodeToString(csv)}
	wait()
	t0 = time.Now()
	for i, code := range tenStepCode {
		if i == 0 {
			code = strings.Replace(code, "df = pd.read_csv('data.csv')\n", "", 1)
		}
		body := map[string]any{"type": "dynamic", "code": tenStepLoad + code, "files": []any{file}}
		s0 := time.Now()
		var r executionResponse
		if err := c.doJSON(ctx, http.MethodPost, "/v1/executions", body, &r); err != nil || r.Status != "succeeded" {
			fail("ten-step: single-shot step %d: %v (status %s, stderr %q)", i+1, err, r.Status, lastLines(r.Stderr, 3))
			return nil
		}
		ts.SingleShotStep = append(ts.SingleShotStep, ms(time.Since(s0)))
	}
	ts.SingleShotMS = ms(time.Since(t0))
	ts.Ratio = round3(ts.SingleShotMS / ts.SessionMS)
	logf("sessions: ten steps on a %.0f MB CSV: session %.0f ms, single-shot %.0f ms (%.2fx)", float64(len(csv))/1e6, ts.SessionMS, ts.SingleShotMS, ts.Ratio)
	return ts
}

// sessionMemory loads the CSV in n sessions, leaves them idle, and
// measures the n largest session kernels below the server: the python
// sandboxes idling frozen (idleSessionKernels; they came from the warm
// pool, so they cannot be told apart by when their sandbox started, and
// with template forks the template's cgroup, which holds every fork's,
// outweighs them all).
func sessionMemory(ctx context.Context, srv *serverProc, c sessionClient, csv []byte, n int, fail func(string, ...any), logf func(string, ...any)) *SessionMem {
	var ids []string
	defer func() {
		for _, id := range ids {
			c.remove(ctx, id)
		}
	}()
	for i := 0; i < n; i++ {
		id, err := c.create(ctx)
		if err != nil {
			fail("memory: create: %v", err)
			return nil
		}
		ids = append(ids, id)
		if err := c.put(ctx, id, "data.csv", csv); err != nil {
			fail("memory: %v", err)
			return nil
		}
		if _, err := c.exec(ctx, id, tenStepCode[0], ""); err != nil {
			fail("memory: load: %v", err)
			return nil
		}
	}
	if err := waitFrozenKernels(ctx, srv, n, 30*time.Second); err != nil {
		fail("memory: %v", err)
	}
	time.Sleep(2 * time.Second) // let the kernels settle (freed arenas, the pool's refills)
	kernels := idleSessionKernels(sandboxesBelow(srv.pid()))
	slices.SortFunc(kernels, func(a, b sandboxMemory) int { return cmp.Compare(b.CgroupBytes, a.CgroupBytes) })
	kernels = kernels[:min(n, len(kernels))]
	var pss, cg []float64
	for _, s := range kernels {
		pss = append(pss, float64(s.TotalPSS()))
		cg = append(cg, float64(s.CgroupBytes))
	}
	m := &SessionMem{Sessions: len(cg), CSVBytes: int64(len(csv)), MedianPSSMiB: medianMiB(pss), MedianCgroupMiB: medianMiB(cg)}
	if _, text, err := srv.client.getText(ctx, "/metrics"); err == nil {
		bytes, kernels := metricValue(text, "sandboxd_session_idle_kernel_memory_bytes"), metricValue(text, "sandboxd_session_idle_kernels")
		if kernels > 0 {
			m.ServerMeanMiB = round3(bytes / kernels / (1 << 20))
		}
	}
	// The fit counts the larger of the two views of a session's charge.
	per := max(m.MedianCgroupMiB, m.ServerMeanMiB)
	if total := hostMemBytes(); total > 0 {
		m.HostMemGiB = round3(float64(total) / (1 << 30))
		if per > 0 {
			m.Fit = int(float64(total) / (per * (1 << 20)))
		}
	}
	logf("sessions: idle session with a %.0f MB frame: PSS %.1f MiB, cgroup %.1f MiB, the worker's view %.1f MiB; %d fit in %.1f GiB",
		float64(len(csv))/1e6, m.MedianPSSMiB, m.MedianCgroupMiB, m.ServerMeanMiB, m.Fit, m.HostMemGiB)
	return m
}

// sessionsServerEnv lets the single-shot side of the ten-step comparison
// send the CSV in files[] (base64 in the JSON body) and hold it in its
// workspace.
func sessionsServerEnv(csvBytes int) []string {
	return []string{
		fmt.Sprintf("EXECUTION_MAX_INPUT_BYTES=%d", csvBytes+(8<<20)),
		fmt.Sprintf("EXECUTION_WORKSPACE_BYTES=%d", 4*csvBytes+(256<<20)),
	}
}

// runSessionsPhase starts a server with the pool on for the sessions
// section and stops it after.
func runSessionsPhase(ctx context.Context, cfg config, rep *Report, logf func(string, ...any)) error {
	if ok, why := poolSupported(cfg); !ok {
		rep.Notes = append(rep.Notes, "sessions: not run: "+why)
		return nil
	}
	csvBytes := cfg.SessCSVMB * 1_000_000
	logf("starting sandboxd serve (sessions, pool on (%d))", cfg.PoolSize)
	cgParent := fmt.Sprintf("sandboxd-bench-%d-sessions", os.Getpid())
	srv, err := startServer(ctx, serverOptions{
		Binary: cfg.Sandboxd, Image: cfg.Image, PoolSize: cfg.PoolSize,
		ExtraEnv:     append(sessionsServerEnv(csvBytes), cfg.ServerEnv...),
		LogPath:      filepath.Join(absOut(cfg), "server-sessions.log"),
		CgroupParent: cgParent,
	})
	if err != nil {
		return fmt.Errorf("sessions: %w", err)
	}
	// As the API phase does: the server leaves its (empty) parent behind.
	defer removeOwnCgroupDir(cgParent)
	defer srv.stop()
	rep.Sessions = runSessions(ctx, srv, cfg.PoolSize, sessionsOptions{
		N: cfg.SessN, CSVBytes: csvBytes, MemN: cfg.SessMemN, LatencyOnly: cfg.SessLatOnly,
		IdleN: cfg.SessIdleN, IdleOnly: cfg.SessIdleOnly,
	}, logf)
	return nil
}

// hostMemBytes is MemTotal of /proc/meminfo (0 if unreadable).
func hostMemBytes() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
			return kb << 10
		}
	}
	return 0
}

// metricValue is the value of an unlabelled metric in a Prometheus text
// exposition (0 when absent).
func metricValue(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

// waitSpareKernels waits until the server's spare session kernels are all
// ready (sandboxd_session_spare_kernels{state="missing"} 0); at once for a
// server that does not export the gauge.
func waitSpareKernels(ctx context.Context, srv *serverProc, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		_, text, err := srv.client.getText(ctx, "/metrics")
		if err != nil {
			return err
		}
		// 0 also for a series the server does not export.
		missing := metricValue(text, `sandboxd_session_spare_kernels{state="missing"}`)
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%.0f spare kernels missing after %s", missing, timeout)
		}
	}
	return ctx.Err()
}
