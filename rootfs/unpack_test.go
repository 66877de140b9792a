package rootfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

func listTree(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		if rel != "." {
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// Layers apply in order with OCI whiteouts and opaque directories.
func TestWhiteoutsAndOpaqueDirs(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t,
		tarOf(t, dir("a/"), file("a/b", "1"), file("a/c", "1"), dir("d/"), file("d/e", "1"), dir("d/sub/"), file("d/sub/x", "1"),
			file("gone", "1"), dir("tree/"), file("tree/leaf", "1"), file("keep", "1")),
		tarOf(t, file("a/.wh.b", ""), dir("d/"), file("d/.wh..wh..opq", ""), file("d/f", "2"),
			file(".wh.gone", ""), file(".wh.tree", ""), file(".wh.never-existed", ""), file("keep", "2")),
		tarOf(t, dir("tree/"), file("tree/new", "3")),
	)
	got, err := w.cache.UnpackImage(ctx(t), "layers", img)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "a/c", "d", "d/f", "dev", "keep", "proc", "sys", "tmp", "tree", "tree/new", "workspace"}
	if g := listTree(t, got.RootfsPath); strings.Join(g, " ") != strings.Join(want, " ") {
		t.Fatalf("tree = %q, want %q", g, want)
	}
	if b, _ := os.ReadFile(filepath.Join(got.RootfsPath, "keep")); string(b) != "2" {
		t.Errorf("keep = %q, want the upper layer's 2", b)
	}
}

// An opaque marker that comes after same-layer entries hides only lower
// layers' content.
func TestOpaqueAfterSameLayerEntries(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t,
		tarOf(t, dir("d/"), file("d/old", "1"), dir("d/sub/"), file("d/sub/old", "1")),
		tarOf(t, dir("d/"), file("d/new", "2"), dir("d/sub/"), file("d/sub/new", "2"), file("d/.wh..wh..opq", "")),
	)
	got, err := w.cache.UnpackImage(ctx(t), "layers", img)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"d", "d/new", "d/sub", "d/sub/new", "dev", "proc", "sys", "tmp", "workspace"}
	if g := listTree(t, got.RootfsPath); strings.Join(g, " ") != strings.Join(want, " ") {
		t.Fatalf("tree = %q, want %q", g, want)
	}
}

// Ownership is normalised: everything belongs to host root, and the
// group/other bits carry exactly what inside.UID/GID could do in the image.
func TestOwnershipAndModesNormalised(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t, tarOf(t,
		ent{name: "etc/", typ: '5', mode: 0o755},
		ent{name: "etc/shadow", typ: '0', mode: 0o640, gid: 42, body: "root:*:1::::::\n"},
		ent{name: "home/", typ: '5', mode: 0o755},
		ent{name: "home/sandbox/", typ: '5', mode: 0o700, uid: inside.UID, gid: inside.GID},
		ent{name: "home/sandbox/notes", typ: '0', mode: 0o600, uid: inside.UID, gid: inside.GID, body: "mine"},
		ent{name: "srv/", typ: '5', mode: 0o750, gid: inside.GID},
		ent{name: "srv/data", typ: '0', mode: 0o640, gid: inside.GID, body: "group data"},
		ent{name: "usr/bin/tool", typ: '0', mode: 0o775, uid: 1000, gid: 1000, body: "#!/bin/sh\n"},
		ent{name: "root/", typ: '5', mode: 0o700},
		ent{name: "opt/ro/", typ: '5', mode: 0o555},
	))
	got, err := w.cache.UnpackImage(ctx(t), "modes", img)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{
		"etc/shadow":         0o600,
		"home/sandbox":       os.ModeDir | 0o755,
		"home/sandbox/notes": 0o644,
		"srv":                os.ModeDir | 0o755,
		"srv/data":           0o644,
		"usr/bin/tool":       0o755,
		"usr":                os.ModeDir | 0o755, // implicit parent
		"root":               os.ModeDir | 0o700,
		"opt/ro":             os.ModeDir | 0o755,
	}
	for n, m := range want {
		fi, err := os.Lstat(filepath.Join(got.RootfsPath, n))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != m {
			t.Errorf("%s: mode %v, want %v", n, fi.Mode(), m)
		}
	}
	if os.Geteuid() == 0 {
		assertRootOwned(t, got.RootfsPath)
	}
}

