package nsjail

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// seizeAndEndThread attaches pid on a thread of its own, runs during while
// attached, and ends that thread still attached, as pinG does with a pid
// it no longer knows to be G's (onOwnThread).
func seizeAndEndThread(t *testing.T, pid int, during func()) {
	t.Helper()
	err := onOwnThread(func() (error, bool) {
		if err := ptrace(unix.PTRACE_SEIZE, pid, 0); err != nil {
			return err, false
		}
		during()
		return nil, true
	})
	if err != nil {
		t.Fatalf("PTRACE_SEIZE %d: %v", pid, err)
	}
}

// What pinG relies on when it ends its thread instead of releasing a
// tracee it no longer knows to be G (SECURITY.md case 71: G reaped between
// its checks, its pid reused): the kernel detaches the tracee without
// taking anything from it. A child of the worker's own that exited while
// attached keeps its exit status for its own wait; a running one runs on,
// untraced; another process's child that exited while attached reaches
// its parent's wait (which would otherwise wait for it for good).
func TestEndingThePinThreadLeavesTheProcessAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: ptrace")
	}
	t.Run("own child, exited", func(t *testing.T) {
		cmd := exec.Command("sh", "-c", "read x; exit 7")
		in := startWithStdin(t, cmd)
		seizeAndEndThread(t, cmd.Process.Pid, func() {
			in.Close() // it exits while attached
			waitState(t, cmd.Process.Pid, "Z")
		})
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
			t.Fatalf("the child's own wait: %v, want exit status 7", err)
		}
	})
	t.Run("own child, running", func(t *testing.T) {
		cmd := exec.Command("sh", "-c", "read x; exit 3")
		in := startWithStdin(t, cmd)
		seizeAndEndThread(t, cmd.Process.Pid, func() {})
		for deadline := time.Now().Add(10 * time.Second); statusOf(t, cmd.Process.Pid, "TracerPid") != "0"; {
			if time.Now().After(deadline) {
				t.Fatal("still traced 10 s after the tracing thread ended")
			}
			time.Sleep(time.Millisecond)
		}
		in.Close()
		if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
			t.Fatalf("the child's own wait: %v, want exit status 3", err)
		}
	})
	t.Run("another's child, exited", func(t *testing.T) {
		// sh's background child reads sh's stdin (fd 3: a non-interactive
		// shell gives a background job /dev/null as its stdin) and exits
		// 5 once it is closed, while attached; sh waits for it and exits
		// with its status, which it gets only once the child is handed
		// back to it.
		cmd := exec.Command("sh", "-c", "exec 3<&0; (read x <&3; exit 5) & echo $!; wait $!")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		in := startWithStdin(t, cmd)
		buf := make([]byte, 32)
		n, _ := out.Read(buf)
		child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
		if err != nil {
			t.Fatalf("sh's child's pid: %q: %v", buf[:n], err)
		}
		if state := statusOf(t, child, "State"); state == "Z" {
			t.Fatal("sh's child exited before its input was closed")
		}
		seizeAndEndThread(t, child, func() {
			in.Close()
			waitState(t, child, "Z")
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
			t.Fatal("sh never got its child's exit: the zombie was kept from it")
		}
	})
}

// startWithStdin starts cmd with a pipe as its stdin and returns the pipe's
// write end: the tests' processes wait for it to close.
func startWithStdin(t *testing.T, cmd *exec.Cmd) io.WriteCloser {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return in
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

// waitState waits until pid's State is state (a zombie: "Z").
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
