package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// apiClient sends executions to one sandboxd serve.
type apiClient struct {
	base string // http://127.0.0.1:PORT
	http *http.Client
}

func newAPIClient(base string) *apiClient {
	tr := &http.Transport{
		// Loopback, keep-alive, one idle connection per worker: the bench
		// measures sandboxd, not TCP handshakes.
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &apiClient{base: strings.TrimRight(base, "/"), http: &http.Client{Transport: tr, Timeout: 5 * time.Minute}}
}

// executionResponse holds the fields of the API's response the bench checks.
type executionResponse struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Error     string `json:"error"`
	Artifacts []struct {
		Name          string `json:"name"`
		Size          int64  `json:"size"`
		ContentBase64 string `json:"content_base64"`
	} `json:"artifacts"`
	DurationMS int64 `json:"duration_ms"`
}

var pngSignature = []byte("\x89PNG\r\n\x1a\n")

// execute runs w once through POST /v1/executions and checks the answer in
// full: HTTP 200, status succeeded, the exact stdout, and the PNG artifact.
// A response that is not final yet (queued/running) is polled until it is.
func (c *apiClient) execute(ctx context.Context, w Workload) error {
	_, err := c.executeTimed(ctx, w)
	return err
}

// executeTimed is execute that also returns the server's own duration_ms
// for the execution (its view, without HTTP and queueing on the client).
func (c *apiClient) executeTimed(ctx context.Context, w Workload) (time.Duration, error) {
	body, _ := json.Marshal(map[string]any{"code": w.Code, "type": "dynamic"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/executions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted {
		return 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, firstLine(data))
	}
	var r executionResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return 0, fmt.Errorf("decode response: %w", err)
	}
	for r.Status == "queued" || r.Status == "running" {
		if r.ID == "" {
			return 0, fmt.Errorf("status %s without an id to poll", r.Status)
		}
		time.Sleep(2 * time.Millisecond)
		if r, err = c.get(ctx, r.ID); err != nil {
			return 0, err
		}
	}
	return time.Duration(r.DurationMS) * time.Millisecond, checkResponse(w, r)
}

func (c *apiClient) get(ctx context.Context, id string) (executionResponse, error) {
	var r executionResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/executions/"+id, nil)
	if err != nil {
		return r, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return r, fmt.Errorf("GET %s: HTTP %d: %s", id, resp.StatusCode, firstLine(data))
	}
	return r, json.NewDecoder(resp.Body).Decode(&r)
}

