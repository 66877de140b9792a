package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// Peer kinds: what each launcher runs, whole process, cold.
const (
	kindTrue   = "true"   // /bin/true: the sandbox overhead alone
	kindPrint  = "print"  // python3 -c 'print(1)'
	kindPandas = "pandas" // python3 -c <workloadPandas>
)

var peerKinds = []string{kindTrue, kindPrint, kindPandas}

func kindArgs(kind string) ([]string, string) {
	switch kind {
	case kindTrue:
		return []string{"/bin/true"}, ""
	case kindPrint:
		return []string{"python3", "-c", workloadPrint.Code}, workloadPrint.Stdout
	default:
		return []string{"python3", "-c", workloadPandas.Code}, workloadPandas.Stdout
	}
}

// peer is one way to start a fresh isolated process on the runtime rootfs.
type peer struct {
	Name string
	// Isolation says in a few words what the launcher applies.
	Isolation string
	// setup prepares the peer once (bundles, images) and returns a reason
	// to skip it when it cannot run here.
	setup func(ctx context.Context) error
	// command returns the command that runs kind once, cold.
	command func(ctx context.Context, kind string, run int) *exec.Cmd
	// cleanup undoes setup.
	cleanup func()
	// ours marks sandboxd's own launcher (excluded from "fastest peer").
	ours bool
}

// PeerResult is one launcher's measurements.
type PeerResult struct {
	Name      string             `json:"name"`
	Isolation string             `json:"isolation"`
	Ours      bool               `json:"ours"`
	Skipped   string             `json:"skipped,omitempty"`
	Kinds     map[string]Summary `json:"kinds,omitempty"`
	Errors    []string           `json:"errors,omitempty"`
}

// peerEnvironment is what the peers need to know.
type peerEnvironment struct {
	Rootfs   string // unpacked runtime rootfs (read-only use)
	Sandboxd string // bin/sandboxd
	ImageTar string // docker-archive of the runtime image
	WorkDir  string // scratch dir for bundles and state
	Limits   peerLimits
	// KeepDockerImage leaves a loaded/imported image in Docker afterwards.
	KeepDockerImage bool
	// DockerImportRootfs makes the Docker image with `docker import` of
	// Rootfs when ImageTar does not exist.
	DockerImportRootfs bool
	Logf               func(format string, a ...any)
}

func (e peerEnvironment) peers() []*peer {
	return []*peer{e.sandboxdPeer(), e.ociPeer("runc"), e.ociPeer("crun"), e.bwrapPeer(), e.dockerPeer()}
}

// sandboxdPeer is ours, cold: `sandboxd run`, one fresh libcontainer sandbox
// per process (the path every request takes when the pool is empty).
func (e peerEnvironment) sandboxdPeer() *peer {
	ws := filepath.Join(e.WorkDir, "sandboxd-workspace")
	p := &peer{Name: "sandboxd run (cold)", ours: true,
		Isolation: "libcontainer: user/pid/net/mnt/ipc/uts/cgroup ns, seccomp allowlist, cgroup limits, ro root"}
	p.setup = func(context.Context) error {
		if _, err := os.Stat(e.Sandboxd); err != nil {
			return fmt.Errorf("%s not built (make build): %w", e.Sandboxd, err)
		}
		if err := os.MkdirAll(ws, 0o755); err != nil {
			return err
		}
		// The sandbox user (inside.UID, HostIDBase+UID outside) must be
		// able to write its workspace, the script's cwd.
		return os.Chmod(ws, 0o777)
	}
	p.command = func(ctx context.Context, kind string, _ int) *exec.Cmd {
		args, _ := kindArgs(kind)
		return sandboxdLaunch(ctx, e, ws)(args)
	}
	p.cleanup = func() { os.RemoveAll(ws) }
	return p
}

