package cgroup

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// copyTree copies a recorded cgroupfs tree into a temp dir.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if e.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// snapshot maps every file outside skip to its content.
func snapshot(t *testing.T, root, skip string) map[string]string {
	t.Helper()
	m := map[string]string{}
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if p == skip {
			return filepath.SkipDir
		}
		if !e.IsDir() {
			b, _ := os.ReadFile(p)
			m[p] = string(b)
		}
		return nil
	})
	return m
}

func readT(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// v2Tree is a recorded /sys/fs/cgroup with the worker in
// system.slice/sandboxd.service, holding only this test process.
func v2Tree(t *testing.T, name string) (root, own string, h *Hierarchy) {
	root = copyTree(t, filepath.Join("..", "testdata", "cgroup", "v2", name))
	own = filepath.Join(root, "system.slice", "sandboxd.service")
	writeT(t, filepath.Join(own, "cgroup.procs"), strconv.Itoa(os.Getpid())+"\n")
	return root, own, &Hierarchy{Mode: Unified, Own: Paths{"": own}}
}

func TestPrepareParentV2Delegates(t *testing.T) {
	root, own, h := v2Tree(t, "delegated")
	outside := snapshot(t, root, own)
	if err := h.PrepareParent("sandboxd"); err != nil {
		t.Fatal(err)
	}
	leaf := filepath.Join(own, "supervisor")
	if got := readT(t, filepath.Join(leaf, "cgroup.procs")); got != strconv.Itoa(os.Getpid()) {
		t.Errorf("supervisor/cgroup.procs = %q, want our pid", got)
	}
	for _, d := range []string{own, filepath.Join(own, "sandboxd")} {
		if got := readT(t, filepath.Join(d, "cgroup.subtree_control")); got != "+cpu +memory +pids" {
			t.Errorf("%s/cgroup.subtree_control = %q", d, got)
		}
	}
	if h.Own[""] != leaf {
		t.Errorf("Own = %s, want the leaf %s", h.Own[""], leaf)
	}
	if got, err := h.ParentDirs("sandboxd"); err != nil || got[""] != filepath.Join(own, "sandboxd") {
		t.Errorf("ParentDirs = %v, %v", got, err)
	}
	if after := snapshot(t, root, own); !reflect.DeepEqual(outside, after) {
		t.Errorf("files above the worker's cgroup changed:\nbefore %v\nafter  %v", outside, after)
	}
	// Idempotent: a second call (or a restarted worker already in the leaf).
	if err := h.PrepareParent("sandboxd"); err != nil {
		t.Errorf("second PrepareParent: %v", err)
	}
	// A nested parent hands the controllers down every level.
	if err := h.PrepareParent("a/b"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a", "a/b"} {
		if got := readT(t, filepath.Join(own, d, "cgroup.subtree_control")); got != "+cpu +memory +pids" {
			t.Errorf("%s/cgroup.subtree_control = %q", d, got)
		}
	}
}

// `sandboxd supervise` (pid 1 of the worker image) calls PrepareParent
// before it starts serve, so serve starts in the leaf beside it and finds
// <own> empty: serve's own PrepareParent succeeds, moves nothing, and both
// see the same sandboxes' parent, which the supervisor sweeps after a
// killed serve (SECURITY.md case 60).
func TestPrepareParentV2UnderSupervise(t *testing.T) {
	_, own, sup := v2Tree(t, "delegated")
	if err := sup.PrepareParent("sandboxd"); err != nil {
		t.Fatal(err)
	}
	// What the kernel then shows: the supervisor (4242 here) and its
	// serve child (this process) in the leaf, nothing left in <own>.
	leaf := filepath.Join(own, "supervisor")
	procs := "4242\n" + strconv.Itoa(os.Getpid()) + "\n"
	writeT(t, filepath.Join(own, "cgroup.procs"), "")
	writeT(t, filepath.Join(leaf, "cgroup.procs"), procs)
	serve := &Hierarchy{Mode: Unified, Own: Paths{"": leaf}}
	if err := serve.PrepareParent("sandboxd"); err != nil {
		t.Fatalf("serve under supervise: %v", err)
	}
	if got := readT(t, filepath.Join(leaf, "cgroup.procs")); got != procs {
		t.Errorf("leaf's cgroup.procs rewritten: %q", got)
	}
	a, errA := sup.ParentDirs("sandboxd")
	b, errB := serve.ParentDirs("sandboxd")
	if errA != nil || errB != nil || !reflect.DeepEqual(a, b) || a[""] != filepath.Join(own, "sandboxd") {
		t.Errorf("parents: supervisor %v (%v), serve %v (%v)", a, errA, b, errB)
	}
}

func TestPrepareParentV2Refuses(t *testing.T) {
	t.Run("undelegated", func(t *testing.T) {
		_, own, h := v2Tree(t, "undelegated")
		err := h.PrepareParent("sandboxd")
		if err == nil || !strings.Contains(err.Error(), "cpu") || !strings.Contains(err.Error(), "Delegate=yes") {
			t.Fatalf("err = %v, want missing cpu and a Delegate=yes hint", err)
		}
		if _, err := os.Stat(filepath.Join(own, "supervisor")); err == nil {
			t.Error("moved into a leaf although controllers are missing")
		}
	})
	t.Run("foreign process", func(t *testing.T) {
		_, own, h := v2Tree(t, "delegated")
		writeT(t, filepath.Join(own, "cgroup.procs"), strconv.Itoa(os.Getpid())+"\n4242\n")
		err := h.PrepareParent("sandboxd")
		if err == nil || !strings.Contains(err.Error(), "4242") || !strings.Contains(err.Error(), "no internal processes") {
			t.Fatalf("err = %v, want pid 4242 and the no-internal-processes rule", err)
		}
		if got := readT(t, filepath.Join(own, "cgroup.subtree_control")); got != "" {
			t.Errorf("controllers enabled anyway: %q", got)
		}
		if got := readT(t, filepath.Join(own, "cgroup.procs")); !strings.Contains(got, "4242") {
			t.Errorf("foreign process touched: cgroup.procs = %q", got)
		}
		if _, err := os.Stat(filepath.Join(own, "supervisor")); err == nil {
			t.Error("moved into a leaf although the refusal should change nothing")
		}
	})
	t.Run("escaping parent", func(t *testing.T) {
		root, _, h := v2Tree(t, "delegated")
		before := snapshot(t, root, "")
		if err := h.PrepareParent("../escape"); err == nil {
			t.Fatal("../escape accepted")
		}
		if after := snapshot(t, root, ""); !reflect.DeepEqual(before, after) {
			t.Error("tree changed by a rejected call")
		}
	})
}

func TestPrepareParentV1MissingHierarchy(t *testing.T) {
	dir := t.TempDir()
	h := &Hierarchy{Mode: Hybrid, Own: Paths{"memory": dir, "cpu": dir, "cpuacct": dir}}
	err := h.PrepareParent("sandboxd")
	if err == nil || !strings.Contains(err.Error(), "pids") {
		t.Fatalf("err = %v, want the unmounted pids hierarchy named", err)
	}
}

// On a v1 host PrepareParent creates the parent in each required hierarchy
// and moves nothing: /proc/self/cgroup is unchanged.
func TestPrepareParentV1Real(t *testing.T) {
	h := realHost(t)
	if h.Mode.V2() {
		t.Skip("v1 host test")
	}
	before := readT(t, "/proc/self/cgroup")
	if err := h.PrepareParent(testParent); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range requiredV1 {
			os.Remove(filepath.Join(h.Own[c], testParent))
		}
	})
	for _, c := range requiredV1 {
		if _, err := os.Stat(filepath.Join(h.Own[c], testParent, "cgroup.procs")); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
	if after := readT(t, "/proc/self/cgroup"); after != before {
		t.Errorf("v1 PrepareParent moved the process:\n%s\n→\n%s", before, after)
	}
}

