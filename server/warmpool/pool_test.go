package warmpool_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/warmpool"
	"github.com/sandboxd/sandboxd/server/workspace"
)

func TestMain(m *testing.M) { os.Exit(nsjailtest.RunAndCheck(m)) }

var poolQuietLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func newPoolRunner(t testing.TB) *nsjail.Runner {
	t.Helper()
	return nsjailtest.NewRunner(t, nsjail.Options{
		StateRoot:    nsjailtest.StateRoot,
		CgroupParent: nsjailtest.CgroupParent,
		Logger:       poolQuietLog,
	})
}

// poolTemplate is the template the server builds for the dynamic policy
// of the default config: the production one, so that what these tests show
// holds for the sandboxes the server keeps.
func poolTemplate(rootfs string) warmpool.Template {
	cfg := config.Default()
	return server.PoliciesFromConfig(cfg)[server.TypeDynamic].Template(cfg, rootfs)
}

// poolConfig is the pool the server keeps with the default config, of size
// ready sandboxes and workspaces under workRoot (on a tmpfs of
// workspaceBytes when > 0); its sandboxes are template forks when
// EXECUTION_POOL_TEMPLATE_FORKS says so (nsjailtest.TemplateForks; a test
// that compares the two sets Forks itself).
func poolConfig(t testing.TB, size int, workRoot string, workspaceBytes int64) warmpool.Config {
	t.Helper()
	cfg := config.Default()
	return warmpool.Config{Size: size, MaxIdle: time.Duration(cfg.PoolMaxIdle), Preload: cfg.PoolPreload,
		WorkRoot: workRoot, WorkspaceBytes: workspaceBytes, WorkspaceInodes: cfg.WorkspaceInodes,
		Forks: nsjailtest.TemplateForks(t, cfg.PoolTemplateForks)}
}

// testRequest is what every pool test's workspace holds: code as
// code/main.py, and a CSV as input/data.csv.
func testRequest(code string) workspace.Request {
	return workspace.Request{Code: code, Files: []workspace.File{{Path: "data.csv", Data: []byte("k,v\na,1\nb,2\na,3\n")}}}
}

// poolWorkspace makes a workspace like the server does (workspace.Write:
// code/main.py, input/, output/artifacts/, owned by the sandbox user); on
// a tmpfs of tmpfsBytes when that is > 0 (as the server's are).
func poolWorkspace(t *testing.T, r *nsjail.Runner, code string, tmpfsBytes ...int64) string {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	o := workspace.Options{UID: r.HostUID(), GID: r.HostGID()}
	if len(tmpfsBytes) > 0 && tmpfsBytes[0] > 0 {
		o.Bytes, o.Inodes = tmpfsBytes[0], config.Default().WorkspaceInodes
		if err := workspace.Mount(ws, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := workspace.Remove(ws); err != nil {
				t.Error(err)
			}
		})
	}
	if err := workspace.Write(ws, o, testRequest(code)); err != nil {
		t.Fatal(err)
	}
	return ws
}

// runPooled runs code as the server does (server/execute.go, Server.run):
// unless ctx has ended, in a sandbox claimed from pool, the request
// (testRequest) written straight into its workspace, when the pool has one
// for spec; else, and when the claimed sandbox is found dead at its
// hand-off, cold in a workspace of its own (a tmpfs, as the server's,
// under os.TempDir). Unlike the server, it fails when the write into a
// claimed workspace does (no test's sandbox should make it fail).
// spec.Workspace is not looked at. outputs is the workspace that ran,
// which the caller removes (workspace.Remove); the error is non-nil only
// when nothing ran. It fails no test itself: callable from any goroutine.
func runPooled(ctx context.Context, pool *warmpool.Pool, r *nsjail.Runner, spec nsjail.Spec, code string) (*nsjail.Result, string, error) {
	o := workspace.Options{Bytes: 64 << 20, Inodes: config.Default().WorkspaceInodes, UID: r.HostUID(), GID: r.HostGID()}
	var c *warmpool.Claim
	if ctx.Err() == nil { // as the server: a request that has ended takes no warm sandbox
		c = pool.Claim(ctx, spec, code)
	}
	if c != nil {
		if err := workspace.Write(c.Workspace(), o, testRequest(code)); err != nil {
			c.Release()
			return nil, "", fmt.Errorf("write into the claimed sandbox's workspace: %w", err)
		}
		res, delivered, err := c.Run(ctx, spec)
		if err != nil {
			return nil, "", err
		}
		if delivered {
			return res, c.Workspace(), nil
		}
	}
	ws, err := workspace.Create(os.TempDir(), "pooltest", o, testRequest(code))
	if err != nil {
		return nil, "", err
	}
	spec.Workspace = ws.Dir
	res, err := r.Run(ctx, spec)
	if err != nil {
		ws.Remove()
		return nil, "", err
	}
	return res, ws.Dir, nil
}