// ociPeer runs a generated bundle with `runc run` or `crun run`: the OCI
// runtime CLI path a containerd-less worker would take.
func (e peerEnvironment) ociPeer(runtime string) *peer {
	dir := filepath.Join(e.WorkDir, runtime)
	state := filepath.Join(dir, "state")
	p := &peer{Name: runtime, Isolation: "OCI runtime CLI: user/pid/net/mnt/ipc/uts/cgroup ns, seccomp allowlist, cgroup limits, ro root"}
	var cgPath string
	p.setup = func(ctx context.Context) error {
		bin, err := exec.LookPath(runtime)
		if err != nil {
			return fmt.Errorf("%s not installed", runtime)
		}
		out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s --version: %v: %s", runtime, err, firstLine(out))
		}
		p.Name = runtime + " " + strings.Fields(firstLine(out))[2]
		own, err := ownCgroups()
		if err != nil {
			return err
		}
		cgPath, err = peerCgroupsPath(own, "sandboxd-bench-"+runtime+"-"+strconv.Itoa(os.Getpid()))
		if err != nil {
			return fmt.Errorf("cgroups: %w", err)
		}
		for _, kind := range peerKinds {
			args, _ := kindArgs(kind)
			if err := writeBundle(filepath.Join(dir, kind), ociSpec(e.Rootfs, args, cgPath, e.Limits)); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(state, 0o700); err != nil {
			return err
		}
		// Probe once, so a runtime that cannot work on this host is skipped
		// with its reason instead of failing every run.
		probe := exec.CommandContext(ctx, runtime, append(ociRuntimeArgs(runtime, state), "run", "--bundle", filepath.Join(dir, kindTrue), fmt.Sprintf("sandboxd-bench-%d-probe", os.Getpid()))...)
		if out, err := probe.CombinedOutput(); err != nil {
			if strings.Contains(string(out), crunHybridRefusal) {
				return fmt.Errorf("%s refuses this host's cgroup layout: %q (cgroup2 at /sys/fs/cgroup/unified offers %s beside the v1 hierarchies; also with --cgroup-manager=disabled)",
					p.Name, firstLine(out), strings.TrimSpace(readFileString("/sys/fs/cgroup/unified/cgroup.controllers")))
			}
			return fmt.Errorf("%s run /bin/true: %v: %s", runtime, err, firstLine(out))
		}
		return nil
	}
	p.command = func(ctx context.Context, kind string, run int) *exec.Cmd {
		id := fmt.Sprintf("sandboxd-bench-%d-%s-%d", os.Getpid(), kind, run)
		args := append(ociRuntimeArgs(runtime, state), "run", "--bundle", filepath.Join(dir, kind), id)
		return exec.CommandContext(ctx, runtime, args...)
	}
	p.cleanup = func() {
		// `run` deletes each container when it exits; a failed run may
		// leave one behind: remove ours (by the ids we gave them) and the
		// cgroup path if it is still there.
		entries, _ := os.ReadDir(state)
		for _, en := range entries {
			_ = exec.Command(runtime, append(ociRuntimeArgs(runtime, state), "delete", "--force", en.Name())...).Run()
		}
		removeCgroupPath(cgPath)
		os.RemoveAll(dir)
	}
	return p
}

// ociRuntimeArgs are the global options of runtime: its own state root.
func ociRuntimeArgs(runtime, state string) []string {
	return []string{"--root", state}
}

// crunHybridRefusal is crun 1.8's error on a host whose cgroup v2 mount
// offers any controller beside v1 hierarchies (this VM: hugetlb at
// /sys/fs/cgroup/unified). It refuses every container then, even with
// --cgroup-manager=disabled; the bench may not change the host's cgroups.
const crunHybridRefusal = "cgroups in hybrid mode not supported"

// removeCgroupPath removes the (empty) cgroup at path in every hierarchy
// where it exists. Only ever called with a path this process chose.
func removeCgroupPath(path string) {
	if path == "" || path == "/" {
		return
	}
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	mounts = append(mounts, "/sys/fs/cgroup")
	for _, m := range mounts {
		_ = os.Remove(filepath.Join(m, path))
	}
}

