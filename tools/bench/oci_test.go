package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// TestPeerCgroupsPath checks that the runc/crun cgroup path nests under
// this process's own cgroup in every hierarchy, and is refused when no single
// path can.
func TestPeerCgroupsPath(t *testing.T) {
	own := map[string]string{"cpu": "/", "pids": "/", "memory": "/process_api/abc", "": "/"}
	got, err := peerCgroupsPath(own, "x")
	if err != nil || got != "/process_api/abc/x" {
		t.Fatalf("got %q, %v; want /process_api/abc/x", got, err)
	}
	own["pids"] = "/other"
	if got, err := peerCgroupsPath(own, "x"); err == nil {
		t.Fatalf("diverging own cgroups: got %q, want an error", got)
	}
	own["pids"] = "/process_api"
	if got, err := peerCgroupsPath(own, "x"); err != nil || got != "/process_api/abc/x" {
		t.Fatalf("prefix own cgroup: got %q, %v", got, err)
	}
	// "/process_ap" is not a path prefix of "/process_api/abc".
	own["pids"] = "/process_ap"
	if got, err := peerCgroupsPath(own, "x"); err == nil {
		t.Fatalf("string-prefix but not path-prefix: got %q, want an error", got)
	}
}

func TestPeerSeccompAllowlist(t *testing.T) {
	s := peerSeccomp()
	allowed := s.Syscalls[0].Names
	for _, name := range append(append([]string{}, deniedSyscalls...), enosysSyscalls...) {
		for _, a := range allowed {
			if a == name {
				t.Errorf("%s is both denied and allowed", name)
			}
		}
	}
	for _, must := range []string{"read", "write", "execve", "clone", "mmap", "futex", "openat", "exit_group"} {
		found := false
		for _, a := range allowed {
			found = found || a == must
		}
		if !found {
			t.Errorf("%s is not allowed: python could not run", must)
		}
	}
}

// TestOCIBundleRuns runs the generated bundle with each installed OCI
// runtime on the busybox rootfs and checks, from inside, what the peers
// claim: uid 10001, no capabilities, no_new_privs, seccomp on, a writable
// tmpfs /tmp as cwd, a read-only root, and mount(2) denied.
func TestOCIBundleRuns(t *testing.T) {
	nsjailtest.RequireRoot(t)
	rootfs := nsjailtest.BusyboxRootfs(t)
	own, err := ownCgroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range []string{"runc", "crun"} {
		t.Run(rt, func(t *testing.T) {
			if _, err := exec.LookPath(rt); err != nil {
				t.Skipf("%s not installed", rt)
			}
			dir := t.TempDir()
			cg, err := peerCgroupsPath(own, "sandboxd-bench-test-"+rt)
			if err != nil {
				t.Skipf("cgroups: %v", err)
			}
			defer removeCgroupPath(cg)
			script := `id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; pwd; ` +
				`touch /tmp/ok && echo tmp-writable; touch /etc/x 2>/dev/null || echo root-readonly; ` +
				`mount -t tmpfs none /mnt 2>/dev/null || echo mount-denied`
			if err := writeBundle(dir, ociSpec(rootfs, []string{"/bin/sh", "-c", script}, cg, defaultPeerLimits)); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(dir, "state")
			var out, errb bytes.Buffer
			cmd := exec.Command(rt, append(ociRuntimeArgs(rt, state), "run", "--bundle", dir, "test-"+rt)...)
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Run(); err != nil {
				if strings.Contains(errb.String(), crunHybridRefusal) {
					t.Skipf("%s: %s (the bench skips it too)", rt, strings.TrimSpace(errb.String()))
				}
				t.Fatalf("%s run: %v: %s", rt, err, errb.String())
			}
			want := "10001\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n/tmp\ntmp-writable\nroot-readonly\nmount-denied\n"
			if out.String() != want {
				t.Errorf("inside %s:\n%s\nwant:\n%s", rt, out.String(), want)
			}
			if _, err := os.Stat(filepath.Join(rootfs, "etc/x")); err == nil {
				t.Errorf("the container wrote into the shared rootfs")
			}
		})
	}
}

func TestDockerLoadParsing(t *testing.T) {
	if got := parseDockerLoad("Loaded image: python-runtime:latest\n"); got != "python-runtime:latest" {
		t.Errorf("named: %q", got)
	}
	if got := parseDockerLoad("some progress\nLoaded image ID: sha256:abc\n"); got != "sha256:abc" {
		t.Errorf("by id: %q", got)
	}
	if got := parseDockerLoad("open x: no such file"); got != "" {
		t.Errorf("error output: %q", got)
	}
	list := "python-runtime:latest sha256:111\nother:1 sha256:222\n"
	if !imageListed(list, "python-runtime:latest") || !imageListed(list, "sha256:222") || imageListed(list, "python-runtime:2") {
		t.Errorf("imageListed wrong on %q", list)
	}
}
