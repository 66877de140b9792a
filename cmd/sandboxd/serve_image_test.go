package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/rootfs"
)

// ociLayout writes an OCI image layout holding one image whose only layer is
// the tree at dir.
func ociLayout(t *testing.T, dir string) string {
	t.Helper()
	return ociLayoutLabels(t, dir, nil)
}

// ociLayoutLabels is ociLayout with config labels.
func ociLayoutLabels(t *testing.T, dir string, labels map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = rel, 0, 0, "", ""
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil || tw.Close() != nil {
		t.Fatalf("layer tar: %v", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH,
		RootFS: v1.RootFS{Type: "layers", DiffIDs: mustDiffIDs(t, img)}, Config: v1.Config{Labels: labels}})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.oci")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return out
}

// `serve` with an image reference: the image is unpacked into the rootfs
// cache on start, /readyz turns ready once it is, executions run on it; a
// second start finds it cached.
func TestServeUnpacksPythonImage(t *testing.T) {
	nsjailtest.RequireRoot(t)
	bin := buildCLI(t)
	ref := "oci-layout:" + ociLayout(t, shimRootfs(t))
	cache, err := os.MkdirTemp("", "sandboxd-serve-cache-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(cache, 0o755)
	t.Cleanup(func() { os.RemoveAll(cache) })
	state := fmt.Sprintf("/run/sandboxd-test-%d/serve-image-state", os.Getpid())
	cgroup := fmt.Sprintf("sandboxd-test-%d-serve-image", os.Getpid())
	for _, wantCached := range []string{`"cached":false`, `"cached":true`} {
		port := freePort(t)
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		cmd := exec.Command(bin, "serve")
		cmd.Env = append(os.Environ(), "EXECUTION_PYTHON_IMAGE="+ref, "EXECUTION_ROOTFS_CACHE="+cache,
			"EXECUTION_WORK_ROOT="+filepath.Join(t.TempDir(), "work"), "EXECUTION_RESULTS_DIR="+filepath.Join(t.TempDir(), "results"),
			"EXECUTION_SESSIONS_DIR="+filepath.Join(t.TempDir(), "sessions"),
			"EXECUTION_STATE_ROOT="+state,
			"EXECUTION_CGROUP_PARENT="+cgroup, fmt.Sprintf("EXECUTION_WORKER_PORT=%d", port), "EXECUTION_POOL_SIZE=0", "GOGC=1")
		var logs bytes.Buffer
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := false
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !ready; time.Sleep(20 * time.Millisecond) {
			if resp, err := http.Get(base + "/readyz"); err == nil {
				resp.Body.Close()
				ready = resp.StatusCode == 200
			}
		}
		execute := func() string {
			resp, err := http.Post(base+"/v1/executions", "application/json", strings.NewReader(`{"code": "echo from-image"}`))
			if err != nil {
				return err.Error()
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			return string(out)
		}
		var out, gcErr string
		var gcRemoved []string
		if ready {
			out = execute()
			// SECURITY.md case 36: the worker holds its image in use for its
			// whole life, so a GC of the cache (`sandboxd image gc`, here
			// with nothing kept) leaves it; GOGC=1 makes the worker collect
			// garbage often, as a long-lived one does.
			gcRemoved, err = gcCache(cache)
			if err != nil {
				gcErr = err.Error()
			}
			if len(gcRemoved) == 0 {
				out += execute()
			}
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if !ready || strings.Count(out, `"stdout":"from-image\n"`) != 2 || !strings.Contains(logs.String(), wantCached) {
			t.Fatalf("ready %v, answer %s, want %s in log:\n%s", ready, out, wantCached, logs.String())
		}
		if len(gcRemoved) > 0 || gcErr != "" {
			t.Fatalf("a GC while the worker ran removed %v (error %q): the worker's image was not held", gcRemoved, gcErr)
		}
	}
	if err := nsjailtest.CheckNoLeftovers(state, cgroup); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Dir(state))
}

// gcCache runs the cache's GC keeping nothing, as `sandboxd image gc` would
// for an image it is not told to keep.
func gcCache(dir string) ([]string, error) {
	c, err := rootfs.Open(dir)
	if err != nil {
		return nil, err
	}
	// Give the worker's garbage collector (GOGC=1) time to run finalizers.
	time.Sleep(200 * time.Millisecond)
	return c.GC()
}

func mustDiffIDs(t *testing.T, img v1.Image) []v1.Hash {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return cf.RootFS.DiffIDs
}

// `serve` with two runtimes (EXECUTION_RUNTIMES beside python_image): both
// unpacked into the cache before /readyz, each with its labels at GET
// /v1/runtimes, each chosen by name per request; an unknown name is 400.
// A runtime whose image cannot be resolved keeps the worker from serving:
// it exits with the reason, naming the runtime.
func TestServeRuntimes(t *testing.T) {
	nsjailtest.RequireRoot(t)
	refs := map[string]string{}
	for _, name := range []string{"default", "geo"} {
		dir := shimRootfs(t)
		if err := os.WriteFile(filepath.Join(dir, "etc", "sandboxd-runtime"), []byte(name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		refs[name] = "oci-layout:" + ociLayoutLabels(t, dir, map[string]string{
			"org.debian.package.python3": "3.0-" + name, "org.debian.package.python3-" + name: "1.0"})
	}
	cache, err := os.MkdirTemp("", "sandboxd-serve-cache-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(cache, 0o755)
	t.Cleanup(func() { os.RemoveAll(cache) })
	w := startWorker(t, "serve-runtimes", shimRootfs(t), "EXECUTION_PYTHON_IMAGE="+refs["default"],
		"EXECUTION_RUNTIMES=geo="+refs["geo"], "EXECUTION_ROOTFS_CACHE="+cache)
	resp, err := http.Get(w.base + "/v1/runtimes")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rl struct {
		Runtimes []struct {
			Name, Image, Digest, Python string
			Default                     bool
			Packages                    map[string]string
		}
	}
	if err := json.Unmarshal(body, &rl); err != nil || len(rl.Runtimes) != 2 {
		t.Fatalf("GET /v1/runtimes = %d %s", resp.StatusCode, body)
	}
	for i, name := range []string{"default", "geo"} {
		r := rl.Runtimes[i]
		if r.Name != name || r.Default != (name == "default") || r.Image != refs[name] || !strings.HasPrefix(r.Digest, "sha256:") ||
			r.Python != "3.0-"+name || r.Packages["python3-"+name] != "1.0" || len(r.Packages) != 2 {
			t.Errorf("runtime %d: %+v", i, r)
		}
	}
	for _, tc := range []struct{ body, want string }{
		{`{"code": "cat /etc/sandboxd-runtime"}`, `"runtime":"default","status":"succeeded"`},
		{`{"code": "cat /etc/sandboxd-runtime", "runtime": "geo"}`, `"runtime":"geo","status":"succeeded"`},
		{`{"code": "cat /etc/sandboxd-runtime", "runtime": "ml"}`, `unknown runtime \"ml\": want one of [default geo]`},
	} {
		resp, err := http.Post(w.base+"/v1/executions", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %d %s, want %s", tc.body, resp.StatusCode, out, tc.want)
		}
		if rt, ok := strings.CutPrefix(tc.want, `"runtime":"`); ok {
			if name, _, _ := strings.Cut(rt, `"`); !strings.Contains(string(out), `"stdout":"`+name+`\n"`) {
				t.Errorf("%s ran on another rootfs: %s", tc.body, out)
			}
		}
	}
	w.stop(t)

	// A runtime that cannot be resolved: no serving, the reason named.
	state := fmt.Sprintf("/run/sandboxd-test-%d/serve-broken-state", os.Getpid())
	brokenCgroup := fmt.Sprintf("sandboxd-test-%d-serve-broken", os.Getpid())
	cmd := exec.Command(buildCLI(t), "serve")
	cmd.Env = append(os.Environ(), "EXECUTION_PYTHON_IMAGE="+refs["default"], "EXECUTION_ROOTFS_CACHE="+cache,
		"EXECUTION_RUNTIMES=broken=oci-layout:/nonexistent/image.oci",
		"EXECUTION_WORK_ROOT="+filepath.Join(t.TempDir(), "work"), "EXECUTION_RESULTS_DIR="+filepath.Join(t.TempDir(), "results"),
		"EXECUTION_SESSIONS_DIR="+filepath.Join(t.TempDir(), "sessions"), "EXECUTION_STATE_ROOT="+state,
		"EXECUTION_CGROUP_PARENT="+brokenCgroup,
		fmt.Sprintf("EXECUTION_WORKER_PORT=%d", freePort(t)), "EXECUTION_POOL_SIZE=0")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(logs.String(), `runtime \"broken\" (oci-layout:/nonexistent/image.oci)`) {
			t.Errorf("serve with a broken runtime: %v\n%s", err, logs.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("serve with a broken runtime did not exit:\n%s", logs.String())
	}
	// As worker.stop: nothing left, and the empty parent cgroup removed
	// (it was left on every run before).
	if err := nsjailtest.CheckNoLeftovers(state, brokenCgroup); err != nil {
		t.Error(err)
	}
	os.RemoveAll(filepath.Dir(state))
}
