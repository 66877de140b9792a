package cgroup

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var record = flag.Bool("record", false, "re-record testdata/cgroup/v1 from a real cgroup (root, cgroup v1)")

// testParent is unique per test binary: other engineers' tests and sandboxd
// itself use sibling parents under the same cgroups on this machine.
var testParent = fmt.Sprintf("sandboxd-cgtest-%d", os.Getpid())

// TestMain fails the run if a real-kernel test left a cgroup behind.
func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if h, err := Host(); err == nil && os.Geteuid() == 0 {
		for _, d := range uniqueDirs(h.Own) {
			if _, err := os.Stat(filepath.Join(d, testParent)); err == nil {
				fmt.Fprintf(os.Stderr, "leftover cgroup %s\n", filepath.Join(d, testParent))
				code = 1
			}
		}
		if h.Mode.V2() {
			if b, err := h.base(); err == nil {
				if _, err := os.Stat(filepath.Join(b, testParent)); err == nil {
					fmt.Fprintf(os.Stderr, "leftover cgroup %s\n", filepath.Join(b, testParent))
					code = 1
				}
			}
		}
	}
	os.Exit(code)
}

// realHost returns the test process's hierarchy, skipping unless root.
func realHost(t testing.TB) *Hierarchy {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates cgroups under the test's own cgroup")
	}
	h, err := Host()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// sandboxCgroup creates <own>/<testParent>/<id> in every hierarchy in which
// libcontainer would create a sandbox's cgroup (v1: all mounted ones, v2: the
// delegated base), removes it (and the parent, when empty) at cleanup, and
// returns the paths the way libcontainer's GetPaths() would.
func sandboxCgroup(t testing.TB, h *Hierarchy, id string) Paths {
	t.Helper()
	if err := h.PrepareParent(testParent); err != nil {
		t.Fatal(err)
	}
	parents, err := h.ParentDirs(testParent)
	if err != nil {
		t.Fatal(err)
	}
	paths := Paths{}
	for c, p := range parents {
		paths[c] = filepath.Join(p, id)
		if err := os.MkdirAll(paths[c], 0o755); err != nil {
			t.Fatal(err)
		}
		if c == "cpuset" {
			// v1 cpusets start empty and refuse tasks until given CPUs and
			// memory nodes; libcontainer copies them down the same way.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v := readT(t, filepath.Join(h.Own[c], f))
				writeT(t, filepath.Join(p, f), v)
				writeT(t, filepath.Join(paths[c], f), v)
			}
		}
	}
	t.Cleanup(func() {
		if err := KillAll(paths); err != nil {
			t.Error(err)
		}
		for _, d := range uniqueDirs(paths) {
			if err := removeTree(d); err != nil {
				t.Error(err)
			}
		}
		for _, p := range uniqueDirs(parents) {
			os.Remove(p) // fails while another test's sandbox is in it
		}
	})
	return paths
}

// startIn starts sh -c script with the shell first joining every dir in
// dirs (a process we start, moved by itself before it does anything), and
// waits until it has joined. Its pid is the process group leader.
func startIn(t testing.TB, dirs []string, script string) *exec.Cmd {
	t.Helper()
	join := ""
	for _, d := range dirs {
		join += fmt.Sprintf("echo $$ > %q/cgroup.procs || exit 97; ", d)
	}
	cmd := exec.Command("sh", "-c", join+"echo joined; "+script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if n, _ := out.Read(buf); !strings.HasPrefix(string(buf[:n]), "joined") {
		cmd.Wait()
		t.Fatalf("process did not join %v: %v", dirs, cmd.ProcessState)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func writeT(t testing.TB, path, value string) {
	t.Helper()
	if err := writeFile(path, value); err != nil {
		t.Fatal(err)
	}
}