// bwrapPeer is bubblewrap with every namespace unshared: the lightest real
// isolation, without cgroup limits or seccomp.
func (e peerEnvironment) bwrapPeer() *peer {
	p := &peer{Name: "bubblewrap", Isolation: "user/pid/net/mnt/ipc/uts/cgroup ns, no caps, ro root; no cgroup limits, no seccomp"}
	p.setup = func(ctx context.Context) error {
		bin, err := exec.LookPath("bwrap")
		if err != nil {
			return errors.New("bwrap not installed")
		}
		out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("bwrap --version: %v: %s", err, firstLine(out))
		}
		p.Name = "bubblewrap " + strings.TrimPrefix(firstLine(out), "bubblewrap ")
		return nil
	}
	p.command = func(ctx context.Context, kind string, _ int) *exec.Cmd {
		args, _ := kindArgs(kind)
		cli := []string{"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
			"--uid", strconv.Itoa(inside.UID), "--gid", strconv.Itoa(inside.GID),
			"--ro-bind", e.Rootfs, "/", "--proc", "/proc", "--dev", "/dev",
			"--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--chdir", "/tmp", "--clearenv"}
		for _, kv := range peerEnv {
			k, v, _ := strings.Cut(kv, "=")
			cli = append(cli, "--setenv", k, v)
		}
		cli = append(cli, "--")
		return exec.CommandContext(ctx, "bwrap", append(cli, args...)...)
	}
	p.cleanup = func() {}
	return p
}

// dockerPeer is `docker run` with the flags of the Docker-based worker that
// sandboxd replaces. Docker is used here only as a peer to measure against:
// sandboxd itself never uses it. The image is our docker-archive, loaded
// with `docker load`.
func (e peerEnvironment) dockerPeer() *peer {
	p := &peer{Name: "docker run", Isolation: "Docker worker flags: --network none --read-only --cap-drop ALL --security-opt no-new-privileges --memory --cpus --pids-limit --user 10001:10001"}
	var image string
	var loaded bool
	p.setup = func(ctx context.Context) error {
		if _, err := exec.LookPath("docker"); err != nil {
			return errors.New("docker not installed")
		}
		out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput()
		if err != nil {
			return fmt.Errorf("docker daemon not reachable: %s", firstLine(out))
		}
		p.Name = "docker run " + strings.TrimSpace(string(out))
		if _, err := os.Stat(e.ImageTar); e.ImageTar == "" || err != nil {
			if !e.DockerImportRootfs {
				return fmt.Errorf("no docker-archive of the runtime image at %q (the rootfs target builds build/python-runtime.tar)", e.ImageTar)
			}
			// Same files, one layer: `docker import` of the unpacked rootfs.
			image = fmt.Sprintf("sandboxd-bench/rootfs-import:%d", os.Getpid())
			imp := exec.CommandContext(ctx, "sh", "-c", `tar -C "$1" -c . | docker import - "$2"`, "sh", e.Rootfs, image)
			if out, err := imp.CombinedOutput(); err != nil {
				return fmt.Errorf("docker import of %s: %v: %s", e.Rootfs, err, firstLine(out))
			}
			loaded = true
			p.Name += " (image: docker import of the rootfs)"
			e.Logf("docker: no docker-archive at %q; imported the rootfs as %s", e.ImageTar, image)
			return nil
		}
		// What Docker already holds stays there: only an image this run
		// added is removed afterwards.
		before, _ := exec.CommandContext(ctx, "docker", "image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}").Output()
		out, err = exec.CommandContext(ctx, "docker", "load", "-i", e.ImageTar).CombinedOutput()
		if err != nil {
			return fmt.Errorf("docker load -i %s: %v: %s", e.ImageTar, err, firstLine(out))
		}
		image = parseDockerLoad(string(out))
		if image == "" {
			return fmt.Errorf("docker load printed no image name: %s", firstLine(out))
		}
		loaded = !imageListed(string(before), image)
		e.Logf("docker: loaded %s", image)
		return nil
	}
	p.command = func(ctx context.Context, kind string, _ int) *exec.Cmd {
		args, _ := kindArgs(kind)
		cli := []string{"run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
			"--security-opt", "no-new-privileges",
			"--memory", strconv.FormatInt(e.Limits.MemoryBytes, 10),
			"--memory-swap", strconv.FormatInt(e.Limits.MemoryBytes, 10),
			"--cpus", strconv.FormatFloat(e.Limits.CPUs, 'f', -1, 64),
			"--pids-limit", strconv.FormatInt(e.Limits.Pids, 10),
			"--user", fmt.Sprintf("%d:%d", inside.UID, inside.GID),
			"--tmpfs", "/tmp:rw,nosuid,nodev,size=256m,mode=1777", "-w", "/tmp"}
		for _, kv := range peerEnv {
			cli = append(cli, "-e", kv)
		}
		cli = append(cli, image)
		return exec.CommandContext(ctx, "docker", append(cli, args...)...)
	}
	p.cleanup = func() {
		if loaded && !e.KeepDockerImage {
			_ = exec.Command("docker", "rmi", image).Run()
		}
	}
	return p
}

