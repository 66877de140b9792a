package warmpool_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// waitEnded waits for k to end (bounded) and returns why.
func waitEnded(t *testing.T, k *warmpool.Kernel) string {
	t.Helper()
	select {
	case <-k.Ended():
		return k.EndReason()
	case <-time.After(time.Minute):
		t.Fatal("the kernel did not end")
		return ""
	}
}

// SECURITY.md case 39: the code runs in the kernel process and can write
// anything on its control socket. Garbage, an over-long line, a forged
// reply followed by the real one, bytes from a background process between
// executions: each kills the kernel (EndProtocol); none is taken as an
// execution's result beyond the execution that wrote it.
func TestKernelControlSocketIsUntrusted(t *testing.T) {
	e := newKernelEnv(t, 0)
	during := map[string]string{
		"garbage line": `import os; os.write(3, b"garbage\n"); import time; time.sleep(30)`,
		"long line":    `import os; os.write(3, b"{" * 4096); import time; time.sleep(30)`,
		"wrong seq":    `import os; os.write(3, b'{"seq": 7, "exit_code": 0}\n'); import time; time.sleep(30)`,
		"bad field":    `import os; os.write(3, b'{"seq": 1, "exit_code": 0, "status": "succeeded"}\n'); import time; time.sleep(30)`,
		"exit code":    `import os; os.write(3, b'{"seq": 1, "exit_code": -9}\n'); import time; time.sleep(30)`,
	}
	for name, code := range during {
		t.Run(name, func(t *testing.T) {
			k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
			kr := run(t, k, code, time.Minute)
			if kr.Ended != warmpool.EndProtocol || kr.Result.Status != nsjail.StatusFailed {
				t.Fatalf("ended %q, status %s", kr.Ended, kr.Result.Status)
			}
		})
	}
	// A forged reply with the right seq ends the execution early (the code
	// only fools its own result); the real reply that follows kills the
	// kernel: the kernel is frozen in between (case 47), so it comes
	// during the next execution, which it does not answer.
	t.Run("forged then real reply", func(t *testing.T) {
		k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
		kr := run(t, k, `import os, time; os.write(3, b'{"seq": 1, "exit_code": 0}\n'); time.sleep(0.2)`)
		if kr.Result.Status != nsjail.StatusSucceeded {
			t.Fatalf("status %s", kr.Result.Status)
		}
		kr = run(t, k, `print("next")`)
		if kr.Ended != warmpool.EndProtocol || waitEnded(t, k) != warmpool.EndProtocol {
			t.Fatalf("ended %q", kr.Ended)
		}
	})
	// A process left behind writes a reply after its execution: frozen
	// with the kernel until the next execution, where it is a wrong one.
	t.Run("background writer after its execution", func(t *testing.T) {
		k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
		kr := run(t, k, `import os, time
if os.fork() == 0:
    time.sleep(0.3)
    os.write(3, b'{"seq": 99, "exit_code": 0}\n')
    os._exit(0)
print("parent")`)
		want(t, kr, nsjail.StatusSucceeded, 0, "parent\n")
		wantAlive(t, kr)
		kr = run(t, k, `import time; time.sleep(2); print("next")`)
		if kr.Ended != warmpool.EndProtocol || waitEnded(t, k) != warmpool.EndProtocol {
			t.Fatalf("ended %q, stdout %q", kr.Ended, kr.Result.Stdout)
		}
	})
	// A fork that returns into the kernel's loop ends there, as a forked
	// child of a script ends with it, and never answers.
	t.Run("fork falls through", func(t *testing.T) {
		k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
		kr := run(t, k, `import os
pid = os.fork()
if pid:
    os.waitpid(pid, 0)
print("parent" if pid else "child")`)
		want(t, kr, nsjail.StatusSucceeded, 0, "child\nparent\n")
		wantAlive(t, kr)
		want(t, run(t, k, `print("next")`), nsjail.StatusSucceeded, 0, "next\n")
		if r := k.EndReason(); r != "" {
			t.Fatalf("ended %q", r)
		}
	})
}

// SECURITY.md case 39: a process the code leaves running with the
// execution's stdout and stderr cannot hold the execution open or write
// into the next one: the pipes are drained when the reply comes, then
// closed.
func TestKernelOutputAfterTheReplyIsDropped(t *testing.T) {
	e := newKernelEnv(t, 0)
	k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
	// "fg" first: print writes the text and its newline apart, and the
	// writer's first "bg" could come between them.
	kr := run(t, k, `import subprocess
print("fg")
subprocess.Popen(["sleep", "3600"])
subprocess.Popen(["sh", "-c", "while :; do echo bg; echo bg >&2; sleep 0.01; done"])`)
	if kr.Result.Status != nsjail.StatusSucceeded || !strings.Contains(string(kr.Result.Stdout), "fg\n") {
		t.Fatalf("status %s, stdout %q", kr.Result.Status, kr.Result.Stdout)
	}
	wantAlive(t, kr)
	for range 3 {
		kr = run(t, k, `import time; time.sleep(0.05); print("next")`)
		want(t, kr, nsjail.StatusSucceeded, 0, "next\n")
		if len(kr.Result.Stderr) != 0 {
			t.Fatalf("stderr %q", kr.Result.Stderr)
		}
	}
}

// SECURITY.md case 41: the kernel is signalled through a pidfd opened for
// the kernel process itself (not the zygote, not a pid that could be
// reused), and not at all once it ended.
func TestKernelIsSignalledByPidfd(t *testing.T) {
	e := newKernelEnv(t, 1)
	k := e.start(t, e.sessionDir(t), true, warmpool.KernelOptions{})
	kr := run(t, k, `import os; print(os.getpid())`)
	inner, err := strconv.Atoi(strings.TrimSpace(string(kr.Result.Stdout)))
	// A zygote's kernel is its child; a template fork's is G, pid 1 as a
	// cold sandbox's process is (the zygote's part, T, is outside).
	if err != nil || (inner == 1) != e.forks {
		t.Fatalf("the kernel's pid inside is %q (template forks: %v)", kr.Result.Stdout, e.forks)
	}
	host, err := warmpool.KernelPid(k)
	if err != nil || host <= 0 {
		t.Fatalf("pidfd's pid %d, %v", host, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", host))
	if err != nil {
		t.Fatal(err)
	}
	var nspid []string
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
			nspid = strings.Fields(v)
		}
	}
	if len(nspid) < 2 || nspid[len(nspid)-1] != strconv.Itoa(inner) {
		t.Fatalf("the pidfd's process has NSpid %v, the kernel is %d inside", nspid, inner)
	}
	k.Close()
	if pid, err := warmpool.KernelPid(k); pid != 0 || err != nil {
		t.Fatalf("the pidfd outlived the kernel: %d %v", pid, err)
	}
	if err := k.Interrupt(); err != warmpool.ErrKernelEnded {
		t.Fatalf("Interrupt after Close: %v", err)
	}
}