func waitReady(t *testing.T, p *warmpool.Pool, n uint64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for p.Ready() < n {
		if time.Now().After(deadline) {
			t.Fatalf("pool not ready: %+v", p.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := p.Stats(); st.Ready < n {
		t.Fatalf("Ready said %d ready, Stats %+v", n, st)
	}
}

// conformanceScripts run cold and warm; every field must match.
var conformanceScripts = map[string]string{
	"print": `print(1)`,
	"main guard and file": `import sys, os
if __name__ == "__main__":
    print(__name__, __file__, sys.argv, os.getcwd(), sys.path[0], os.nice(0))`,
	"sys.exit code":   `import sys; print("bye"); sys.exit(7)`,
	"sys.exit string": `import sys; sys.exit("fatal: bad input")`,
	"raise": `def f():
    raise ValueError("boom")
f()`,
	"syntax error": "def broken(:\n    pass\n",
	"stdin":        `import sys; print(repr(sys.stdin.read()))`,
	"threads": `import threading
out = []
ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sorted(out))`,
	"fork": `import os
pid = os.fork()
if pid == 0:
    os._exit(3)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))`,
	"subprocess": `import subprocess; print(subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())`,
	"multiprocessing": `import multiprocessing as mp
def sq(x): return x * x
if __name__ == "__main__":
    with mp.get_context("spawn").Pool(2) as p:
        print(p.map(sq, range(5)))
    with mp.get_context("fork").Pool(2) as p:
        print(p.map(sq, range(5)))`,
	"large output": `import sys
for i in range(200000): sys.stdout.write("line %d\n" % i)`,
	"pandas and result": `import json, pandas as pd
df = pd.read_csv("/workspace/input/data.csv")
g = df.groupby("k")["v"].sum().to_dict()
json.dump({"sums": g}, open("/workspace/output/result.json", "w"))
print(g)`,
	"matplotlib artifact": `import matplotlib.pyplot as plt
plt.plot([1, 2, 3]); plt.savefig("/workspace/output/artifacts/chart.png", dpi=50)
print("saved")`,
	// What a template's warm-up (template.py _warm_up) must not change.
	"library state": `import matplotlib, matplotlib.pyplot as plt, numpy as np, pandas as pd
print(plt.get_fignums(), plt.figure().number, matplotlib.get_backend(), len(matplotlib.rcParams), matplotlib.rcParams["font.family"])
print(pd.get_option("display.max_rows"), np.get_printoptions()["precision"], np.geterr())`,
	"memory limit": `x = bytearray(2 * 1024 * 1024 * 1024); print(len(x))`,
	"pids limit": `import threading, time
ts = []
try:
    for i in range(500):
        t = threading.Thread(target=time.sleep, args=(2,)); t.start(); ts.append(t)
except RuntimeError as e:
    print("refused:", e)`,
	"timeout": `import time; print("start", flush=True); time.sleep(60)`,
	"unclosed global file": `f = open("/workspace/output/unclosed.txt", "w")
f.write("kept " * 1000)
g = open("/workspace/output/other.txt", "w"); g.write("also kept")`,
	"exit 256 and -1": `import sys; sys.exit(256)`,
	"non-daemon thread outlives main": `import threading, time
def late(): time.sleep(0.3); print("thread done", flush=True)
threading.Thread(target=late).start()
print("main done")`,
	// SECURITY.md cases 15 and 56 on the warm path: the code sees fds 0, 1,
	// 2 and, besides, only files of the image opened read-only, the same
	// ones a cold run has after `import ctypes` (libffi's own .so, where
	// libffi keeps it: numpy, the default preload, imports ctypes), never
	// the pool's pipes. The numbers of those may differ: the zygote's
	// libffi opened its fd while the protocol's fds were open.
	"open fds": "import ctypes\n" + fdViewPy + `print(view)`,
	// The zygote starts with -P; the script's directory still comes first,
	// and a helper module next to the script is imported from there.
	"sys.path and a helper module": `import os, sys
open("/workspace/code/helper.py", "w").write("VALUE = 42\n")
import helper
print(sys.path, helper.VALUE, helper.__file__)`,
	"atexit and unflushed": `import atexit, sys
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("no newline")`,
	// The writable directories as the code finds them: what the image's
	// interpreter start put there (its matplotlib font cache in
	// MPLCONFIGDIR, /tmp/matplotlib), nothing the preload or a template's
	// own start left elsewhere.
	"writable directories": `import os
for top in ("/tmp", "/dev/shm", "/workspace"):
    for root, dirs, files in sorted(os.walk(top)):
        print(root, sorted(dirs), sorted((f, os.stat(os.path.join(root, f)).st_size) for f in files))`,
}

// conformanceStatus pins what each script must end as, so that cold and
// warm cannot agree on being broken.
var conformanceStatus = map[string]nsjail.Status{
	"sys.exit code": nsjail.StatusFailed, "sys.exit string": nsjail.StatusFailed,
	"raise": nsjail.StatusFailed, "syntax error": nsjail.StatusFailed,
	"memory limit": nsjail.StatusOOM, "timeout": nsjail.StatusTimeout,
}

// TestWarmMatchesCold is the pool's conformance suite: each script runs cold
// and warm, and status, exit code, signal, stdout, stderr, limits_hit and
// the files left in output/ must be identical. Its workspaces are tmpfs, as
// the server's (the warm one the claimed sandbox's own, the request written
// straight in: runPooled), its warm sandboxes zygotes and template forks
// (Config.Forks).
func TestWarmMatchesCold(t *testing.T) {
	for _, mode := range []struct {
		name       string
		tmpfsBytes int64
		forks      bool
	}{{"tmpfs", 256 << 20, false}, {"forks", 256 << 20, true}} {
		t.Run(mode.name, func(t *testing.T) {
			if mode.forks {
				requireTemplates(t)
			}
			testWarmMatchesCold(t, mode.tmpfsBytes, mode.forks)
		})
	}
}

func testWarmMatchesCold(t *testing.T, tmpfsBytes int64, forks bool) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	scripts := maps.Clone(conformanceScripts)
	if denied, ok := deniedSyscallsScript(t); ok {
		scripts["denied syscalls"] = denied
	}
	names := slices.Sorted(maps.Keys(scripts))
	cfg := poolConfig(t, 2, t.TempDir(), tmpfsBytes)
	cfg.Forks = forks
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			code := scripts[name]
			spec := func(ws string) nsjail.Spec {
				s := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
					Env: tpl.Env, Cwd: inside.Workspace, Workspace: ws, Limits: tpl.Limits}
				if name == "timeout" {
					s.Limits.Timeout = 2 * time.Second
				}
				return s
			}
			coldWS := poolWorkspace(t, r, code, tmpfsBytes)
			cold, err := r.Run(context.Background(), spec(coldWS))
			if err != nil {
				t.Fatal(err)
			}
			waitReady(t, pool, 1)
			before := pool.Stats().Taken
			warm, warmOut, err := runPooled(context.Background(), pool, r, spec(""), code)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := workspace.Remove(warmOut); err != nil {
					t.Error(err)
				}
			}()
			if pool.Stats().Taken != before+1 {
				t.Fatal("the pool did not serve the warm run")
			}
			want := nsjail.StatusSucceeded
			if st, ok := conformanceStatus[name]; ok {
				want = st
			}
			if cold.Status != want {
				t.Fatalf("cold status %s, want %s (stderr: %.500s)", cold.Status, want, cold.Stderr)
			}
			if name == "pids limit" && !slices.Contains(cold.LimitsHit, nsjail.LimitPids) {
				t.Fatalf("the pids script did not hit the limit: %v %s", cold.LimitsHit, cold.Stdout)
			}
			if name == "denied syscalls" {
				wantDeniedSyscalls(t, string(cold.Stdout))
			}
			compareResults(t, cold, warm)
			compareTrees(t, filepath.Join(coldWS, "output"), filepath.Join(warmOut, "output"))
		})
	}
}