// parseDockerLoad returns the image named by `docker load` output
// ("Loaded image: NAME:TAG" or "Loaded image ID: sha256:…").
func parseDockerLoad(out string) string {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "Loaded image: "); ok {
			return strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "Loaded image ID: "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// runPeer measures runs[kind] sequential cold runs of each kind, whole
// process wall time from fork to exit, checking the output of every run.
func runPeer(ctx context.Context, p *peer, runs map[string]int, maxPerKind time.Duration, logf func(string, ...any)) PeerResult {
	res := PeerResult{Name: p.Name, Isolation: p.Isolation, Ours: p.ours}
	if err := p.setup(ctx); err != nil {
		res.Name = p.Name
		res.Skipped = err.Error()
		logf("peer %s: skipped: %v", p.Name, err)
		p.cleanup()
		return res
	}
	defer p.cleanup()
	res.Name = p.Name
	res.Kinds = map[string]Summary{}
	for _, kind := range peerKinds {
		n := runs[kind]
		if n <= 0 {
			continue
		}
		_, want := kindArgs(kind)
		// One untimed run first: page cache, image layers, bytecode.
		if err := runOnce(ctx, p.command(ctx, kind, -1), want); err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("%s warm-up: %v", kind, err))
			logf("peer %s %s: warm-up failed: %v", p.Name, kind, err)
			res.Kinds[kind] = Summarize(nil, 1, 0)
			continue
		}
		var lat []time.Duration
		fails := 0
		deadline := time.Now().Add(maxPerKind)
		for i := 0; i < n && time.Now().Before(deadline); i++ {
			t0 := time.Now()
			err := runOnce(ctx, p.command(ctx, kind, i), want)
			d := time.Since(t0)
			if err != nil {
				fails++
				if len(res.Errors) < 5 {
					res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", kind, err))
				}
				continue
			}
			lat = append(lat, d)
		}
		s := Summarize(lat, fails, 0)
		res.Kinds[kind] = s
		logf("peer %-22s %-6s n=%d fail=%d p50=%.1fms p90=%.1fms", p.Name, kind, s.N, s.Failures, s.P50MS, s.P90MS)
	}
	return res
}

// runOnce runs cmd to completion and checks its stdout.
func runOnce(ctx context.Context, cmd *exec.Cmd, wantStdout string) error {
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v: %s", err, tail(strings.TrimSpace(stderr.String()), 300))
	}
	if stdout.String() != wantStdout {
		return fmt.Errorf("stdout %q, want %q (stderr: %s)", tail(stdout.String(), 100), wantStdout, tail(strings.TrimSpace(stderr.String()), 200))
	}
	return nil
}

func readFileString(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// imageListed reports whether image (NAME:TAG or sha256:ID) appears in the
// output of `docker image ls --no-trunc --format "{{.Repository}}:{{.Tag}} {{.ID}}"`.
func imageListed(list, image string) bool {
	for _, line := range strings.Split(list, "\n") {
		for _, f := range strings.Fields(line) {
			if f == image {
				return true
			}
		}
	}
	return false
}