// Concurrent unpacks of one image do the work once; the others get the
// published tree.
func TestConcurrentUnpackDoesWorkOnce(t *testing.T) {
	w := newWorld(t)
	dir := writeLayout(t, imageOf(t, tarOf(t, file("a", "a"), file("b", "b"))), "latest")
	const n = 6
	var wg sync.WaitGroup
	results := make([]Image, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Open(w.cache.Dir()) // one Cache per "process"
			if err != nil {
				errs[i] = err
				return
			}
			results[i], errs[i] = c.Unpack(ctx(t), "oci-layout:"+dir+":latest")
		}()
	}
	wg.Wait()
	fresh := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if results[i].RootfsPath != results[0].RootfsPath {
			t.Fatalf("different paths: %s vs %s", results[i].RootfsPath, results[0].RootfsPath)
		}
		if !results[i].Cached {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d unpacks did the work, want exactly 1", fresh)
	}
	imgs, _ := w.cache.List()
	if len(imgs) != 1 {
		t.Errorf("List: %d images, want 1", len(imgs))
	}
}

// A cancelled unpack leaves nothing behind.
func TestCancelledUnpackLeavesNothing(t *testing.T) {
	w := newWorld(t)
	c, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := w.cache.UnpackImage(c, "cancelled", imageOf(t, tarOf(t, file("a", "a"))))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	w.assertNothingPublished(t)
	w.assertUntouched(t, w.snapshot(t))
}

func TestRefErrors(t *testing.T) {
	w := newWorld(t)
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct{ ref, err string }{
		{"", "empty image reference"},
		{"oci-layout:", "needs a path"},
		{"oci-layout:/nonexistent/layout", "oci-layout /nonexistent/layout"},
		{"docker-archive:/nonexistent.tar", "docker-archive /nonexistent.tar"},
		{"NOT a ref!", "bad image reference"},
		// No network here (and .invalid never resolves): a clear pull error.
		{"registry.invalid/sandboxd/python-runtime:latest", "pull registry.invalid/sandboxd/python-runtime:latest"},
	} {
		_, err := w.cache.Unpack(c, tc.ref)
		wantErr(t, err, tc.err)
	}
	dir := writeLayout(t, imageOf(t, tarOf(t, file("a", "a"))), "v1")
	_, err := w.cache.Unpack(c, "oci-layout:"+dir+":v2")
	wantErr(t, err, `no image tagged "v2" (tags: v1)`)
	// An image for another architecture is refused before any layer is read.
	arm, _ := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: "s390x"})
	_, err = w.cache.UnpackImage(c, "arm", arm)
	wantErr(t, err, "image is for linux/s390x")
	w.assertNothingPublished(t)
}

