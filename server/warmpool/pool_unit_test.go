package warmpool

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/runner"
)

// Fast tests of the pool's pure logic; no root, no sandbox.

func TestMatchesTemplate(t *testing.T) {
	job := runner.Job{Path: "/workspace/code/main.py", Cwd: "/workspace", Display: true}
	tpl := Template{Rootfs: "/r", Env: []string{"PATH=/bin", "LANG=C.UTF-8"},
		Limits: nsjail.Limits{MemoryBytes: 1 << 30, Pids: 64, Timeout: 30 * time.Second}}
	spec := func(mod func(*nsjail.Spec)) *nsjail.Spec {
		s := &nsjail.Spec{Rootfs: "/r", Args: []string{"python3", "/workspace/code/main.py"}, Workspace: "/w",
			Env: []string{"LANG=C.UTF-8", "PATH=/bin"}, Limits: tpl.Limits}
		if mod != nil {
			mod(s)
		}
		return s
	}
	for _, tc := range []struct {
		name       string
		spec       *nsjail.Spec
		shape, env bool
	}{
		{"the template's own", spec(nil), true, true},
		{"another timeout", spec(func(s *nsjail.Spec) { s.Limits.Timeout = time.Second }), true, true},
		{"an extra variable", spec(func(s *nsjail.Spec) { s.Env = append(s.Env, "TZ=UTC") }), true, false},
		{"a base variable changed", spec(func(s *nsjail.Spec) { s.Env = []string{"LANG=C", "PATH=/bin"} }), true, false},
		{"a base variable missing", spec(func(s *nsjail.Spec) { s.Env = []string{"PATH=/bin"} }), true, false},
		{"another rootfs", spec(func(s *nsjail.Spec) { s.Rootfs = "/other" }), false, false},
		{"another memory limit", spec(func(s *nsjail.Spec) { s.Limits.MemoryBytes = 1 << 20 }), false, false},
		{"a hostname", spec(func(s *nsjail.Spec) { s.Hostname = "h" }), false, false},
		{"python", spec(func(s *nsjail.Spec) { s.Args[0] = "python" }), true, true},
		{"another command", spec(func(s *nsjail.Spec) { s.Args[0] = "sh" }), false, false},
		{"an argument more", spec(func(s *nsjail.Spec) { s.Args = append(s.Args, "-v") }), false, false},
		{"no workspace", spec(func(s *nsjail.Spec) { s.Workspace = "" }), false, false},
		{"stdin", spec(func(s *nsjail.Spec) { s.Stdin = strings.NewReader("") }), false, false},
		{"a file beside", spec(func(s *nsjail.Spec) { s.ExtraFiles = []*os.File{os.Stdin} }), false, false},
		{"the runner", spec(func(s *nsjail.Spec) { s.Args = runner.Args("python3", job) }), true, true},
		{"the runner and its events", spec(func(s *nsjail.Spec) {
			j := job
			j.EventsFD = runner.EventsFD
			s.Args, s.ExtraFiles = runner.Args("python3", j), []*os.File{os.Stdin}
		}), true, true},
		{"the runner without its events fd", spec(func(s *nsjail.Spec) {
			j := job
			j.EventsFD = runner.EventsFD
			s.Args = runner.Args("python3", j)
		}), false, false},
		{"the runner with another fd", spec(func(s *nsjail.Spec) {
			j := job
			j.EventsFD = 4
			s.Args, s.ExtraFiles = runner.Args("python3", j), []*os.File{os.Stdin}
		}), false, false},
		{"other code", spec(func(s *nsjail.Spec) { s.Args = runner.Args("python3", job); s.Args[3] = "print(1)" }), false, false},
	} {
		if shape, env := tpl.Matches(tc.spec); shape != tc.shape || env != tc.env {
			t.Errorf("%s: matches = %v %v, want %v %v", tc.name, shape, env, tc.shape, tc.env)
		}
	}
}

func TestReadExitReport(t *testing.T) {
	for _, tc := range []struct {
		name, written string
		want          syscall.WaitStatus
		ok            bool
	}{
		{"exit 0", "0\n", 0, true},
		{"exit 7", "1792\n", 7 << 8, true},
		{"SIGKILL", "9\n", syscall.WaitStatus(syscall.SIGKILL), true},
		{"no newline", "0", 0, false},
		{"garbage", "zero\n", 0, false},
		{"out of range", "65536\n", 0, false},
		{"negative", "-1\n", 0, false},
		{"nothing", "", 0, false},
	} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		ch := readExitReport(r)
		w.WriteString(tc.written)
		w.Close()
		got, ok := <-ch
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: report %#x %v, want %#x %v", tc.name, int(got), ok, int(tc.want), tc.ok)
		}
	}
}

