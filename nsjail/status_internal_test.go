package nsjail

import (
	"strings"
	"syscall"
	"testing"
)

// A recorded /proc/PID/status (the lines statusAlive reads, and neighbours).
const liveStatus = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nPid:\t42\n" +
	"SigQ:\t0/63379\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\nSigBlk:\t0000000000000000\n" +
	"SigIgn:\t0000000001001000\nSigCgt:\t0000000000000000\n"

func TestStatusAlive(t *testing.T) {
	with := func(old, new string) string { return strings.Replace(liveStatus, old, new, 1) }
	for _, tc := range []struct {
		name, status string
		want         bool
	}{
		{"sleeping", liveStatus, true},
		{"running", with("S (sleeping)", "R (running)"), true},
		{"stopped", with("S (sleeping)", "T (stopped)"), true},
		{"zombie", with("S (sleeping)", "Z (zombie)"), false},
		{"dead", with("S (sleeping)", "X (dead)"), false},
		{"SIGKILL pending for the process", with("ShdPnd:\t0000000000000000", "ShdPnd:\t0000000000000100"), false},
		{"SIGKILL pending for the thread", with("SigPnd:\t0000000000000000", "SigPnd:\t0000000000000100"), false},
		{"SIGTERM pending", with("ShdPnd:\t0000000000000000", "ShdPnd:\t0000000000004000"), true},
		{"unparsable mask", with("ShdPnd:\t0000000000000000", "ShdPnd:\tzz"), false},
	} {
		if got := statusAlive(tc.status); got != tc.want {
			t.Errorf("%s: statusAlive = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func exited(code int) syscall.WaitStatus             { return syscall.WaitStatus(code << 8) }
func signaled(sig syscall.Signal) syscall.WaitStatus { return syscall.WaitStatus(sig) }

// The warm pool's zygote exits with the status it reported (a signal N as
// 128+N); an init killed before it could exit says nothing.
func TestReportMismatch(t *testing.T) {
	for _, tc := range []struct {
		reported, init syscall.WaitStatus
		want           bool
	}{
		{exited(0), exited(0), false},
		{exited(7), exited(7), false},
		{signaled(syscall.SIGSEGV), exited(139), false},
		{exited(0), exited(7), true},
		{exited(7), exited(0), true},
		{signaled(syscall.SIGKILL), exited(0), true},
		{exited(0), signaled(syscall.SIGKILL), false},
	} {
		if got := reportMismatch(tc.reported, tc.init); got != tc.want {
			t.Errorf("reportMismatch(%#x, %#x) = %v, want %v", int(tc.reported), int(tc.init), got, tc.want)
		}
	}
}