func TestListUseGC(t *testing.T) {
	w := newWorld(t)
	a, err := w.cache.UnpackImage(ctx(t), "a", imageOf(t, tarOf(t, file("a", "a"))))
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.cache.UnpackImage(ctx(t), "b", imageOf(t, tarOf(t, file("b", "b"))))
	if err != nil {
		t.Fatal(err)
	}
	c, err := w.cache.UnpackImage(ctx(t), "c", imageOf(t, tarOf(t, file("c", "c"))))
	if err != nil {
		t.Fatal(err)
	}
	// A crashed unpack's leftovers.
	os.MkdirAll(filepath.Join(w.cache.Dir(), "tmp", "sha256-"+strings.Repeat("0", 64)+"-123", "rootfs"), 0o700)

	imgs, err := w.cache.List()
	if err != nil || len(imgs) != 3 {
		t.Fatalf("List = %d images, %v", len(imgs), err)
	}
	release, err := w.cache.Use(ctx(t), b.Digest)
	if err != nil {
		t.Fatal(err)
	}
	removed, err := w.cache.GC(a.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != c.Digest {
		t.Errorf("GC removed %q, want only %s (a is kept, b is in use)", removed, c.Digest)
	}
	if _, err := os.Stat(c.RootfsPath); !os.IsNotExist(err) {
		t.Errorf("c still on disk: %v", err)
	}
	if tmps, _ := os.ReadDir(filepath.Join(w.cache.Dir(), "tmp")); len(tmps) != 0 {
		t.Errorf("GC left tmp/: %v", tmps)
	}
	release()
	removed, err = w.cache.GC(a.Digest)
	if err != nil || len(removed) != 1 || removed[0] != b.Digest {
		t.Errorf("after release GC removed %q (%v), want %s", removed, err, b.Digest)
	}
	if _, ok := w.cache.Lookup(a.Digest); !ok {
		t.Error("kept image a is gone")
	}
	if _, err := w.cache.Use(ctx(t), c.Digest); err == nil {
		t.Error("Use of a removed image succeeded")
	}
	if _, err := w.cache.GC("sha256:nothex"); err == nil {
		t.Error("GC accepted a bad digest")
	}
}

// SECURITY.md case 36: UnpackAndUse returns with the image held, and no GC
// can slip in between the unpack and the hold: the hook runs GC exactly
// where `serve` used to go from Unpack to Use. Both a fresh unpack and a
// cached one.
func TestUnpackAndUseLeavesNoGapForGC(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t, tarOf(t, file("a", "a")))
	var gcRemoved []string
	testHookUnpacked = func() {
		removed, err := w.cache.GC()
		if err != nil {
			t.Error(err)
		}
		gcRemoved = append(gcRemoved, removed...)
	}
	t.Cleanup(func() { testHookUnpacked = nil })
	for _, wantCached := range []bool{false, true} {
		got, release, err := w.cache.UnpackImageAndUse(ctx(t), "a", img)
		if err != nil {
			t.Fatalf("cached=%v: %v", wantCached, err)
		}
		if got.Cached != wantCached {
			t.Errorf("Cached = %v, want %v", got.Cached, wantCached)
		}
		if len(gcRemoved) > 0 {
			t.Fatalf("cached=%v: a GC right after the unpack removed %v", wantCached, gcRemoved)
		}
		if _, err := os.Stat(filepath.Join(got.RootfsPath, "a")); err != nil {
			t.Fatalf("cached=%v: rootfs gone: %v", wantCached, err)
		}
		release()
	}
	testHookUnpacked = nil
	if removed, err := w.cache.GC(); err != nil || len(removed) != 1 {
		t.Errorf("GC after release removed %v (%v), want the image", removed, err)
	}
}