var pidPattern = regexp.MustCompile(`pid \d+|<Thread\(Thread-\d+.*?\)>`)

func compareResults(t *testing.T, cold, warm *nsjail.Result) {
	t.Helper()
	if cold.Status != warm.Status || cold.ExitCode != warm.ExitCode || cold.Signal != warm.Signal {
		t.Errorf("status: cold %s/%d/%q, warm %s/%d/%q", cold.Status, cold.ExitCode, cold.Signal,
			warm.Status, warm.ExitCode, warm.Signal)
	}
	if !slices.Equal(cold.LimitsHit, warm.LimitsHit) {
		t.Errorf("limits_hit: cold %v, warm %v", cold.LimitsHit, warm.LimitsHit)
	}
	if !bytes.Equal(cold.Stdout, warm.Stdout) {
		t.Errorf("stdout differs:\ncold: %.400q\nwarm: %.400q", cold.Stdout, warm.Stdout)
	}
	cs, ws := pidPattern.ReplaceAll(cold.Stderr, nil), pidPattern.ReplaceAll(warm.Stderr, nil)
	if !bytes.Equal(cs, ws) {
		t.Errorf("stderr differs:\ncold: %s\nwarm: %s", cold.Stderr, warm.Stderr)
	}
	if cold.StdoutTruncated != warm.StdoutTruncated || cold.StdoutBytes != warm.StdoutBytes {
		t.Errorf("stdout sizes: cold %d/%v warm %d/%v", cold.StdoutBytes, cold.StdoutTruncated, warm.StdoutBytes, warm.StdoutTruncated)
	}
}

