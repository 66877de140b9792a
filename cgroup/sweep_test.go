package cgroup

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// SECURITY.md case 22: after a worker crash, its sandboxes' cgroups (with
// processes, and a child cgroup) are killed and removed in every hierarchy.
// SECURITY.md case 29: a cgroup the caller does not name as its own (a live
// sandbox, or someone else's under a mistaken parent) is left alone.
func TestSweepOrphans(t *testing.T) {
	h := realHost(t)
	orphan := sandboxCgroup(t, h, "orphan-a")
	foreign := sandboxCgroup(t, h, "foreign-b")
	ours := func(id string) bool { return id == "orphan-a" }
	// A child cgroup inside the orphan, as a sandbox could not make but a
	// buggy one might leave: removed children first.
	nested := Paths{}
	for c, d := range orphan {
		nested[c] = filepath.Join(d, "sub")
		if err := os.Mkdir(nested[c], 0o755); err != nil {
			t.Fatal(err)
		}
		if c == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				writeT(t, filepath.Join(nested[c], f), readT(t, filepath.Join(d, f)))
			}
		}
	}
	o1 := startIn(t, uniqueDirs(orphan), `(setsid sleep 1000 &); exec sleep 1000`)
	o2 := startIn(t, uniqueDirs(nested), `exec sleep 1000`)
	l := startIn(t, uniqueDirs(foreign), `exec sleep 1000`)
	waitProcs(t, orphan, 3)

	var logs bytes.Buffer
	removed, err := h.SweepOrphans(testParent, ours, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(removed, []string{"orphan-a"}) {
		t.Errorf("removed %v, want [orphan-a]", removed)
	}
	for _, cmd := range []*exec.Cmd{o1, o2} {
		cmd.Wait()
		if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
			t.Errorf("orphan process: %v, want killed", cmd.ProcessState)
		}
	}
	for c, d := range orphan {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s: orphan cgroup %s still there (%v)", c, d, err)
		}
	}
	for c, d := range foreign {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: a cgroup not named as ours is gone: %v", c, err)
		}
	}
	if err := l.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a process in a cgroup not named as ours was hit: %v", err)
	}
	if !strings.Contains(logs.String(), "execution_id=orphan-a") {
		t.Errorf("no log line for the orphan: %q", logs.String())
	}

	// Nothing left to sweep; an unknown parent is not an error.
	if removed, err := h.SweepOrphans(testParent, ours, nil); err != nil || len(removed) != 0 {
		t.Errorf("second sweep: %v, %v", removed, err)
	}
	if _, err := h.SweepOrphans(testParent+"-none", ours, nil); err != nil {
		t.Errorf("absent parent: %v", err)
	}
	if _, err := h.SweepOrphans("../x", ours, nil); err == nil {
		t.Error("escaping parent accepted")
	}
}
