package nsjail

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// seizeAndLetGo attaches pid as pinG does and lets it go with letGo, after
// wait (run while attached), all on one locked thread as ptrace requires.
func seizeAndLetGo(t *testing.T, pid int, wait func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pt := func(req int, data uintptr) error { return ptrace(req, pid, data) }
	if err := pt(unix.PTRACE_SEIZE, 0); err != nil {
		t.Fatalf("PTRACE_SEIZE %d: %v", pid, err)
	}
	wait()
	letGo(pid, slog.New(slog.NewTextHandler(io.Discard, nil)), pt)
}

// letGo (pinG's undo when the pid attached may no longer be G's, SECURITY.md
// case 41's pid reuse) must never take a process's exit from its parent:
// a child of the worker's own that ended while attached keeps its status
// for its own waiter, and another process's child is handed back to its
// parent (which would otherwise wait for it forever).
func TestLetGoLeavesTheExitToTheParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: ptrace")
	}
	t.Run("own child, exited", func(t *testing.T) {
		cmd := exec.Command("sh", "-c", "read x; exit 7")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		seizeAndLetGo(t, cmd.Process.Pid, func() {
			in.Close() // it exits while attached
			waitState(t, cmd.Process.Pid, "Z")
		})
		err = cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
			t.Fatalf("the child's own wait: %v, want exit status 7", err)
		}
	})
	t.Run("own child, running", func(t *testing.T) {
		cmd := exec.Command("sh", "-c", "read x; exit 3")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		seizeAndLetGo(t, cmd.Process.Pid, func() {})
		if tracer := statusOf(t, cmd.Process.Pid, "TracerPid"); tracer != "0" {
			t.Errorf("TracerPid %s after letGo, want 0", tracer)
		}
		in.Close()
		if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
			t.Fatalf("the child's own wait: %v, want exit status 3", err)
		}
	})
	t.Run("another's child, exited", func(t *testing.T) {
		// sh's child exits while attached; sh waits for it and exits with
		// its status, which it gets only if letGo handed the zombie back.
		cmd := exec.Command("sh", "-c", "(read x; exit 5) & echo $!; wait $!")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 32)
		n, _ := out.Read(buf)
		gpid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
		if err != nil {
			t.Fatalf("sh's child's pid: %q: %v", buf[:n], err)
		}
		seizeAndLetGo(t, gpid, func() {
			in.Close()
			waitState(t, gpid, "Z")
		})
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 5 {
				t.Fatalf("sh's wait for its child: %v, want exit status 5", err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatal("sh never got its child's exit: letGo kept the zombie")
		}
	})
}

func statusOf(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	v := statusField(string(b), key)
	if len(v) == 0 {
		t.Fatalf("no %s in /proc/%d/status", key, pid)
	}
	return v[0]
}

// waitState waits until pid's State starts with state (a zombie: "Z").
func waitState(t *testing.T, pid int, state string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for statusOf(t, pid, "State") != state {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never reached state %s", pid, state)
		}
		time.Sleep(time.Millisecond)
	}
}
