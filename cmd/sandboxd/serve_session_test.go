package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// A worker killed with SIGKILL in the middle of a session's execution, then
// started again on the same directories: the session and every file are
// back, the execution that was running is answered interrupted, and the
// next execution says its Python state was lost to the restart.
func TestServeSessionSurvivesKill9(t *testing.T) {
	nsjailtest.RequireRoot(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	dirs := t.TempDir()
	sessions := filepath.Join(dirs, "sessions")
	// The two workers share every directory, as one worker restarted by
	// systemd does.
	env := []string{"EXECUTION_SESSIONS_DIR=" + sessions, "EXECUTION_RESULTS_DIR=" + filepath.Join(dirs, "results"),
		"EXECUTION_WORK_ROOT=" + filepath.Join(dirs, "work"), "EXECUTION_POOL_SIZE=1"}
	t.Cleanup(func() { unmountBelow(t, dirs) })

	a := startWorker(t, "session-kill9", rootfs, env...)
	var s struct {
		ID string `json:"id"`
	}
	call(t, a.base, "POST", "/v1/sessions", `{"type": "dynamic"}`, http.StatusCreated, &s)
	put(t, a.base, s.ID, "data/in.csv", "a,b\n1,2\n3,4\n")
	var r execAnswer
	call(t, a.base, "POST", "/v1/sessions/"+s.ID+"/executions",
		`{"code": "import pandas as pd\ndf = pd.read_csv('data/in.csv')\ndf.to_csv('data/out.csv', index=False)\nprint(int(df.a.sum()))"}`, http.StatusOK, &r)
	if r.Status != "succeeded" || r.Stdout != "4\n" || r.Session.State != "new" {
		t.Fatalf("first execution: %+v", r)
	}

	// An execution running when the worker dies.
	go func() {
		body := `{"id": "running-at-kill", "code": "import time\nprint('started', flush=True)\ntime.sleep(600)"}`
		resp, err := http.Post(a.base+"/v1/sessions/"+s.ID+"/executions", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the session to be busy", func() bool {
		var info struct {
			Kernel struct {
				State string `json:"state"`
			} `json:"kernel"`
		}
		call(t, a.base, "GET", "/v1/sessions/"+s.ID, "", http.StatusOK, &info)
		return info.Kernel.State == "busy"
	})
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.exited

	b := startWorker(t, "session-kill9", rootfs, env...)
	var files struct {
		Files []struct {
			Name string `json:"name"`
			Size int64  `json:"size"`
		} `json:"files"`
	}
	call(t, b.base, "GET", "/v1/sessions/"+s.ID+"/files?prefix=data/", "", http.StatusOK, &files)
	var names []string
	for _, f := range files.Files {
		names = append(names, f.Name)
	}
	if got := strings.Join(names, ","); got != "data/in.csv,data/out.csv" {
		t.Fatalf("files after the restart: %s", got)
	}
	if got := get(t, b.base, "/v1/sessions/"+s.ID+"/files/data/out.csv"); got != "a,b\n1,2\n3,4\n" {
		t.Fatalf("data/out.csv after the restart: %q", got)
	}
	var lost execAnswer
	call(t, b.base, "GET", "/v1/executions/running-at-kill", "", http.StatusOK, &lost)
	if lost.Status != "interrupted" {
		t.Fatalf("the execution running at the kill: status %q, want interrupted", lost.Status)
	}
	call(t, b.base, "POST", "/v1/sessions/"+s.ID+"/executions",
		`{"code": "print('df' in globals())\nimport pandas as pd\nprint(len(pd.read_csv('data/out.csv')))"}`, http.StatusOK, &r)
	if r.Status != "succeeded" || r.Stdout != "False\n2\n" || r.Session.State != "restarted" || r.Session.Reason != "worker_restart" {
		t.Fatalf("first execution after the restart: status %s, stdout %q, session %+v, stderr %s", r.Status, r.Stdout, r.Session, r.Stderr)
	}
	call(t, b.base, "POST", "/v1/sessions/"+s.ID+"/executions", `{"code": "x = 1"}`, http.StatusOK, &r)
	if r.Session.State != "preserved" {
		t.Fatalf("second execution after the restart: session %+v", r.Session)
	}
	call(t, b.base, "DELETE", "/v1/sessions/"+s.ID, "", http.StatusNoContent, nil)
	b.stop(t)
	if left := mountsBelow(t, dirs); len(left) > 0 {
		t.Fatalf("mounts left below the work root and sessions directory: %v", left)
	}
}

type execAnswer struct {
	Status  string `json:"status"`
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
	Session struct {
		State  string `json:"state"`
		Reason string `json:"reason"`
	} `json:"session"`
}

// call sends body (JSON, none when "") and decodes the answer into out
// (when not nil), failing the test unless the status is want.
func call(t *testing.T, base, method, path, body string, want int, out any) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: HTTP %d, want %d: %s", method, path, resp.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
}

func put(t *testing.T, base, id, path, content string) {
	t.Helper()
	req, _ := http.NewRequest("PUT", base+"/v1/sessions/"+id+"/files/"+path, bytes.NewReader([]byte(content)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT %s: HTTP %d", path, resp.StatusCode)
	}
}

func get(t *testing.T, base, path string) string {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d: %s", path, resp.StatusCode, data)
	}
	return string(data)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// mountsBelow lists the mount points below dir.
func mountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	return points
}

// unmountBelow unmounts what a failed test left below dir, deepest first,
// so that its temporary directory can be removed.
func unmountBelow(t *testing.T, dir string) {
	points := mountsBelow(t, dir)
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil {
			fmt.Fprintf(os.Stderr, "unmount %s: %v\n", points[i], err)
		}
	}
}
