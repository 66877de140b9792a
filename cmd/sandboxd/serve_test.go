package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server"
)

// shimRootfs is the busybox rootfs with /usr/bin/python running main.py with
// /bin/sh (nsjailtest.WritePythonShim): the serve wiring is tested without
// the Python image.
func shimRootfs(t *testing.T) string {
	t.Helper()
	// Not under t.TempDir (0700): the sandbox's mapped root must reach it.
	dir, err := os.MkdirTemp("", "sandboxd-serve-rootfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if out, err := exec.Command("cp", "-a", nsjailtest.BusyboxRootfs(t)+"/.", dir+"/").CombinedOutput(); err != nil {
		t.Fatalf("copy rootfs: %v %s", err, out)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nsjailtest.WritePythonShim(dir, server.CodePath); err != nil {
		t.Fatal(err)
	}
	return dir
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// `sandboxd serve` end to end: config from the environment, sweep, rootfs,
// ready, an execution over TCP and one over worker_socket (its group and
// mode as configured), a silent connection closed at read_header_timeout,
// then SIGTERM with one execution in flight past the grace period: it is
// cancelled, the worker exits 0 and leaves nothing, the socket included.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	nsjailtest.RequireRoot(t)
	gid := socketGroup(t)
	sock := filepath.Join(fmt.Sprintf("/run/sandboxd-test-%d", os.Getpid()), "api.sock")
	w := startWorker(t, "serve", shimRootfs(t), "EXECUTION_SHUTDOWN_GRACE_MS=300", "EXECUTION_SOMETHING_ELSE=1",
		"EXECUTION_WORKER_SOCKET="+sock, fmt.Sprintf("EXECUTION_WORKER_SOCKET_GROUP=%d", gid), "EXECUTION_READ_HEADER_TIMEOUT=1s")
	base, port, work := w.base, w.port, w.work
	post := func(code string) (int, map[string]any) {
		resp, err := http.Post(base+"/v1/executions", "application/json", strings.NewReader(`{"code": "`+code+`"}`))
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var v map[string]any
		json.Unmarshal(body, &v)
		return resp.StatusCode, v
	}
	if code, v := post("echo served"); code != 200 || v["stdout"] != "served\n" {
		t.Fatalf("execution: %d %v", code, v)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(sock, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || st.Mode&0o7777 != 0o660 || int(st.Gid) != gid {
		t.Fatalf("worker_socket: mode %o gid %d (%v), want a socket 0660 gid %d", st.Mode, st.Gid, err, gid)
	}
	overSocket := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := overSocket.Post("http://localhost/v1/executions", "application/json", strings.NewReader(`{"code": "echo via socket"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"stdout":"via socket\n"`) {
		t.Fatalf("execution over worker_socket: %d %s", resp.StatusCode, body)
	}
	// SECURITY.md case 32: a connection that sends nothing is closed.
	silent, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	silent.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.Copy(io.Discard, silent); err != nil {
		t.Fatalf("a silent connection was not closed: %v", err)
	}
	silent.Close()
	long := make(chan map[string]any, 1)
	go func() { _, v := post("sleep 1007"); long <- v }()
	for deadline := time.Now().Add(10 * time.Second); len(nsjailtest.ProcessesMatching("sleep 1007")) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the long execution never started")
		}
	}
	w.stop(t) // SIGTERM, a clean exit, no sandbox left
	if v := <-long; v["status"] != "cancelled" {
		t.Fatalf("in-flight execution past the grace period: %v", v)
	}
	if pids := nsjailtest.ProcessesMatching("sleep 1007"); len(pids) > 0 {
		t.Fatalf("sandbox processes survived: %v", pids)
	}
	if entries, _ := os.ReadDir(work); len(entries) > 0 {
		t.Fatalf("workspaces left: %v", entries)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("worker_socket left after exit: %v", err)
	}
	for _, want := range []string{`"msg":"swept orphans"`, `"addr":"` + sock + `"`, `"msg":"rootfs ready"`, `"msg":"drained","cancelled":1`, `EXECUTION_SOMETHING_ELSE`} {
		if !strings.Contains(w.logs.String(), want) {
			t.Errorf("serve log lacks %s", want)
		}
	}
}

// socketGroup is a gid of this host other than root's.
func socketGroup(t *testing.T) int {
	data, _ := os.ReadFile("/etc/group")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Split(line, ":"); len(f) > 2 && f[2] != "0" {
			if gid, err := strconv.Atoi(f[2]); err == nil {
				return gid
			}
		}
	}
	t.Skip("no group other than root")
	return 0
}

func TestServeRefusesBadConfig(t *testing.T) {
	bin := buildCLI(t)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "EXECUTION_WORKER_PORT=0", "EXECUTION_DYNAMIC_MEMORY_MB=lots", "EXECUTION_POOL_PRELOAD=os;rm")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), `EXECUTION_DYNAMIC_MEMORY_MB="lots": not an integer`) {
		t.Fatalf("bad env: %v %s", err, out)
	}
	cmd = exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "EXECUTION_WORKER_PORT=0", "EXECUTION_POOL_PRELOAD=os;rm", "EXECUTION_WORKER_HOST=0.0.0.0")
	out, err = cmd.CombinedOutput()
	for _, want := range []string{"worker_port must be in 1..65535, got: 0", `pool_preload entries must be Python module names, got: "os;rm"`, "worker_token must be set"} {
		if !errors.As(err, &ee) || !strings.Contains(string(out), want) {
			t.Errorf("bad config: want %q in %s", want, out)
		}
	}
	toml := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(toml, []byte("worker_prot = 3100\n"), 0o644)
	out, err = exec.Command(bin, "serve", "--config", toml).CombinedOutput()
	if !errors.As(err, &ee) || !strings.Contains(string(out), "unknown key(s): worker_prot") {
		t.Errorf("unknown TOML key: %v %s", err, out)
	}
}