// busyboxImage is a real, runnable image: busybox-static's /bin/busybox with
// its applet symlinks in a first layer, and a second layer that deletes one
// applet and adds a file, so whiteouts are exercised on a real tree.
func busyboxImage(t testing.TB) v1.Image {
	t.Helper()
	src, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox not installed (apt-get install busybox-static)")
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(src, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	ents := []ent{dir("bin/"), {name: "bin/busybox", typ: '0', mode: 0o755, body: string(data)},
		dir("etc/"), file("etc/passwd", fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nsandbox:x:%d:%d:sandbox:/tmp:/bin/sh\n", inside.UID, inside.GID)),
		dir("tmp/"), dir("proc/"), dir("dev/"), dir("workspace/")}
	for _, n := range strings.Fields(string(out)) {
		if n != "busybox" {
			ents = append(ents, symlink("bin/"+n, "busybox"))
		}
	}
	base := tarOf(t, ents...)
	top := tarOf(t, file("bin/.wh.wget", ""), file("etc/motd", "built by rootfs tests\n"))
	return imageOf(t, base, top)
}

func TestBusyboxOCILayoutAndDockerArchive(t *testing.T) {
	w := newWorld(t)
	img := busyboxImage(t)
	dir := writeLayout(t, img, "latest")
	oci, err := w.cache.Unpack(ctx(t), "oci-layout:"+dir+":latest")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if oci.Digest != want.String() {
		t.Errorf("digest %s, want %s", oci.Digest, want)
	}
	again, err := w.cache.Unpack(ctx(t), "oci-layout:"+dir) // untagged: the only image
	if err != nil || !again.Cached || again.RootfsPath != oci.RootfsPath {
		t.Fatalf("second unpack: %+v %v", again, err)
	}

	archive := writeArchive(t, img)
	// What `docker load` reads: go-containerregistry's reader of the same format.
	if _, err := tarball.ImageFromPath(archive, nil); err != nil {
		t.Fatal(err)
	}
	da, err := w.cache.Unpack(ctx(t), "docker-archive:"+archive)
	if err != nil {
		t.Fatal(err)
	}
	a, b := listTree(t, oci.RootfsPath), listTree(t, da.RootfsPath)
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Errorf("docker-archive tree differs from the OCI layout's")
	}
	for _, r := range []Image{oci, da} {
		if _, err := os.Lstat(filepath.Join(r.RootfsPath, "bin/wget")); !os.IsNotExist(err) {
			t.Errorf("bin/wget should be whited out: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(r.RootfsPath, "bin/sh")); err != nil {
			t.Errorf("bin/sh: %v", err)
		}
	}
	if os.Geteuid() != 0 {
		t.Log("not root: skipping the chroot run of the unpacked busybox")
		return
	}
	out, err := exec.Command("chroot", fmt.Sprintf("--userspec=%d:%d", inside.UID, inside.GID), oci.RootfsPath, "/bin/sh", "-c", "cat /etc/motd; id -u").CombinedOutput()
	if err != nil || string(out) != fmt.Sprintf("built by rootfs tests\n%d\n", inside.UID) {
		t.Fatalf("running the unpacked busybox as the sandbox user: %q %v", out, err)
	}
}

// The config's labels (our images' package versions) are kept in
// image.json, so a cached digest needs no config read; an image.json
// written before they were kept gets them from the verified config blob.
func TestLabelsKept(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t, tarOf(t, file("a", "a")))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Labels = map[string]string{"org.debian.package.python3": "3.13.5-1"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.cache.UnpackImage(ctx(t), "a", img)
	if err != nil || got.Labels["org.debian.package.python3"] != "3.13.5-1" {
		t.Fatalf("first unpack: labels %v, %v", got.Labels, err)
	}
	again, err := w.cache.UnpackImage(ctx(t), "a", img)
	if err != nil || !again.Cached || again.Labels["org.debian.package.python3"] != "3.13.5-1" {
		t.Fatalf("cached: %v %v, %v", again.Cached, again.Labels, err)
	}
	// An older image.json, without labels.
	meta := filepath.Join(filepath.Dir(got.RootfsPath), "image.json")
	data, _ := os.ReadFile(meta)
	var doc map[string]any
	json.Unmarshal(data, &doc)
	delete(doc, "labels")
	data, _ = json.Marshal(doc)
	os.WriteFile(meta, data, 0o644)
	old, err := w.cache.UnpackImage(ctx(t), "a", img)
	if err != nil || old.Labels["org.debian.package.python3"] != "3.13.5-1" {
		t.Fatalf("older image.json: labels %v, %v", old.Labels, err)
	}
	// No labels at all: an empty map, recorded as such.
	plain, err := w.cache.UnpackImage(ctx(t), "b", imageOf(t, tarOf(t, file("b", "b"))))
	if err != nil || plain.Labels == nil || len(plain.Labels) != 0 {
		t.Fatalf("no labels: %#v, %v", plain.Labels, err)
	}
}