func compareTrees(t *testing.T, a, b string) {
	t.Helper()
	ta, tb := treeFiles(t, a), treeFiles(t, b)
	if len(ta) != len(tb) {
		t.Errorf("output trees differ: cold %v, warm %v", keys(ta), keys(tb))
		return
	}
	for name, da := range ta {
		db, ok := tb[name]
		if !ok {
			t.Errorf("warm output lacks %s", name)
			continue
		}
		// PNGs embed nothing run-specific with Agg, so bytes must match too.
		if !bytes.Equal(da, db) {
			t.Errorf("output %s differs (cold %d bytes, warm %d bytes)", name, len(da), len(db))
		}
	}
}

func treeFiles(t *testing.T, root string) map[string][]byte {
	m := map[string][]byte{}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(p)
		m[strings.TrimPrefix(p, root)] = b
		return nil
	})
	return m
}

func keys(m map[string][]byte) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

// TestPoolRefillsAndNeverReuses checks that each execution gets a sandbox of
// its own and that the pool refills after a take.
func TestPoolRefillsAndNeverReuses(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	pool, err := warmpool.New(r, poolConfig(t, 1, t.TempDir(), 0), []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	seen := map[string]bool{}
	for i := range 3 {
		waitReady(t, pool, 1)
		res, out, err := runPooled(context.Background(), pool, r, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits},
			`import os, socket; open("/tmp/mark", "x").write("x"); print(socket.gethostname(), os.getpid(), os.path.exists("/workspace/output/prev"))`)
		if err == nil {
			defer workspace.Remove(out)
		}
		if err != nil || res.Status != nsjail.StatusSucceeded {
			t.Fatalf("run %d: %v %+v %s", i, err, res, res.Stderr)
		}
		if seen[res.ID] {
			t.Fatalf("sandbox %s served twice", res.ID)
		}
		seen[res.ID] = true
	}
	if st := pool.Stats(); st.Taken != 3 || st.RefillFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The pool makes its warm sandboxes ready at the background CPU weight,
// and an execution runs at the foreground one (issue 17, M4: a refill
// takes little CPU from executions that want it). Zygotes: each warm
// sandbox's own cgroup, raised at the hand-off. Forks: tpl-<id>, which
// holds the template and every fork's cgroup, and each fork's cgroup
// inside it, both raised while the fork serves its execution; tpl-<id> is
// back at the background weight once the execution has ended.
func TestPoolRefillsInTheBackground(t *testing.T) {
	for _, forks := range []bool{false, true} {
		t.Run(map[bool]string{false: "zygotes", true: "forks"}[forks], func(t *testing.T) {
			testPoolRefillsInTheBackground(t, forks)
		})
	}
}

func testPoolRefillsInTheBackground(t *testing.T, forks bool) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	cfg := poolConfig(t, 1, t.TempDir(), 0)
	cfg.Forks = forks
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	weights := func() map[string]bool { return cgroupWeights(t) }
	waitReady(t, pool, 1)
	ready := weights()
	if tpls, sbs := foreground(ready); len(tpls)+len(sbs) > 0 || len(ready) == 0 {
		t.Fatalf("a full pool, nothing running: the cgroups' weights (true: background) %v", ready)
	}

	ran := make(chan error, 1)
	go func() {
		res, out, err := runPooled(context.Background(), pool, r, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits}, `import time; time.sleep(3)`)
		if err == nil {
			workspace.Remove(out)
		}
		if err == nil && res.Status != nsjail.StatusSucceeded {
			err = fmt.Errorf("%s: %s", res.Status, res.Stderr)
		}
		ran <- err
	}()
	var seen map[string]bool
	for running := true; running; {
		select {
		case err := <-ran:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		case <-time.After(20 * time.Millisecond):
		}
		w := weights()
		tpls, sbs := foreground(w)
		if len(sbs) == 1 && len(tpls) == map[bool]int{false: 0, true: 1}[forks] &&
			(!forks || filepath.Dir(sbs[0]) == tpls[0]) {
			seen = w
		}
	}
	if seen == nil {
		t.Fatal("never saw the execution's sandbox alone at the foreground weight (and, forks, its template)")
	}
	t.Logf("while the execution ran (true: background): %v", seen)
	if st := pool.Stats(); st.Taken != 1 {
		t.Fatalf("the execution ran cold: %+v", st)
	}
	if forks {
		// The fork's shell is destroyed off the result's path: its
		// template's foreground weight goes with it.
		waitTemplatesInTheBackground(t, "after its fork's execution ended")
	}
}

