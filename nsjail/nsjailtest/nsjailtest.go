// Package nsjailtest holds what tests of every package need to start real
// sandboxes: a busybox rootfs, the runtime rootfs, the probe rootfs, root
// checks and the leftover check (RunAndCheck).
package nsjailtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// RequireRoot skips t unless it runs as root: sandboxes need real privileges
// (user namespaces with arbitrary mappings, cgroups, mounts).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts real sandboxes (namespaces, cgroups, mounts)")
	}
}

// NewRunner makes a Runner for t, skipping t without root. When t ends it
// waits for the background removal of the Runner's sandboxes, so that a
// leftover check after the tests (RunAndCheck) sees only real leftovers.
func NewRunner(t testing.TB, opts nsjail.Options) *nsjail.Runner {
	t.Helper()
	RequireRoot(t)
	r, err := nsjail.NewRunner(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.WaitForCleanup)
	return r
}

var (
	busyboxOnce sync.Once
	busyboxDir  string
	busyboxErr  error
)

// BusyboxRootfs returns a minimal rootfs made from Debian's busybox-static:
// /bin/busybox plus one symlink per applet, /etc/passwd with the sandbox user,
// and the mount points a sandbox needs. It is built once per test binary,
// root-owned and never written again.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	busyboxOnce.Do(func() { busyboxDir, busyboxErr = buildBusybox() })
	if busyboxErr != nil {
		t.Fatalf("busybox rootfs: %v (apt-get install busybox-static)", busyboxErr)
	}
	return busyboxDir
}

func buildBusybox() (string, error) {
	src, err := exec.LookPath("busybox")
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "sandboxd-busybox-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	for _, d := range []string{"bin", "etc", "proc", "dev", "tmp", "sys", "workspace", "usr/bin", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		return "", err
	}
	out, err := exec.Command(src, "--list").Output()
	if err != nil {
		return "", err
	}
	for _, name := range strings.Fields(string(out)) {
		if name == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", name)); err != nil && !os.IsExist(err) {
			return "", err
		}
	}
	files := map[string]string{
		"etc/passwd": fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nsandbox:x:%d:%d:sandbox:/tmp:/bin/sh\n", inside.UID, inside.GID),
		"etc/group":  fmt.Sprintf("root:x:0:\nsandbox:x:%d:\n", inside.GID),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// RuntimeRootfs returns the unpacked python-runtime rootfs named by
// $SANDBOXD_RUNTIME_ROOTFS (make test sets it after building and unpacking the
// image), and skips t with the reason when it is not set.
func RuntimeRootfs(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SANDBOXD_RUNTIME_ROOTFS")
	if dir == "" {
		t.Skip("SANDBOXD_RUNTIME_ROOTFS is not set: run via `make test`, which builds and unpacks the python-runtime image")
	}
	if _, err := os.Stat(filepath.Join(dir, "usr/bin/python3")); err != nil {
		t.Fatalf("SANDBOXD_RUNTIME_ROOTFS=%s has no usr/bin/python3: %v", dir, err)
	}
	return dir
}

// RuntimeImageRef is the built python-runtime image's reference:
// $SANDBOXD_RUNTIME_IMAGE, else build/python-runtime.oci at the repository
// root (`make runtime-image`); it skips t when neither is there.
func RuntimeImageRef(t testing.TB) string {
	t.Helper()
	if ref := os.Getenv("SANDBOXD_RUNTIME_IMAGE"); ref != "" {
		return ref
	}
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(here), "..", "..", "build", "python-runtime.oci")
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		t.Skipf("python-runtime image not built (%s missing): run `make runtime-image` or set SANDBOXD_RUNTIME_IMAGE=REF", dir)
	}
	return "oci-layout:" + dir
}

// CopyRootfs copies the rootfs src into a new temporary directory (its name
// starting with prefix, mode 0755 so the sandbox's mapped root can reach
// it) that a test may add files to.
func CopyRootfs(src, prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if out, err := exec.Command("cp", "-a", src+"/.", dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy rootfs %s: %v: %s", src, err, out)
	}
	return dir, os.Chmod(dir, 0o755)
}

