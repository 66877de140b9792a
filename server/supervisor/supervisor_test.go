package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// run supervises `sh -c script` and reports its status and whether the
// cleanup ran.
func run(t *testing.T, script string) (Status, bool) {
	t.Helper()
	cleaned := false
	st, err := Run(Options{
		Path:    "/bin/sh",
		Args:    []string{"sh", "-c", script},
		Env:     os.Environ(),
		Cleanup: func(Status) error { cleaned = true; return errors.New("the cleanup's error is logged only") },
	})
	if err != nil {
		t.Fatal(err)
	}
	return st, cleaned
}

// The child's status is the supervisor's (128 + a signal's number), and
// the cleanup runs after everything but a clean exit.
func TestStatus(t *testing.T) {
	for _, c := range []struct {
		script  string
		code    int
		cleanup bool
	}{
		{"exit 0", 0, false},
		{"exit 3", 3, true},
		{"kill -KILL $$", 137, true},
		{"kill -SEGV $$", 128 + int(syscall.SIGSEGV), true},
	} {
		st, cleaned := run(t, c.script)
		if st.ExitCode() != c.code || cleaned != c.cleanup {
			t.Errorf("%q: exit code %d (%v), cleanup %v; want %d, cleanup %v", c.script, st.ExitCode(), st, cleaned, c.code, c.cleanup)
		}
	}
}

// A SIGTERM to the supervisor reaches the child, whose clean exit is the
// supervisor's.
func TestForwardsSIGTERM(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	go func() {
		for range 500 {
			if _, err := os.Stat(ready); err == nil {
				syscall.Kill(os.Getpid(), syscall.SIGTERM)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	st, cleaned := run(t, `trap 'exit 0' TERM; touch `+ready+`; while :; do sleep 0.01; done`)
	if !st.Clean() || cleaned {
		t.Fatalf("after SIGTERM: %v, cleanup %v; want a clean exit and no cleanup", st, cleaned)
	}
}

// The child's orphans are reaped, also while the cleanup runs: a
// grandchild the child left running, killed by the cleanup, is gone (not
// a zombie) before the cleanup returns. A killed template's init waits for
// exactly this (its namespace's pids freed) before it ends, and the sweep
// in the cleanup waits for the init to end.
func TestReapsOrphans(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	var orphan int
	var cleanupErr error
	st, err := Run(Options{
		Path: "/bin/sh",
		Args: []string{"sh", "-c", "sleep 60 & echo $! > " + pidFile + "; kill -KILL $$"},
		Env:  os.Environ(),
		Cleanup: func(Status) (err error) {
			defer func() { cleanupErr = err }()
			b, err := os.ReadFile(pidFile)
			if err != nil {
				return err
			}
			if orphan, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
				return err
			}
			if err := syscall.Kill(orphan, syscall.SIGKILL); err != nil {
				return err
			}
			for range 5000 {
				if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); os.IsNotExist(err) {
					return nil
				}
				time.Sleep(time.Millisecond)
			}
			b, _ = os.ReadFile("/proc/" + strconv.Itoa(orphan) + "/stat")
			return fmt.Errorf("orphan %d not reaped while the cleanup runs (zombie: %v)", orphan, zombie(b))
		},
	})
	if err != nil || st.ExitCode() != 137 || orphan == 0 || cleanupErr != nil {
		t.Fatalf("status %v, err %v, orphan %d, cleanup: %v", st, err, orphan, cleanupErr)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); !os.IsNotExist(err) {
		t.Fatalf("orphan %d not reaped (%v)", orphan, err)
	}
}

func zombie(stat []byte) bool {
	for i := len(stat) - 1; i > 0; i-- {
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == 'Z'
		}
	}
	return false
}