// cgroupWeights reads the CPU weight of every sandbox's cgroup under the
// test runner's cgroup parent, every template's (tpl-<id>) and each
// template's forks' (not T's own leaf on v2, nor a shell's init's), by
// path relative to the parent; true is the background weight. A cgroup
// removed meanwhile is left out.
func cgroupWeights(t testing.TB) map[string]bool {
	t.Helper()
	h, err := cgroup.Host()
	if err != nil {
		t.Fatal(err)
	}
	parents, err := h.ParentDirs(nsjailtest.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	parent, v2 := parents.V2()
	if !v2 {
		parent = parents["cpu"]
	}
	out := map[string]bool{}
	var walk func(rel string)
	walk = func(rel string) {
		entries, err := os.ReadDir(filepath.Join(parent, rel))
		if err != nil {
			return // removed meanwhile
		}
		for _, e := range entries {
			name := filepath.Join(rel, e.Name())
			if !e.IsDir() || e.Name() == "template" || strings.HasSuffix(e.Name(), "-init") {
				continue
			}
			paths := cgroup.Paths{"cpu": filepath.Join(parent, name)}
			if v2 {
				paths = cgroup.Paths{"": filepath.Join(parent, name)}
			}
			_, bg, err := nsjailtest.ReadCPUWeight(paths)
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV) {
				continue // removed meanwhile
			}
			if err != nil {
				t.Fatal(err)
			}
			out[name] = bg
			if rel == "" && strings.HasPrefix(e.Name(), "tpl-") {
				walk(name)
			}
		}
	}
	walk("")
	return out
}

// foreground lists the cgroups of w (cgroupWeights) at the foreground
// weight: the templates' and the sandboxes', apart.
func foreground(w map[string]bool) (tpls, sandboxes []string) {
	for name, bg := range w {
		switch {
		case bg:
		case filepath.Dir(name) == "." && strings.HasPrefix(name, "tpl-"):
			tpls = append(tpls, name)
		default:
			sandboxes = append(sandboxes, name)
		}
	}
	return tpls, sandboxes
}

