// Command upstreamtests checks the claim that the data stack's own test
// suites pass inside `sandboxd run` as they pass outside it: it runs a
// selection of the numpy, pandas, scipy, scikit-learn and pyarrow tests
// (Debian's packaged tests, in the python-runtime-tests image) once outside
// any sandbox and once inside one, and fails when a test that passes
// outside does not pass inside. `make upstream-tests` runs it (root only).
// A library the image does not have (pyarrow on trixie, the stable option)
// is reported as "not in this image", as is a selected test file that its
// packaged version lacks.
//
// Outside means: the same unpacked rootfs, the same uid (10001), the same
// environment and working directory, but no user namespace, no seccomp, no
// cgroup limits and no capability drop: a chroot in a private mount
// namespace with /proc, /dev (the host's null, zero, full, random, urandom
// and tty nodes), a tmpfs /tmp and /dev/shm, the workspace bound, and the
// sandbox's default rlimits (file size 1 GiB, 1024 open files). It also
// gets a private network namespace with loopback only, because a sandbox has
// no network by design: a test that needs the internet is not one the
// sandbox breaks by accident.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// suite is one library's selection: test files under dist-packages and the
// pytest arguments its upstream CI uses to leave out slow/network tests.
type suite struct {
	name  string
	paths []string
	args  []string
}

// selection exercises what a sandbox could plausibly break: files and mmap
// on tmpfs, threads (BLAS, pocketfft, Arrow's pools), processes (joblib's
// loky, multiprocessing pools, subprocess), time zones, locale, memory
// pools and large allocations, floating-point environment.
var selection = []suite{
	{name: "numpy", paths: []string{
		"numpy/_core/tests/test_multiarray.py",
		"numpy/_core/tests/test_umath.py",
		"numpy/_core/tests/test_datetime.py",
		"numpy/_core/tests/test_memmap.py",
		"numpy/lib/tests/test_io.py",
		"numpy/linalg/tests/test_linalg.py",
		"numpy/fft/tests/test_pocketfft.py",
		"numpy/random/tests/test_generator_mt19937.py",
	}, args: []string{"-m", "not slow"}},
	{name: "pandas", paths: []string{
		"pandas/tests/io/test_parquet.py",
		"pandas/tests/io/test_feather.py",
		"pandas/tests/io/test_common.py",
		"pandas/tests/io/test_compression.py",
		"pandas/tests/io/excel/test_writers.py",
		"pandas/tests/tslibs",
		"pandas/tests/scalar/timestamp",
		"pandas/tests/arrays/string_",
		"pandas/tests/groupby/test_groupby.py",
		"pandas/tests/window/test_rolling.py",
	}, args: []string{"-m", "not slow and not network and not db and not single_cpu"}},
	{name: "scipy", paths: []string{
		"scipy/linalg/tests/test_basic.py",
		"scipy/optimize/tests/test_optimize.py",
		"scipy/stats/tests/test_stats.py",
		"scipy/fft/tests/test_multithreading.py",
		"scipy/integrate/tests/test_quadpack.py",
		"scipy/io/tests/test_mmio.py",
		"scipy/io/tests/test_netcdf.py",
		"scipy/_lib/tests/test__util.py",
	}, args: []string{"-m", "not slow and not xslow"}},
	{name: "scikit-learn", paths: []string{
		"sklearn/linear_model/tests/test_logistic.py",
		"sklearn/ensemble/tests/test_forest.py",
		"sklearn/utils/tests/test_parallel.py",
		"sklearn/cluster/tests/test_k_means.py",
	}},
	{name: "pyarrow", paths: []string{
		"pyarrow/tests/test_array.py",
		"pyarrow/tests/test_compute.py",
		"pyarrow/tests/test_table.py",
		"pyarrow/tests/test_io.py",
		"pyarrow/tests/test_fs.py",
		"pyarrow/tests/test_ipc.py",
		"pyarrow/tests/test_csv.py",
		"pyarrow/tests/test_memory.py",
		"pyarrow/tests/test_misc.py",
		"pyarrow/tests/parquet/test_basic.py",
		"pyarrow/tests/parquet/test_dataset.py",
	}},
}