// checkResponse is the zero-failure check: anything but the exact expected
// outcome is a failure, with a message that says what differed.
func checkResponse(w Workload, r executionResponse) error {
	if r.Status != "succeeded" || r.ExitCode != 0 {
		return fmt.Errorf("status %q exit %d error %q stderr %q", r.Status, r.ExitCode, r.Error, tail(r.Stderr, 300))
	}
	if r.Stdout != w.Stdout {
		return fmt.Errorf("stdout %q, want %q", tail(r.Stdout, 100), w.Stdout)
	}
	if w.Artifact == "" {
		return nil
	}
	for _, a := range r.Artifacts {
		if filepath.Base(a.Name) != w.Artifact {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(a.ContentBase64)
		if err != nil {
			return fmt.Errorf("artifact %s: %w", a.Name, err)
		}
		if !bytes.HasPrefix(raw, pngSignature) {
			return fmt.Errorf("artifact %s is not a PNG", a.Name)
		}
		return nil
	}
	return fmt.Errorf("artifact %s missing (got %d artifacts)", w.Artifact, len(r.Artifacts))
}

// getText fetches a small text endpoint (/readyz, /metrics).
func (c *apiClient) getText(ctx context.Context, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(data), err
}

// waitReady polls /readyz until it answers 200.
func (c *apiClient) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		code, body, err := c.getText(ctx, "/readyz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("HTTP %d: %s", code, firstLine([]byte(body)))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server not ready after %s: %s", timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// loadResult is one cell of the API matrix.
type loadResult struct {
	Latencies []time.Duration
	// Server holds the server's duration_ms of each successful execution.
	Server   []time.Duration
	Failures int
	Errors   []string // the first few distinct failure messages
	Wall     time.Duration
	// Truncated is set when the time bound stopped the cell before all
	// requests were sent.
	Truncated bool
}

// runLoad sends n executions of w from conc closed-loop workers (each sends
// its next request as soon as its previous answer arrives) and stops sending
// once maxTime has passed. before, when set, runs before each request, outside
// the timed part (used to wait for a refilled pool).
func (c *apiClient) runLoad(ctx context.Context, w Workload, conc, n int, maxTime time.Duration, before func()) loadResult {
	var (
		mu     sync.Mutex
		res    loadResult
		next   atomic.Int64
		wg     sync.WaitGroup
		errSet = map[string]bool{}
	)
	start := time.Now()
	deadline := start.Add(maxTime)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if next.Add(1) > int64(n) {
					return
				}
				if time.Now().After(deadline) {
					mu.Lock()
					res.Truncated = true
					mu.Unlock()
					return
				}
				if before != nil {
					before()
				}
				t0 := time.Now()
				sd, err := c.executeTimed(ctx, w)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					res.Failures++
					msg := err.Error()
					if !errSet[msg] && len(res.Errors) < 5 {
						errSet[msg] = true
						res.Errors = append(res.Errors, msg)
					}
				} else {
					res.Latencies = append(res.Latencies, d)
					res.Server = append(res.Server, sd)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Wall = time.Since(start)
	return res
}

// serverProc is a sandboxd serve started by the bench.
type serverProc struct {
	cmd    *exec.Cmd
	client *apiClient
	dir    string // temp dir: work root, state root, rootfs cache
	binDir string // temp dir holding the server's link to the binary
	log    *os.File
	done   chan error
	// stopping is set by stop(); exitedEarly holds the time the server
	// exited without being asked to (killed or signalled from outside).
	stopping    atomic.Bool
	exitedEarly atomic.Value
}

// exitedEarlyAt returns when the server exited on its own ("" if it did not).
func (s *serverProc) exitedEarlyAt() string {
	v, _ := s.exitedEarly.Load().(string)
	return v
}

// serverOptions configure startServer.
type serverOptions struct {
	Binary   string   // bin/sandboxd
	Image    string   // EXECUTION_PYTHON_IMAGE (dir:/abs/rootfs or an image reference)
	PoolSize int      // EXECUTION_POOL_SIZE; <0 leaves it unset
	ExtraEnv []string // KEY=VALUE, appended last (so they win)
	// CgroupParent is EXECUTION_CGROUP_PARENT, relative to our own cgroups.
	CgroupParent string
	LogPath      string
}

// freePort asks the kernel for an unused loopback port. Another process could
// take it before the server binds it; the server then fails to start and the
// bench says so.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func startServer(ctx context.Context, o serverOptions) (*serverProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	// The state root must not sit beside the binary (libcontainer's
	// /proc/self/exe sealing would then copy the binary on every start).
	dir, err := os.MkdirTemp("", "sandboxd-bench-")
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(o.LogPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"EXECUTION_WORKER_HOST=127.0.0.1",
		"EXECUTION_WORKER_PORT=" + strconv.Itoa(port),
		"EXECUTION_WORK_ROOT=" + filepath.Join(dir, "work"),
		"EXECUTION_RESULTS_DIR=" + filepath.Join(dir, "results"),
		"EXECUTION_SESSIONS_DIR=" + filepath.Join(dir, "sessions"),
		"EXECUTION_STATE_ROOT=" + filepath.Join(dir, "state"),
		"EXECUTION_ROOTFS_CACHE=" + filepath.Join(dir, "rootfs-cache"),
		"EXECUTION_PYTHON_IMAGE=" + o.Image,
		// A cgroup parent of its own: a worker's start-up sweep kills every
		// sandbox under its parent, so sharing the default one with other
		// workers or test runs on this host would kill theirs, and theirs ours.
		"EXECUTION_CGROUP_PARENT=" + o.CgroupParent,
	}
	if o.PoolSize >= 0 {
		env = append(env, "EXECUTION_POOL_SIZE="+strconv.Itoa(o.PoolSize))
	}
	env = append(env, o.ExtraEnv...)
	// Run a link of the binary under a name of its own: other tools on a
	// shared host stop *their* server with `pkill -f "sandboxd serve"` and
	// the like (observed here: SIGTERM mid-run), which must not hit ours.
	// It sits in a directory apart from the state root (as above).
	binDir, err := os.MkdirTemp("", "sbxbench-bin-")
	if err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	bin := filepath.Join(binDir, "sbxbench-server")
	if err := os.Link(o.Binary, bin); err != nil {
		if err := copyFile(o.Binary, bin); err != nil {
			logf.Close()
			os.RemoveAll(dir)
			os.RemoveAll(binDir)
			return nil, fmt.Errorf("copy %s: %w", o.Binary, err)
		}
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = env
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Its own process group, so a Ctrl-C of the bench reaches the server
	// only through stop() (which drains it properly).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s serve: %w", o.Binary, err)
	}
	s := &serverProc{cmd: cmd, dir: dir, binDir: binDir, log: logf, done: make(chan error, 1),
		client: newAPIClient(fmt.Sprintf("http://127.0.0.1:%d", port))}
	go func() {
		err := cmd.Wait()
		if !s.stopping.Load() {
			s.exitedEarly.Store(time.Now().UTC().Format("15:04:05.000"))
		}
		s.done <- err
	}()
	readyCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			s.done <- errors.New("exited")
			cancel()
		case <-readyCtx.Done():
		}
	}()
	if err := s.client.waitReady(readyCtx, 3*time.Minute); err != nil {
		s.stop()
		return nil, fmt.Errorf("%w (server log: %s: %s)", err, o.LogPath, tailFile(o.LogPath, 600))
	}
	return s, nil
}

// stop sends SIGTERM to the server (it drains and cleans up its sandboxes),
// waits for it, and kills it by PID if it does not exit within a minute.
func (s *serverProc) stop() {
	s.stopping.Store(true)
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(time.Minute):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	s.log.Close()
	// Session volumes stay mounted across a worker's stop (they are meant
	// to outlive it): unmount whatever the server left below its directory
	// before removing it, so RemoveAll never walks into a mount.
	unmountBelow(s.dir)
	os.RemoveAll(s.dir)
	os.RemoveAll(s.binDir)
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

func (s *serverProc) pid() int { return s.cmd.Process.Pid }

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return tail(s, 300)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func tailFile(path string, n int) string {
	data, _ := os.ReadFile(path)
	return strings.ReplaceAll(tail(strings.TrimSpace(string(data)), n), "\n", " | ")
}

// unmountBelow lazily unmounts every mount point below dir, deepest first.
func unmountBelow(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		// Field 5 is the mount point, octal-escaped (\040 for a space);
		// the bench's directories have none.
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