// waitTemplatesInTheBackground waits until no template's cgroup has the
// foreground weight (within 30 s), failing the test with when otherwise.
func waitTemplatesInTheBackground(t testing.TB, when string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w := cgroupWeights(t)
		if tpls, _ := foreground(w); len(tpls) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a template keeps the foreground weight %s: %v", when, w)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkWarmPrint measures a warm execution of print(1) through the pool,
// from the claim to the Result (the request written into the claimed
// sandbox's workspace, hand-off, run, exit, collection), with the pool
// refilling in the background as in production.
func BenchmarkWarmPrint(b *testing.B) {
	benchPool(b, `print(1)`, 2, 0)
}

// BenchmarkWarmPrintTmpfs is BenchmarkWarmPrint with the warm workspaces on
// their own tmpfs, as the server runs them.
func BenchmarkWarmPrintTmpfs(b *testing.B) {
	benchPool(b, `print(1)`, 2, 64<<20)
}

// BenchmarkForkPrintTmpfs is BenchmarkWarmPrintTmpfs with template forks
// as the warm sandboxes (Config.Forks; TEMPLATE.md M5).
func BenchmarkForkPrintTmpfs(b *testing.B) {
	requireTemplates(b)
	benchPool(b, `print(1)`, 2, 64<<20, true)
}

// BenchmarkColdPrint is the same execution on the cold path.
func BenchmarkColdPrint(b *testing.B) {
	benchPool(b, `print(1)`, 0, 0)
}

// BenchmarkWarmReadyCPU is the CPU it takes to make one warm sandbox ready
// (TEMPLATE.md M1), a zygote that imports the preload ("import") or a
// template fork ("fork"): a pool of b.N+1 fills, and the CPU spent between
// its first ready sandbox and its last is divided by b.N (a template's own
// import comes before the first). Reported apart: the sandboxes' cgroups
// (every sandbox, template and shell, nested under the test's parent; the
// runc inits' stages after they joined them), the worker process itself,
// and its reaped children (the runc inits, whose CPU in their cgroups is
// counted twice when the two are summed).
func BenchmarkWarmReadyCPU(b *testing.B) {
	for _, forks := range []bool{false, true} {
		b.Run(map[bool]string{false: "import", true: "fork"}[forks], func(b *testing.B) {
			if forks {
				requireTemplates(b)
			}
			benchReadyCPU(b, forks)
		})
	}
}

func benchReadyCPU(b *testing.B, forks bool) {
	rootfs := nsjailtest.RuntimeRootfs(b)
	r := newPoolRunner(b)
	tpl := poolTemplate(rootfs)
	take := cpuSampler(b)
	n := min(b.N, 50) // a pool of n+1: each iteration is one sandbox made ready
	cfg := poolConfig(b, n+1, b.TempDir(), 64<<20)
	cfg.Forks = forks
	b.ResetTimer()
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	wait := func(k uint64) {
		deadline := time.Now().Add(10 * time.Minute)
		// Ready, not Stats, which reads every ready sandbox's cgroup:
		// the worker's CPU is then the pool's.
		for pool.Ready() < k {
			if time.Now().After(deadline) {
				b.Fatalf("pool not ready: %+v", pool.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait(1)
	first, start := take(), time.Now()
	wait(uint64(n + 1))
	last, wall := take(), time.Since(start)
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(per(last.cgroup-first.cgroup), "sandbox-cpu-ms/ready")
	b.ReportMetric(per(last.self-first.self), "worker-cpu-ms/ready")
	b.ReportMetric(per(last.children-first.children), "children-cpu-ms/ready")
	b.ReportMetric(per(wall), "wall-ms/ready")
	if st := pool.Stats(); st.RefillFailures != 0 {
		b.Fatalf("refill failures: %+v", st)
	}
}

// pandasStep is an Agent's typical step, in the shape of tools/bench's
// pandas workload: a 100k-row frame grouped, one matplotlib chart saved as
// a PNG.
const pandasStep = `import numpy as np, pandas as pd, matplotlib.pyplot as plt
rng = np.random.default_rng(0)
df = pd.DataFrame({"key": rng.integers(0, 100, 100_000), "x": rng.random(100_000)})
g = df.groupby("key").agg(x_mean=("x", "mean"), rows=("x", "size"))
fig, ax = plt.subplots(figsize=(4, 3), dpi=80)
ax.bar(g.index, g["x_mean"])
fig.savefig("/workspace/output/artifacts/groupby.png")
print(len(g))
`

// BenchmarkExecCPU is the CPU one execution costs the host, the pool's
// refill of the sandbox it took included (TEMPLATE.md M3: on a saturated
// 2-core host, throughput is at most 2 s of CPU per second over this):
// print(1) and pandasStep, cold, on a zygote that imported the preload
// ("import") and on a template fork ("fork"). Executions run one at a
// time, each once the pool is full again. Reported as in
// BenchmarkWarmReadyCPU: the sandboxes' cgroups (the code, the zygotes or
// the template and its forks, the runc inits after they joined them), the
// worker process, its reaped children (the runc inits, partly counted in
// the cgroups too).
func BenchmarkExecCPU(b *testing.B) {
	for _, w := range []struct{ name, code string }{{"print", `print(1)`}, {"pandas", pandasStep}} {
		for _, mode := range []string{"cold", "import", "fork"} {
			b.Run(w.name+"/"+mode, func(b *testing.B) {
				benchExecCPU(b, w.code, mode)
			})
		}
	}
}

func benchExecCPU(b *testing.B, code, mode string) {
	rootfs := nsjailtest.RuntimeRootfs(b)
	r := newPoolRunner(b)
	tpl := poolTemplate(rootfs)
	take := cpuSampler(b)
	size := 1
	if mode == "cold" {
		size = 0
	}
	cfg := poolConfig(b, size, b.TempDir(), 64<<20)
	cfg.Forks = mode == "fork"
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	full := func() {
		deadline := time.Now().Add(10 * time.Minute)
		for pool.Ready() < uint64(size) {
			if time.Now().After(deadline) {
				b.Fatalf("pool not ready: %+v", pool.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	full()
	var sum cpuSample
	n := 0
	for b.Loop() {
		before := take()
		res, out, err := runPooled(context.Background(), pool, r, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits}, code)
		if err != nil {
			b.Fatal(err)
		}
		workspace.Remove(out)
		if res.Status != nsjail.StatusSucceeded {
			b.Fatalf("%+v %s", res, res.Stderr)
		}
		r.WaitForCleanup()
		full()
		sum = sum.add(take().sub(before))
		n++
	}
	if st := pool.Stats(); mode != "cold" && st.Taken != uint64(n) {
		b.Fatalf("%d of %d executions were warm: %+v", st.Taken, n, st)
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(per(sum.cgroup), "sandbox-cpu-ms/exec")
	b.ReportMetric(per(sum.self), "worker-cpu-ms/exec")
	b.ReportMetric(per(sum.children), "children-cpu-ms/exec")
}

// cpuSample is the CPU of the sandboxes' cgroups (everything nested under
// the tests' cgroup parent), of the test process and of its reaped
// children.
type cpuSample struct{ cgroup, self, children time.Duration }

func (a cpuSample) add(d cpuSample) cpuSample {
	return cpuSample{a.cgroup + d.cgroup, a.self + d.self, a.children + d.children}
}

func (a cpuSample) sub(d cpuSample) cpuSample {
	return cpuSample{a.cgroup - d.cgroup, a.self - d.self, a.children - d.children}
}

// cpuSampler returns a function that reads a cpuSample now.
func cpuSampler(b *testing.B) func() cpuSample {
	dirs, err := nsjailtest.ParentCgroupDirs(nsjailtest.CgroupParent)
	if err != nil {
		b.Fatal(err)
	}
	paths := cgroup.Paths{}
	for _, d := range dirs {
		if strings.Contains(d, "cpuacct") {
			paths["cpuacct"] = d
		} else if cgroup.DetectMode().V2() {
			paths[""] = d
		}
	}
	return func() cpuSample {
		st, err := cgroup.ReadStats(paths)
		cg := st.CPUUsageNS
		if err != nil {
			b.Fatal(err)
		}
		var self, kids unix.Rusage
		_ = unix.Getrusage(unix.RUSAGE_SELF, &self)
		_ = unix.Getrusage(unix.RUSAGE_CHILDREN, &kids)
		cpu := func(u unix.Rusage) time.Duration {
			return time.Duration(u.Utime.Nano() + u.Stime.Nano())
		}
		return cpuSample{time.Duration(cg), cpu(self), cpu(kids)}
	}
}

func benchPool(b *testing.B, code string, size int, workspaceBytes int64, forks ...bool) {
	rootfs := nsjailtest.RuntimeRootfs(b)
	r := newPoolRunner(b)
	tpl := poolTemplate(rootfs)
	cfg := poolConfig(b, size, b.TempDir(), workspaceBytes)
	cfg.Forks = len(forks) > 0 && forks[0]
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var lat []time.Duration
	for b.Loop() {
		b.StopTimer()
		if size > 0 {
			deadline := time.Now().Add(time.Minute)
			// Measure a worker that is not saturated: the refill of the
			// previous take (an import of the data stack) is done.
			for pool.Ready() < uint64(size) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		}
		b.StartTimer()
		start := time.Now()
		res, out, err := runPooled(context.Background(), pool, r, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits}, code)
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		workspace.Remove(out)
		if res.Status != nsjail.StatusSucceeded {
			b.Fatalf("%+v", res)
		}
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// TestTemplateRotation: with Config.TemplateMaxForks, a template serves at
// most that many forks before a new one replaces it (SECURITY.md case 64:
// what forks share with their template, the str hash secret among it, is
// bounded so); the old one ends only once its forks have (an execution
// that runs through two rotations succeeds), and Close leaves no template
// behind (RunAndCheck).
func TestTemplateRotation(t *testing.T) {
	requireTemplates(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	cfg := poolConfig(t, 2, t.TempDir(), 64<<20)
	cfg.Forks, cfg.TemplateMaxForks = true, 2
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	run := func(code string) *nsjail.Result {
		waitReady(t, pool, 1)
		res, out, err := runPooled(context.Background(), pool, r, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits}, code)
		if err != nil {
			t.Errorf("%q: %v", code, err)
			return &nsjail.Result{}
		}
		defer workspace.Remove(out)
		if res.Status != nsjail.StatusSucceeded {
			t.Errorf("%q: %+v", code, res)
			return &nsjail.Result{}
		}
		return res
	}
	// The first template's first fork runs through two rotations: a
	// template is stopped only once its forks have ended.
	waitReady(t, pool, 2)
	busy := make(chan *nsjail.Result, 1)
	go func() { busy <- run("import time; time.sleep(5); print(hash(\"sandboxd\"))") }()
	for pool.Stats().Ready != 1 { // taken by the busy one
		time.Sleep(time.Millisecond)
	}
	seen := map[string]int{}
	for range 5 {
		seen[strings.TrimSpace(string(run(`print(hash("sandboxd"))`).Stdout))]++
	}
	seen[strings.TrimSpace(string((<-busy).Stdout))]++
	// Each rotation's successor was started ahead (rotatesSoon: a tenth of
	// the share, at least one fork, before it), so that it imported the
	// preload while the old one still forked.
	if st := pool.Stats(); st.Taken != 6 || st.RefillFailures != 0 || st.TemplatesStarted < 3 || st.TemplateForks < 6 || st.Templates < 1 ||
		st.TemplatesAhead < st.TemplatesStarted-1 {
		t.Fatalf("stats %+v", st)
	}
	// Each template's forks share its hash secret: 6 executions of
	// templates of 2 forks each are 3 or more secrets, none seen thrice.
	if len(seen) < 3 {
		t.Errorf("hash secrets seen: %v, want one per template of at most 2 forks", seen)
	}
	pool.Close()
	if st := pool.Stats(); st.Templates != 0 {
		t.Errorf("%d templates running after Close", st.Templates)
	}
	for h, n := range seen {
		if n > 2 {
			t.Errorf("hash secret %s served %d executions, more than a template's 2 forks", h, n)
		}
	}
}

// TestTemplateSharedByPolicies: with forks, the policies of one runtime
// (the server's dynamic and skill, which differ in their limits) fork
// from one template process, whose pages all their warm sandboxes share
// (TEMPLATE.md section 12, M2), and each fork still runs under its own
// policy's limits, which its shell sets: 250 MiB is an OOM under a
// 160 MiB limit and fits in 400 MiB.
func TestTemplateSharedByPolicies(t *testing.T) {
	requireTemplates(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	cfg := config.Default()
	policies := server.PoliciesFromConfig(cfg)
	small := policies[server.TypeDynamic].Template(cfg, rootfs)
	large := policies[server.TypeSkill].Template(cfg, rootfs)
	small.Name, large.Name = "small", "large"
	small.Limits.MemoryBytes, large.Limits.MemoryBytes = 160<<20, 400<<20
	// Their environments agree when their CPUs round up to the same
	// thread count (server.Policy.BaseEnv), as the defaults do: made so
	// here whatever the defaults (server's TestPoolThroughAPI checks
	// theirs).
	large.Env = slices.Clone(small.Env)
	pcfg := poolConfig(t, 1, t.TempDir(), 64<<20)
	pcfg.Forks = true
	pool, err := warmpool.New(r, pcfg, []warmpool.Template{small, large}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	waitReady(t, pool, 2)
	if st := pool.Stats(); st.Templates != 1 || st.TemplatesStarted != 1 || st.TemplateForks != 2 {
		t.Fatalf("two policies of one runtime: want one template that made both forks, stats %+v", st)
	}
	run := func(tpl warmpool.Template, code string) *nsjail.Result {
		res, out, err := runPooled(context.Background(), pool, r, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits}, code)
		if err != nil {
			t.Fatal(err)
		}
		workspace.Remove(out)
		return res
	}
	const hog = "b = b'x' * (250 << 20)\nprint('allocated')\n"
	if res := run(small, hog); res.Status != nsjail.StatusOOM {
		t.Errorf("250 MiB under a 160 MiB limit: %s (exit %d), want oom; stdout %q stderr %q", res.Status, res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := run(large, hog); res.Status != nsjail.StatusSucceeded || string(res.Stdout) != "allocated\n" {
		t.Errorf("250 MiB under a 400 MiB limit: %s (exit %d), want succeeded; stdout %q stderr %q", res.Status, res.ExitCode, res.Stdout, res.Stderr)
	}
	if st := pool.Stats(); st.Taken != 2 || st.TakenBy["small"] != 1 || st.TakenBy["large"] != 1 || st.FallbackDead != 0 {
		t.Errorf("both executions warm, one per policy: stats %+v", st)
	}
}

// A Claim is the server's warm path: the request is written straight into
// the claimed sandbox's workspace (no workspace of its own, no copy), the
// code finds it there as in a cold run, and what it leaves stays there for
// the caller. A claim given up (Release) retires its sandbox, removes its
// workspace and is counted once (FallbackWrite), and the pool refills; a
// claim runs once; a spec no warm
// sandbox can run gets no claim.
func TestClaimWritesStraightIntoTheWarmWorkspace(t *testing.T) {
	rootfs, r, tpl, pool := numpyPool(t)
	defer pool.Close()
	spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/" + inside.CodeFile},
		Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits}
	spec.Limits.Timeout = 30 * time.Second
	o := workspace.Options{UID: r.HostUID(), GID: r.HostGID()}
	ctx := context.Background()

	waitReady(t, pool, 1)
	odd := spec
	odd.Hostname = "elsewhere"
	if c := pool.Claim(ctx, odd, ""); c != nil {
		t.Fatal("a claim for a spec with a hostname of its own, which no warm sandbox runs")
	}
	c := pool.Claim(ctx, spec, "")
	if c == nil {
		t.Fatal("no claim on a pool with a ready sandbox")
	}
	released := c.Workspace()
	c.Release()
	c.Release() // once
	waitGone(t, released)
	if st := pool.Stats(); st.FallbackWrite != 1 || st.Taken != 0 {
		t.Fatalf("a released claim: stats %+v, want it counted once in FallbackWrite, not taken", st)
	}

	waitReady(t, pool, 1)
	before := pool.Stats()
	c = pool.Claim(ctx, spec, "")
	if c == nil {
		t.Fatal("no claim after the refill")
	}
	code := "import json, os\n" +
		"print(json.load(open(" + strconv.Quote(inside.RequestFile) + "))['x'], open('input/a/b.txt').read())\n" +
		"open(" + strconv.Quote(inside.OutputDir+"/left.txt") + ", 'w').write('left')\n"
	err := workspace.Write(c.Workspace(), o, workspace.Request{Code: code, Input: []byte(`{"x": 42}`),
		Files: []workspace.File{{Path: "a/b.txt", Data: []byte("data")}}})
	if err != nil {
		t.Fatal(err)
	}
	res, delivered, err := c.Run(ctx, spec)
	if err != nil || !delivered {
		t.Fatalf("delivered %v, error %v", delivered, err)
	}
	defer workspace.Remove(c.Workspace())
	if res.Status != nsjail.StatusSucceeded || string(res.Stdout) != "42 data\n" {
		t.Fatalf("status %s stdout %q stderr %.500s error %s", res.Status, res.Stdout, res.Stderr, res.Error)
	}
	if b, err := os.ReadFile(filepath.Join(c.Workspace(), inside.OutputDir, "left.txt")); err != nil || string(b) != "left" {
		t.Fatalf("what the code left: %q, %v", b, err)
	}
	if _, _, err := c.Run(ctx, spec); err == nil {
		t.Fatal("a claim ran twice")
	}
	if after := pool.Stats(); after.Taken != before.Taken+1 || after.FallbackDead != before.FallbackDead {
		t.Fatalf("taken %d→%d, dead fallbacks %d→%d", before.Taken, after.Taken, before.FallbackDead, after.FallbackDead)
	}
}