// WritePythonShim makes dir/usr/bin/python (dir a copy of BusyboxRootfs) a
// shell script standing in for Python: the worker's runner command line
// (`python -P -c RUNNER JOB`, server/runner) runs the code file codePath
// with /bin/sh, any other command line is /bin/sh's. Tests of the API's
// own paths (admission, limits, artifacts, serve's wiring) run shell code
// in real sandboxes without the Python runtime image; the one shim keeps
// them all in step with the runner's command line.
func WritePythonShim(dir, codePath string) error {
	shim := "#!/bin/sh\nif [ \"$1\" = -P ]; then exec /bin/sh " + codePath + "; fi\nexec /bin/sh \"$@\"\n"
	return os.WriteFile(filepath.Join(dir, "usr/bin/python"), []byte(shim), 0o755)
}

// RemoveRootfsCopies removes the rootfs copies BusyboxRootfs and
// ProbeRootfs made in the temporary directory (RunAndCheck calls it after
// the suite; a package whose TestMain does not, calls it itself).
func RemoveRootfsCopies() {
	for _, dir := range []string{busyboxDir, probeDir} {
		RemoveUnmounted(dir)
	}
}

// Main is TestMain for a package whose tests use BusyboxRootfs or
// ProbeRootfs without RunAndCheck: it runs them and removes the copies.
func Main(m *testing.M) {
	code := m.Run()
	RemoveRootfsCopies()
	os.Exit(code)
}

// RemoveUnmounted removes dir (a test's temporary copy) unless something
// is mounted on or under it: os.RemoveAll would descend into a mount a
// test leaked and delete what it holds.
func RemoveUnmounted(dir string) {
	if dir == "" {
		return
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			fmt.Fprintf(os.Stderr, "nsjailtest: %s not removed: %s is mounted\n", dir, f[4])
			return
		}
	}
	os.RemoveAll(dir)
}

var (
	probeOnce sync.Once
	probeDir  string
	probeErr  error
)

// ProbeRootfs returns a copy of BusyboxRootfs with /bin/probe, a static Go
// program (nsjail/nsjailtest/probe) that reports errnos of raw syscalls. It
// is built with the go command, or copied from $SANDBOXD_PROBE when set.
func ProbeRootfs(t testing.TB) string {
	t.Helper()
	bb := BusyboxRootfs(t)
	probeOnce.Do(func() {
		dir, err := CopyRootfs(bb, "sandboxd-probe-")
		if err != nil {
			probeErr = err
			return
		}
		dst := filepath.Join(dir, "bin/probe")
		if prebuilt := os.Getenv("SANDBOXD_PROBE"); prebuilt != "" {
			// A machine without a Go toolchain (the v2 VM) ships it built.
			if out, err := exec.Command("cp", prebuilt, dst).CombinedOutput(); err != nil {
				probeErr = fmt.Errorf("copy $SANDBOXD_PROBE: %v: %s", err, out)
				return
			}
		} else {
			_, self, _, _ := runtime.Caller(0)
			cmd := exec.Command("go", "build", "-o", dst, ".")
			cmd.Dir = filepath.Join(filepath.Dir(self), "probe")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				probeErr = fmt.Errorf("build probe: %v: %s", err, out)
				return
			}
		}
		probeDir = dir
	})
	if probeErr != nil {
		t.Fatalf("probe rootfs: %v", probeErr)
	}
	return probeDir
}

// StateRoot and CgroupParent are this test binary's own: sandboxes started by
// different test binaries (go test runs packages in parallel) never meet, and
// the leftover check at the end of each binary sees only its own.
var (
	StateRoot    = fmt.Sprintf("/run/sandboxd-test-%d/state", os.Getpid())
	CgroupParent = fmt.Sprintf("sandboxd-test-%d", os.Getpid())
)

// InitPid is the host pid of the first process of the sandbox id, as
// libcontainer recorded it under stateRoot.
func InitPid(stateRoot, id string) (int, error) {
	c, err := libcontainer.Load(stateRoot, id)
	if err != nil {
		return 0, fmt.Errorf("unable to load sandbox %s: %w", id, err)
	}
	state, err := c.State()
	if err != nil {
		return 0, fmt.Errorf("unable to read the state of sandbox %s: %w", id, err)
	}
	return state.InitProcessPid, nil
}