func TestSwapAccounting(t *testing.T) {
	if !(&Hierarchy{Mode: Unified, Own: Paths{"": t.TempDir()}}).SwapAccounting() {
		t.Error("v2: memory.swap.max is always there; want true")
	}
	mem := t.TempDir()
	for _, mode := range []Mode{Legacy, Hybrid} {
		h := &Hierarchy{Mode: mode, Own: Paths{"memory": mem, "": t.TempDir()}}
		if h.SwapAccounting() {
			t.Errorf("%v without memory.memsw.*: want false", mode)
		}
	}
	writeT(t, filepath.Join(mem, "memory.memsw.limit_in_bytes"), "9223372036854771712\n")
	for _, mode := range []Mode{Legacy, Hybrid} {
		if !(&Hierarchy{Mode: mode, Own: Paths{"memory": mem}}).SwapAccounting() {
			t.Errorf("%v with memory.memsw.*: want true", mode)
		}
	}
	if (&Hierarchy{Mode: Legacy, Own: Paths{"cpu": mem}}).SwapAccounting() {
		t.Error("v1 without a memory hierarchy: want false")
	}
	// On this host: the same answer as the root memory cgroup's files give.
	if h, err := Host(); err == nil && !h.Mode.V2() {
		_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
		if got, want := h.SwapAccounting(), err == nil; got != want {
			t.Errorf("host: SwapAccounting() = %v, the root memory cgroup says %v", got, want)
		}
	}
}
