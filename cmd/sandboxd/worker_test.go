package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
)

// worker is a `sandboxd serve` child process that a test started, with a
// state root, cgroup parent, work root, results directory and port of its
// own.
type worker struct {
	cmd           *exec.Cmd
	base          string // http://127.0.0.1:PORT
	port          int
	state, cgroup string
	work          string
	logs          *lockedBuffer
	exited        chan error
}

// lockedBuffer is the serve process's stderr, read while it is written.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startWorker starts `sandboxd serve` serving rootfs, with env added to its
// environment (later entries win), and waits for /readyz. name keeps its
// state root and cgroup parent apart from other tests'. A worker still
// running when the test ends is killed; a failed test logs its stderr.
func startWorker(t *testing.T, name, rootfs string, env ...string) *worker {
	t.Helper()
	return startWorkerCmd(t, name, rootfs, func(bin string) *exec.Cmd { return exec.Command(bin, "serve") }, env...)
}

// startWorkerCmd is startWorker with the command that runs serve made by
// command from the built binary's path (a wrapper, another subcommand).
func startWorkerCmd(t *testing.T, name, rootfs string, command func(bin string) *exec.Cmd, env ...string) *worker {
	t.Helper()
	w := &worker{
		port:   freePort(t),
		state:  fmt.Sprintf("/run/sandboxd-test-%d/%s-state", os.Getpid(), name),
		cgroup: fmt.Sprintf("sandboxd-test-%d-%s", os.Getpid(), name),
		work:   filepath.Join(t.TempDir(), "work"),
		logs:   &lockedBuffer{},
		exited: make(chan error, 1),
	}
	w.base = fmt.Sprintf("http://127.0.0.1:%d", w.port)
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(w.state)) })
	w.cmd = command(buildCLI(t))
	w.cmd.Env = append(os.Environ(), "EXECUTION_PYTHON_IMAGE=dir:"+rootfs, "EXECUTION_WORK_ROOT="+w.work,
		"EXECUTION_RESULTS_DIR="+filepath.Join(t.TempDir(), "results"), "EXECUTION_SESSIONS_DIR="+filepath.Join(t.TempDir(), "sessions"),
		"EXECUTION_STATE_ROOT="+w.state,
		"EXECUTION_CGROUP_PARENT="+w.cgroup, fmt.Sprintf("EXECUTION_WORKER_PORT=%d", w.port),
		fmt.Sprintf("EXECUTION_POOL_SIZE=%d", nsjailtest.PoolSize(t, rootfs)))
	w.cmd.Env = append(w.cmd.Env, env...)
	w.cmd.Stderr = w.logs
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.exited <- w.cmd.Wait() }()
	t.Cleanup(func() {
		if w.cmd.ProcessState == nil {
			w.checkForks(t)
			w.cmd.Process.Kill()
			<-w.exited
		}
		if t.Failed() {
			t.Logf("serve log (tail):\n%s", tail(w.logs.String(), 20000))
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(w.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return w
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %v", err)
		}
	}
}

// pid is the serve process's pid.
func (w *worker) pid() int { return w.cmd.Process.Pid }

// stop sends SIGTERM and requires a clean exit within 20 s and nothing of
// its sandboxes left behind.
func (w *worker) stop(t *testing.T) {
	t.Helper()
	w.checkForks(t)
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-w.exited:
		if err != nil {
			t.Fatalf("serve exited with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit after SIGTERM")
	}
	if err := nsjailtest.CheckNoLeftovers(w.state, w.cgroup); err != nil {
		t.Fatal(err)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// checkForks fails t when EXECUTION_POOL_TEMPLATE_FORKS is on in the
// test's environment (nsjailtest.TemplateForks) but the worker's pool has
// made or served warm sandboxes without starting a template: the switch
// did not reach it (a test that sets its own environment without
// os.Environ), and the suite would pass on zygotes while claiming forks.
// A worker whose /metrics cannot be read (a token) is not checked.
func (w *worker) checkForks(t *testing.T) {
	t.Helper()
	if !nsjailtest.TemplateForks(t, config.Default().PoolTemplateForks) {
		return
	}
	resp, err := http.Get(w.base + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return
	}
	m := map[string]float64{}
	for _, l := range strings.Split(string(body), "\n") {
		if f := strings.Fields(l); len(f) == 2 && !strings.HasPrefix(l, "#") {
			m[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	if m["sandboxd_pool_ready"]+m["sandboxd_pool_taken_total"] > 0 && m["sandboxd_pool_templates_started_total"] == 0 {
		t.Errorf("%s is on but the worker's warm sandboxes are not template forks: ready %v, taken %v, templates started %v",
			nsjailtest.TemplateForksEnv, m["sandboxd_pool_ready"], m["sandboxd_pool_taken_total"], m["sandboxd_pool_templates_started_total"])
	}
}