const distPackages = "/usr/lib/python3/dist-packages"

// env is the environment of both runs: the server's base environment for a
// 2-CPU policy (server.Policy.BaseEnv), plus a fixed hash seed.
var env = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/tmp",
	"MPLCONFIGDIR=/tmp/matplotlib",
	"MPLBACKEND=Agg",
	"PYTHONDONTWRITEBYTECODE=1",
	"PYTHONUNBUFFERED=1",
	"OMP_NUM_THREADS=2",
	"OPENBLAS_NUM_THREADS=2",
	"MKL_NUM_THREADS=2",
	"LANG=C.UTF-8",
	"PYTHONHASHSEED=0",
}

type options struct {
	sandboxd, rootfs, out string
	only                  string
	timeout               time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.sandboxd, "sandboxd", "bin/sandboxd", "the sandboxd binary")
	flag.StringVar(&o.rootfs, "rootfs", "", "the unpacked python-runtime-tests rootfs (required)")
	flag.StringVar(&o.out, "out", "build/upstream-tests", "where the JUnit files and report.md go")
	flag.StringVar(&o.only, "suites", "", "comma-separated suites to run (default: all)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "per suite and side")
	flag.Parse()
	ok, err := run(context.Background(), o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "upstreamtests: %v\n", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (bool, error) {
	if o.rootfs == "" {
		return false, errors.New("-rootfs is required")
	}
	if os.Getuid() != 0 {
		return false, errors.New("needs root (chroot, mount namespaces, sandboxes)")
	}
	sandboxd, err := filepath.Abs(o.sandboxd)
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return false, err
	}
	// `sandboxd run` maps the sandbox user to this host uid (its runner
	// uses the default id base); the workspace must be owned by it.
	hostUID := nsjail.DefaultHostIDBase + inside.UID
	var comps []Comparison
	var absent []string
	for _, s := range selection {
		if o.only != "" && !contains(strings.Split(o.only, ","), s.name) {
			continue
		}
		s, gone, err := available(o.rootfs, s)
		if err != nil {
			return false, err
		}
		if len(s.paths) == 0 {
			absent = append(absent, s.name+": not in this image")
			fmt.Fprintf(os.Stderr, "upstreamtests: %s: not in this image\n", s.name)
			continue
		}
		for _, p := range gone {
			absent = append(absent, fmt.Sprintf("%s: %s not in this image", s.name, p))
		}
		res := map[string]map[string]Outcome{}
		for _, side := range []string{"outside", "inside"} {
			start := time.Now()
			outcomes, err := runSide(ctx, o, sandboxd, hostUID, side, s)
			if err != nil {
				return false, fmt.Errorf("%s %s: %w", s.name, side, err)
			}
			res[side] = outcomes
			fmt.Fprintf(os.Stderr, "upstreamtests: %s %s: %d tests in %s\n", s.name, side, len(outcomes), time.Since(start).Round(time.Second))
		}
		c := Compare(s.name, res["outside"], res["inside"])
		if err := recheck(ctx, o, sandboxd, hostUID, s, &c); err != nil {
			return false, fmt.Errorf("%s: %w", s.name, err)
		}
		comps = append(comps, c)
	}
	report := Report(comps, absent)
	fmt.Print(report)
	if err := os.WriteFile(filepath.Join(o.out, "report.md"), []byte(report), 0o644); err != nil {
		return false, err
	}
	for _, c := range comps {
		if len(c.Regressions) > 0 {
			return false, nil
		}
	}
	return true, nil
}

// available narrows s to the test paths the rootfs has, listing the others
// in gone. A library the image lacks altogether (pyarrow on trixie) leaves
// no paths: the caller reports it as not in the image rather than failing.
// Where the library is there but none of its test files are, the rootfs is
// not the tests variant, which is an error.
func available(rootfs string, s suite) (_ suite, gone []string, err error) {
	dist := filepath.Join(rootfs, distPackages)
	if _, err := os.Stat(filepath.Join(dist, s.module())); errors.Is(err, fs.ErrNotExist) {
		return suite{name: s.name}, nil, nil
	} else if err != nil {
		return s, nil, err
	}
	kept := s
	kept.paths = nil
	for _, p := range s.paths {
		if _, err := os.Stat(filepath.Join(dist, p)); err == nil {
			kept.paths = append(kept.paths, p)
		} else if errors.Is(err, fs.ErrNotExist) {
			gone = append(gone, p)
		} else {
			return s, nil, err
		}
	}
	if len(kept.paths) == 0 {
		return s, nil, fmt.Errorf("%s: none of its test files is in %s (not the python-runtime-tests image?)", s.name, dist)
	}
	return kept, gone, nil
}

// module is the package directory of s under dist-packages.
func (s suite) module() string {
	if len(s.paths) == 0 {
		return s.name
	}
	m, _, _ := strings.Cut(s.paths[0], "/")
	return m
}

// rerunAttempts is how often a regression is run again inside, alone.
const rerunAttempts = 2

// recheck runs each regression of c inside again (all of them in one
// pytest, up to rerunAttempts times): one that passes is moved to Flaky.
// Timing-dependent upstream tests (a background thread's allocation not yet
// freed when the test checks) fail now and then on any loaded machine; one
// the sandbox breaks fails every time.
func recheck(ctx context.Context, o options, sandboxd string, hostUID int, s suite, c *Comparison) error {
	for attempt := 0; attempt < rerunAttempts && len(c.Regressions) > 0; attempt++ {
		ids := map[string]string{} // node id -> regression line
		for _, r := range c.Regressions {
			id, _, _ := strings.Cut(r, " (inside: ")
			node, ok := nodeID(o.rootfs, id)
			if !ok {
				continue
			}
			ids[node] = r
		}
		if len(ids) == 0 {
			return nil
		}
		again := suite{name: s.name + "-rerun", args: s.args}
		for node := range ids {
			again.paths = append(again.paths, node)
		}
		sort.Strings(again.paths)
		outcomes, err := runSide(ctx, o, sandboxd, hostUID, "inside", again)
		if err != nil {
			return fmt.Errorf("rerun: %w", err)
		}
		var still []string
		for _, r := range c.Regressions {
			id, _, _ := strings.Cut(r, " (inside: ")
			if outcomes[id] == Passed {
				c.Flaky = append(c.Flaky, r)
			} else {
				still = append(still, r)
			}
		}
		c.Regressions = still
	}
	return nil
}

// nodeID turns a JUnit id ("pkg.tests.test_mod.TestClass::test_x[p]") into
// a pytest node id under dist-packages ("pkg/tests/test_mod.py::TestClass::
// test_x[p]"): the longest dotted prefix that is a .py file in the rootfs is
// the module.
func nodeID(rootfs, id string) (string, bool) {
	class, name, ok := strings.Cut(id, "::")
	if !ok {
		return "", false
	}
	parts := strings.Split(class, ".")
	for i := len(parts); i > 0; i-- {
		mod := strings.Join(parts[:i], "/") + ".py"
		if _, err := os.Stat(filepath.Join(rootfs, distPackages, mod)); err == nil {
			return strings.Join(append([]string{mod}, append(parts[i:], name)...), "::"), true
		}
	}
	return "", false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}

// pytestArgs runs one suite and writes its JUnit XML to the workspace.
func pytestArgs(s suite) []string {
	args := []string{"python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "console_output_style=classic",
		"--rootdir=" + distPackages, "--junit-xml=" + inside.Workspace + "/junit.xml", "-o", "junit_family=xunit1",
		"--hypothesis-seed=0", "-W", "ignore::DeprecationWarning"}
	args = append(args, s.args...)
	for _, p := range s.paths {
		args = append(args, distPackages+"/"+p)
	}
	return args
}

// runSide runs suite s on one side and returns its outcomes. The
// workspace is a fresh directory owned by whoever the sandbox user is on
// that side; pytest's own output goes to OUT/SIDE-SUITE.log.
func runSide(ctx context.Context, o options, sandboxd string, hostUID int, side string, s suite) (map[string]Outcome, error) {
	ws, err := os.MkdirTemp("", "sandboxd-upstream-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(ws)
	uid := inside.UID
	if side == "inside" {
		uid = hostUID
	}
	if err := os.Chmod(ws, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(ws, uid, uid); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout+time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if side == "inside" {
		args := []string{"run", "--rootfs", o.rootfs, "--workspace", ws, "--timeout", o.timeout.String(),
			"--memory", "4GiB", "--pids", "512", "--cpus", "2"}
		for _, e := range env {
			args = append(args, "--env", e)
		}
		args = append(args, "--")
		cmd = exec.CommandContext(ctx, sandboxd, append(args, pytestArgs(s)...)...)
	} else {
		cmd = outsideCommand(ctx, o.rootfs, ws, pytestArgs(s))
	}
	logf, err := os.Create(filepath.Join(o.out, side+"-"+s.name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	runErr := cmd.Run() // pytest exits 1 when a test fails: the XML says which
	f, err := os.Open(filepath.Join(ws, "junit.xml"))
	if err != nil {
		return nil, fmt.Errorf("no JUnit XML (%v; run: %v; see %s)", err, runErr, logf.Name())
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 256<<20))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.out, side+"-"+s.name+".xml"), data, 0o644); err != nil {
		return nil, err
	}
	return ParseJUnit(strings.NewReader(string(data)))
}

// outsideScript builds the outside world in a private mount namespace (it
// and every mount in it vanish with the process) and runs the command as
// the sandbox user ($USERSPEC) in a chroot, the workspace at $WORKSPACE.
// $1 rootfs, $2 workspace, $3 the mount point, then the environment and
// command.
const outsideScript = `set -eu
rootfs=$1 ws=$2 m=$3; shift 3
mount --make-rprivate /
mount --bind "$rootfs" "$m"
mount -o remount,bind,ro "$m"
mount -t proc -o nosuid,nodev,noexec proc "$m/proc"
mount -t tmpfs -o mode=755,size=64k tmpfs "$m/dev"
for d in null zero full random urandom tty; do touch "$m/dev/$d"; mount --bind "/dev/$d" "$m/dev/$d"; done
mkdir "$m/dev/shm" "$m/dev/pts"
mount -t tmpfs -o mode=1777,size=64m,nosuid,nodev tmpfs "$m/dev/shm"
ln -s /proc/self/fd "$m/dev/fd"
mount -t tmpfs -o mode=1777,size=256m,nosuid,nodev tmpfs "$m/tmp"
mount --bind "$ws" "$m$WORKSPACE"
ip link set lo up 2>/dev/null || true
exec prlimit --fsize="$FSIZE" --nofile="$NOFILE" chroot --userspec="$USERSPEC" "$m" /usr/bin/env -i "$@"`

func outsideCommand(ctx context.Context, rootfs, ws string, args []string) *exec.Cmd {
	m, err := os.MkdirTemp("", "sandboxd-upstream-root-")
	if err != nil {
		m = "/nonexistent"
	}
	// Cleaned up once the namespace (and its mounts) is gone.
	go func() { <-ctx.Done(); os.Remove(m) }()
	// The sandbox's rlimits, which are policy (like its memory and pids
	// limits, which the inside run sets generously): the same on both sides.
	lim := nsjail.DefaultLimits
	full := []string{"--mount", "--net", "--pid", "--fork", "env",
		fmt.Sprintf("FSIZE=%d", lim.FileSizeBytes), fmt.Sprintf("NOFILE=%d", lim.OpenFiles),
		fmt.Sprintf("USERSPEC=%d:%d", inside.UID, inside.GID), "WORKSPACE=" + inside.Workspace,
		"sh", "-c", outsideScript, "sh", rootfs, ws, m}
	full = append(full, env...)
	full = append(full, "sh", "-c", "cd \"$0\" && exec \"$@\"", inside.Workspace)
	full = append(full, args...)
	return exec.CommandContext(ctx, "unshare", full...)
}