// New defaults nothing (the server passes its config's values) and rejects
// only what cannot work: a negative size, and for an enabled pool a missing
// work root, a max idle of 0 (nothing would ever retire) or a workspace
// tmpfs with unlimited inodes.
func TestNewRejectsUnusableConfig(t *testing.T) {
	ok := Config{Size: 1, MaxIdle: time.Minute, WorkRoot: t.TempDir(), WorkspaceBytes: 1 << 20, WorkspaceInodes: 100}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"negative size", func(c *Config) { c.Size = -1 }, "pool size must be >= 0"},
		{"no work root", func(c *Config) { c.WorkRoot = "" }, "pool work root is required"},
		{"no max idle", func(c *Config) { c.MaxIdle = 0 }, "pool max idle must be > 0"},
		{"unlimited inodes", func(c *Config) { c.WorkspaceInodes = 0 }, "pool workspace inodes must be > 0"},
	} {
		cfg := ok
		tc.mod(&cfg)
		if _, err := New(nil, cfg, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	// A disabled pool needs nothing.
	p, err := New(nil, Config{}, nil, nil)
	if err != nil {
		t.Fatalf("disabled pool: %v", err)
	}
	p.Close()
}

// The hand-off of a runner's job carries its fields; a plain file's is
// the file's.
func TestHandoffOf(t *testing.T) {
	j := runner.Job{Path: "/workspace/code/main.py", Cwd: "/workspace", Display: true, Figures: true, EventsFD: runner.EventsFD}
	h, ok := handoffOf(&nsjail.Spec{Args: runner.Args("python3", j), ExtraFiles: []*os.File{os.Stdin}})
	want := Handoff{Path: j.Path, Argv: []string{j.Path}, Cwd: "/workspace", Display: true, Figures: true, Events: true}
	if !ok || h.Path != want.Path || h.Cwd != want.Cwd || len(h.Argv) != 1 || h.Argv[0] != j.Path || !h.Display || !h.Figures || !h.Events || h.Kernel {
		t.Fatalf("handoffOf(runner job) = %+v, %v; want %+v", h, ok, want)
	}
	h, ok = handoffOf(&nsjail.Spec{Args: []string{"python3", "/x.py"}, Cwd: "/w"})
	if !ok || h.Path != "/x.py" || h.Cwd != "/w" || h.Display || h.Events {
		t.Fatalf("handoffOf(python3 FILE) = %+v, %v", h, ok)
	}
}

// templateKeyOf: Templates that differ only in what a fork's shell sets
// (memory, pids, CPU) or in the timeout share a template process; a
// difference in anything the template's own sandbox has (rootfs,
// environment, rlimits, tmpfs sizes) keeps them apart. Env order does
// not matter (Matches compares it as a set too).
func TestTemplateKey(t *testing.T) {
	base := Template{Name: "dynamic/default", Rootfs: "/r", Env: []string{"PATH=/bin", "LANG=C.UTF-8"}, Size: 2,
		Limits: nsjail.Limits{Timeout: 30 * time.Second, MemoryBytes: 1 << 30, Pids: 128, CPUs: 1, OpenFiles: 1024,
			FileSizeBytes: 1 << 30, TmpBytes: 64 << 20, ShmBytes: 64 << 20, StdoutBytes: 1 << 20, StderrBytes: 1 << 20}}
	for _, c := range []struct {
		name  string
		mod   func(*Template)
		share bool
	}{
		{"another policy's shell limits", func(t *Template) {
			t.Name, t.Size = "skill/default", 1
			t.Limits.Timeout, t.Limits.MemoryBytes, t.Limits.Pids, t.Limits.CPUs = 2*time.Minute, 2<<30, 64, 0.5
		}, true},
		{"env in another order", func(t *Template) { t.Env = []string{"LANG=C.UTF-8", "PATH=/bin"} }, true},
		{"another rootfs", func(t *Template) { t.Rootfs = "/other" }, false},
		{"another env", func(t *Template) { t.Env = []string{"PATH=/bin", "LANG=C"} }, false},
		{"a variable more", func(t *Template) { t.Env = append(t.Env, "TZ=UTC") }, false},
		// One entry that joined with a NUL would read as the two.
		{"an env split differently", func(t *Template) { t.Env = []string{"LANG=C.UTF-8\x00PATH=/bin"} }, false},
		{"other open files", func(t *Template) { t.Limits.OpenFiles = 4096 }, false},
		{"another file size", func(t *Template) { t.Limits.FileSizeBytes = 1 << 20 }, false},
		{"another /tmp", func(t *Template) { t.Limits.TmpBytes = 1 << 20 }, false},
		{"another /dev/shm", func(t *Template) { t.Limits.ShmBytes = 1 << 20 }, false},
		{"another output bound", func(t *Template) { t.Limits.StdoutBytes = 1 << 10 }, false},
		// The process gets one value per name, the last (runc's
		// prepareEnv): the key says what it gets.
		{"a name twice, the last as base's", func(t *Template) { t.Env = []string{"PATH=/bin", "LANG=C", "LANG=C.UTF-8"} }, true},
		{"a name twice, the last another", func(t *Template) { t.Env = []string{"PATH=/bin", "LANG=C.UTF-8", "LANG=C"} }, false},
	} {
		other := base
		other.Env = append([]string(nil), base.Env...)
		c.mod(&other)
		if got := templateKeyOf(other) == templateKeyOf(base); got != c.share {
			t.Errorf("%s: shares the template = %v, want %v", c.name, got, c.share)
		}
	}
}
