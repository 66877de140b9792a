package rootfs

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// The sandbox starts as "/proc/self/exe init": the nsjail import's init()
// handles that before TestMain. Every test binary gets its own state root and
// cgroup parent so the leftover check sees only what this binary created.
var (
	e2eStateRoot    = nsjailtest.StateRoot
	e2eCgroupParent = nsjailtest.CgroupParent
)

func TestMain(m *testing.M) {
	os.Exit(nsjailtest.RunAndCheck(m))
}

// runtimeRootfs is the unpacked python-runtime: $SANDBOXD_RUNTIME_ROOTFS
// (make test), else the built image unpacked into a cache for this test.
func runtimeRootfs(t *testing.T) string {
	if p := os.Getenv("SANDBOXD_RUNTIME_ROOTFS"); p != "" {
		return nsjailtest.RuntimeRootfs(t)
	}
	ref := nsjailtest.RuntimeImageRef(t)
	// The sandbox's mapped root must be able to reach the rootfs to mount
	// it, and t.TempDir's directories are 0700.
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	c, err := Open(filepath.Join(base, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckReachable(); err != nil {
		t.Fatal(err)
	}
	img, err := c.Unpack(ctx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	return img.RootfsPath
}

const e2eScript = `
import json, logging, os, sys, time
rebuilt = []
class Catch(logging.Handler):
    def emit(self, rec):
        if "fontManager" in rec.getMessage() or "font cache" in rec.getMessage():
            rebuilt.append(rec.getMessage())
logging.getLogger("matplotlib").addHandler(Catch())
logging.getLogger("matplotlib").setLevel(logging.INFO)

t0 = time.perf_counter()
import numpy as np, pandas as pd, scipy, scipy.stats, sklearn, sklearn.linear_model
import matplotlib, matplotlib.pyplot as plt, openpyxl, seaborn as sns, statsmodels.api as sm
t1 = time.perf_counter()

denied = {}
for p in ["/usr/lib/python3/dist-packages/evil.py", "/etc/evil", "/evil", "/usr/bin/python3"]:
    try:
        with open(p, "a"):
            pass
        denied[p] = "WRITABLE"
    except OSError as e:
        denied[p] = e.errno

rng = np.random.default_rng(0)
df = pd.DataFrame({"x": np.arange(50.0)})
df["y"] = 2.0 * df.x + 1.0 + rng.normal(scale=0.1, size=len(df))
ols = sm.OLS(df.y, sm.add_constant(df.x)).fit()
lr = sklearn.linear_model.LinearRegression().fit(df[["x"]], df.y)
r, _ = scipy.stats.pearsonr(df.x, df.y)
fig, ax = plt.subplots(figsize=(4, 3), dpi=50)
sns.scatterplot(data=df, x="x", y="y", ax=ax)
fig.savefig("/workspace/chart.png")
df.head(5).to_excel("/workspace/table.xlsx", index=False, sheet_name="data")
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "import_s": t1 - t0,
    "backend": matplotlib.get_backend(), "ols_slope": float(ols.params["x"]),
    "lr_slope": float(lr.coef_[0]), "pearson": float(r), "denied": denied,
    "font_cache_rebuilt": rebuilt, "cache_dir": sorted(os.listdir(matplotlib.get_cachedir())),
    "versions": {m.__name__: m.__version__ for m in (np, pd, scipy, sklearn, matplotlib, openpyxl, sns, sm)
                 if hasattr(m, "__version__")},
}))
`

// End to end: the unpacked runtime, as uid 10001 on a read-only root in a
// real sandbox, imports the whole data stack and writes a PNG chart and an
// XLSX workbook into the workspace.
func TestPythonRuntimeInSandbox(t *testing.T) {
	nsjailtest.RequireRoot(t)
	if testing.Short() {
		t.Skip("-short: runs the python data stack in a sandbox")
	}
	root := runtimeRootfs(t)
	before := treeStamp(t, root)

	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: e2eStateRoot, CgroupParent: e2eCgroupParent,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ws := t.TempDir()
	if err := os.Chown(ws, r.HostUID(), r.HostGID()); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := r.Run(c, nsjail.Spec{
		Rootfs:    root,
		Args:      []string{"python3", "-c", e2eScript},
		Env:       []string{"PATH=" + inside.DefaultPath, "HOME=/tmp", "MPLCONFIGDIR=/tmp/matplotlib", "LANG=C.UTF-8"},
		Cwd:       inside.Workspace,
		Workspace: ws,
		Limits:    nsjail.Limits{Timeout: 2 * time.Minute, MemoryBytes: 2 << 30, CPUs: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nsjail.StatusSucceeded {
		t.Fatalf("status %s (exit %d, %s)\nstdout: %s\nstderr: %s", res.Status, res.ExitCode, res.Error, res.Stdout, res.Stderr)
	}
	var out struct {
		UID, GID         int
		ImportS          float64 `json:"import_s"`
		Backend          string
		OLSSlope         float64 `json:"ols_slope"`
		LRSlope          float64 `json:"lr_slope"`
		Pearson          float64
		Denied           map[string]any
		FontCacheRebuilt []string `json:"font_cache_rebuilt"`
		CacheDir         []string `json:"cache_dir"`
		Versions         map[string]string
	}
	if err := json.Unmarshal(res.Stdout, &out); err != nil {
		t.Fatalf("stdout is not the script's JSON: %v\n%s\nstderr: %s", err, res.Stdout, res.Stderr)
	}
	t.Logf("imports %.0f ms, wall %d ms, peak memory %d MiB, versions %v",
		out.ImportS*1000, res.Usage.WallMS, res.Usage.PeakMemoryBytes>>20, out.Versions)
	if out.UID != inside.UID || out.GID != inside.GID {
		t.Errorf("ran as %d:%d, want %d:%d", out.UID, out.GID, inside.UID, inside.GID)
	}
	for p, v := range out.Denied {
		// Creating a file hits the read-only mount (EROFS); opening an
		// existing root-owned file for writing fails its permission check
		// first (EACCES).
		want := float64(syscall.EROFS)
		if p == "/usr/bin/python3" {
			want = float64(syscall.EACCES)
		}
		if v != want {
			t.Errorf("write to %s: %v, want errno %v", p, v, want)
		}
	}
	if strings.ToLower(out.Backend) != "agg" {
		t.Errorf("matplotlib backend %q, want agg (MPLBACKEND=Agg from the image)", out.Backend)
	}
	if len(out.FontCacheRebuilt) > 0 || len(out.CacheDir) == 0 {
		t.Errorf("matplotlib rebuilt its font cache (%q; cache dir %q): the prebuilt one was not used", out.FontCacheRebuilt, out.CacheDir)
	}
	if d := out.OLSSlope - 2; d > 0.01 || d < -0.01 || out.LRSlope-out.OLSSlope > 1e-9 || out.Pearson < 0.99 {
		t.Errorf("numbers are off: ols %v lr %v r %v", out.OLSSlope, out.LRSlope, out.Pearson)
	}

	pngFile, err := os.Open(filepath.Join(ws, "chart.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer pngFile.Close()
	cfg, err := png.DecodeConfig(pngFile)
	if err != nil || cfg.Width != 200 || cfg.Height != 150 {
		t.Errorf("chart.png: %dx%d %v, want a 200x150 PNG", cfg.Width, cfg.Height, err)
	}
	zr, err := zip.OpenReader(filepath.Join(ws, "table.xlsx"))
	if err != nil {
		t.Fatalf("table.xlsx is not a zip: %v", err)
	}
	defer zr.Close()
	var sheets, shared string
	for _, f := range zr.File {
		rc, _ := f.Open()
		b, _ := io.ReadAll(rc)
		rc.Close()
		switch {
		case f.Name == "xl/workbook.xml":
			sheets = string(b)
		case f.Name == "xl/sharedStrings.xml" || strings.HasPrefix(f.Name, "xl/worksheets/"):
			shared += string(b)
		}
	}
	if !strings.Contains(sheets, `name="data"`) || !strings.Contains(shared, ">x<") {
		t.Errorf("table.xlsx lacks the sheet or its header: workbook %q", sheets)
	}
	for _, n := range []string{"chart.png", "table.xlsx"} {
		fi, _ := os.Stat(filepath.Join(ws, n))
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != r.HostUID() {
			t.Errorf("%s owned by host uid %d, want %d", n, st.Uid, r.HostUID())
		}
	}
	if after := treeStamp(t, root); !bytes.Equal(before, after) {
		t.Errorf("the published rootfs changed during the run")
	}
}

// treeStamp lists every entry with its mode, size and mtime.
func treeStamp(t *testing.T, root string) []byte {
	var b bytes.Buffer
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d %d\n", p, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	return b.Bytes()
}

// An image that lacks the sandbox's mount points (here: only busybox, no
// /proc, /dev, /sys, /tmp or /workspace) still runs: the unpacker creates
// them, because the sandbox cannot (and must not) write into the tree.
func TestImageWithoutMountPointsRunsInSandbox(t *testing.T) {
	nsjailtest.RequireRoot(t)
	w := newWorld(t)
	for _, d := range []string{filepath.Dir(w.base), w.base} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("busybox-static not installed")
	}
	img := imageOf(t, tarOf(t, dir("bin/"), ent{name: "bin/busybox", typ: '0', mode: 0o755, body: string(bb)}, symlink("bin/sh", "busybox")))
	got, err := w.cache.UnpackImage(ctx(t), "bare busybox", img)
	if err != nil {
		t.Fatal(err)
	}
	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: e2eStateRoot, CgroupParent: e2eCgroupParent,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ws := t.TempDir()
	os.Chown(ws, r.HostUID(), r.HostGID())
	res, err := r.Run(ctx(t), nsjail.Spec{Rootfs: got.RootfsPath, Args: []string{"/bin/busybox", "sh", "-c", "echo ok > /workspace/f; /bin/busybox cat /workspace/f"},
		Workspace: ws, Cwd: inside.Workspace})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nsjail.StatusSucceeded || string(res.Stdout) != "ok\n" {
		t.Fatalf("status %s %s: stdout %q stderr %q", res.Status, res.Error, res.Stdout, res.Stderr)
	}
}
