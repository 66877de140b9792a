package nsjail

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"
)

// classify is pure: every status and every limit, without root.
func TestClassify(t *testing.T) {
	exited := func(code int) ending { return ending{known: true, exitCode: code} }
	signaled := func(sig syscall.Signal) ending {
		code, name := decodeWaitStatus(syscall.WaitStatus(sig))
		return ending{known: true, exitCode: code, signal: name}
	}
	for _, c := range []struct {
		name   string
		end    ending
		counts counted
		status Status
		hit    []string
	}{
		{"exit 0", exited(0), counted{}, StatusSucceeded, nil},
		{"exit 3", exited(3), counted{}, StatusFailed, nil},
		{"exit 137 without a signal", exited(137), counted{}, StatusFailed, nil},
		{"a signal we did not send", signaled(syscall.SIGSEGV), counted{}, StatusFailed, nil},
		{"SIGKILL from inside", signaled(syscall.SIGKILL), counted{}, StatusFailed, nil},
		{"reported exit 0", ending{known: true, exitCode: 0}, counted{}, StatusSucceeded, nil},
		{"timeout", ending{killedFor: StatusTimeout, known: true, exitCode: 137, signal: "SIGKILL"}, counted{}, StatusTimeout, []string{LimitTimeout}},
		{"timeout, exit unknown", ending{killedFor: StatusTimeout, exitCode: -1}, counted{}, StatusTimeout, []string{LimitTimeout}},
		{"timeout wins over OOM", ending{killedFor: StatusTimeout, known: true, exitCode: 137, signal: "SIGKILL"}, counted{oomKills: 1}, StatusTimeout, []string{LimitMemory, LimitTimeout}},
		{"cancelled", ending{killedFor: StatusCancelled, known: true, exitCode: 137, signal: "SIGKILL"}, counted{}, StatusCancelled, nil},
		{"cancelled after an OOM", ending{killedFor: StatusCancelled, known: true}, counted{oomKills: 2}, StatusCancelled, []string{LimitMemory}},
		{"OOM kill of init", signaled(syscall.SIGKILL), counted{oomKills: 1}, StatusOOM, []string{LimitMemory}},
		{"OOM kill of a child, init exits 0", exited(0), counted{oomKills: 1}, StatusOOM, []string{LimitMemory}},
		{"OOM, exit unknown", ending{exitCode: -1}, counted{oomKills: 1}, StatusOOM, []string{LimitMemory}},
		{"exit unknown", ending{exitCode: -1}, counted{}, StatusSandboxError, nil},
		{"exit unknown after limits", ending{exitCode: -1}, counted{pidsLimitHits: 1, stdoutTruncated: true}, StatusSandboxError, []string{LimitStdout, LimitPids}},
		{"pids limit hit, exit 0", exited(0), counted{pidsLimitHits: 5}, StatusSucceeded, []string{LimitPids}},
		{"pids limit hit, failed", exited(2), counted{pidsLimitHits: 1}, StatusFailed, []string{LimitPids}},
		{"stdout cap", exited(0), counted{stdoutTruncated: true}, StatusSucceeded, []string{LimitStdout}},
		{"stderr cap", exited(1), counted{stderrTruncated: true}, StatusFailed, []string{LimitStderr}},
		{"everything at once", ending{killedFor: StatusTimeout, exitCode: -1},
			counted{oomKills: 1, pidsLimitHits: 1, stdoutTruncated: true, stderrTruncated: true},
			StatusTimeout, []string{LimitStdout, LimitStderr, LimitPids, LimitMemory, LimitTimeout}},
	} {
		status, hit := classify(c.end, c.counts)
		if c.hit == nil {
			c.hit = []string{}
		}
		if status != c.status || !slices.Equal(hit, c.hit) || hit == nil {
			t.Errorf("%s: classify = %s %#v, want %s %#v", c.name, status, hit, c.status, c.hit)
		}
	}
}

func TestDecodeWaitStatus(t *testing.T) {
	for _, c := range []struct {
		ws     syscall.WaitStatus
		code   int
		signal string
	}{
		{0, 0, ""},
		{3 << 8, 3, ""},
		{255 << 8, 255, ""},
		{syscall.WaitStatus(syscall.SIGKILL), 137, "SIGKILL"},
		{syscall.WaitStatus(syscall.SIGSEGV) | 0x80, 139, "SIGSEGV"}, // core dumped
		{0x7f | syscall.WaitStatus(syscall.SIGSTOP)<<8, -1, ""},      // stopped: neither
	} {
		if code, signal := decodeWaitStatus(c.ws); code != c.code || signal != c.signal {
			t.Errorf("decodeWaitStatus(%#x) = %d %q, want %d %q", uint32(c.ws), code, signal, c.code, c.signal)
		}
	}
}

// What Wait saw becomes an ending: a report is the exit status; no report
// and no reaped state is an unknown exit.
func TestAwaitedEnding(t *testing.T) {
	if e := (awaited{haveReport: true, reported: 4 << 8}).ending(); e != (ending{known: true, exitCode: 4}) {
		t.Errorf("reported exit: %+v", e)
	}
	if e := (awaited{haveReport: true, reported: syscall.WaitStatus(syscall.SIGSEGV)}).ending(); e != (ending{known: true, exitCode: 139, signal: "SIGSEGV"}) {
		t.Errorf("reported signal: %+v", e)
	}
	if e := (awaited{killedFor: StatusCancelled, waitErr: errors.New("x")}).ending(); e != (ending{killedFor: StatusCancelled, exitCode: -1}) {
		t.Errorf("not reaped: %+v", e)
	}
}

// A start failure is a *StartError, found through wrapping, that Run turns
// into a sandbox_error Result.
func TestStartErrorIsTyped(t *testing.T) {
	at := time.Now()
	var err error = &StartError{ID: "sbx-1", At: at, Err: fmt.Errorf("unable to start sandbox: %w", syscall.ENOENT)}
	err = fmt.Errorf("pool refill: %w", err)
	var se *StartError
	if !errors.As(err, &se) || se.ID != "sbx-1" || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("errors.As/Is through wrapping: %v %+v", err, se)
	}
	res := se.Result()
	if res.ID != "sbx-1" || res.Status != StatusSandboxError || res.ExitCode != -1 || res.LimitsHit == nil ||
		!res.StartedAt.Equal(at) || !res.FinishedAt.Equal(at) || res.Error != "unable to start sandbox: no such file or directory" {
		t.Fatalf("Result: %+v", res)
	}
}
