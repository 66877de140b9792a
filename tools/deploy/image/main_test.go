package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// fixture lays out a package tree (a file, a hard link, a symlink, a
// manual and docs that are dropped, a copyright that stays) and a binary,
// with the disk times it is given.
func fixture(t *testing.T, mtime time.Time) (base, packages, binary string) {
	t.Helper()
	dir := t.TempDir()
	base = filepath.Join(dir, "base")
	for path, data := range map[string]string{
		"sbin/mke2fs":     "mke2fs",
		"etc/mke2fs.conf": "[defaults]\n",
		"lib/x86_64-linux-gnu/libseccomp.so.2.5.4": "elf",
		"usr/share/man/man8/mke2fs.8.gz":           "manual",
		"usr/share/doc/e2fsprogs/changelog.gz":     "changes",
		"usr/share/doc/e2fsprogs/copyright":        "licence",
	} {
		p := filepath.Join(base, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(base, "sbin/mke2fs"), 0o4755); err != nil { // set-id: dropped
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(base, "sbin/mke2fs"), filepath.Join(base, "sbin/mkfs.ext4")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libseccomp.so.2.5.4", filepath.Join(base, "lib/x86_64-linux-gnu/libseccomp.so.2")); err != nil {
		t.Fatal(err)
	}
	packages = filepath.Join(dir, "packages.txt")
	if err := os.WriteFile(packages, []byte("libseccomp2\t2.5.4-1+deb12u1\ne2fsprogs\t1.47.0-2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	binary = filepath.Join(dir, "sandboxd")
	if err := os.WriteFile(binary, []byte("\x7fELF worker"), 0o700); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error {
		os.Chtimes(p, mtime, mtime)
		return nil
	})
	return base, packages, binary
}

const testEpoch = 1796078536

// Two builds from the same inputs, unpacked at different times into
// different directories, give the same digest; the layers hold 0:0
// entries at SOURCE_DATE_EPOCH, without the dropped files or set-id bits.
func TestReproducible(t *testing.T) {
	var digests []string
	for i, when := range []time.Time{time.Unix(1e9, 0), time.Now()} {
		base, packages, binary := fixture(t, when)
		out := t.TempDir()
		o := options{base: base, packages: packages, binary: binary, epoch: testEpoch, revision: "abc123",
			oci: filepath.Join(out, "w.oci"), archive: filepath.Join(out, "w.tar"), tag: "sandboxd-worker:test"}
		d, err := run(o)
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
		digests = append(digests, d.String())
		if i == 0 {
			checkContents(t, o)
		}
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds differ: %s and %s", digests[0], digests[1])
	}
	// The epoch is in every entry: another gives another image.
	base, packages, binary := fixture(t, time.Now())
	out := t.TempDir()
	d, err := run(options{base: base, packages: packages, binary: binary, epoch: testEpoch + 1, revision: "abc123",
		oci: filepath.Join(out, "w.oci"), archive: filepath.Join(out, "w.tar"), tag: "sandboxd-worker:test"})
	if err != nil || d.String() == digests[0] {
		t.Fatalf("another epoch: %s, %v", d, err)
	}
}

func checkContents(t *testing.T, o options) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(o.oci)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %+v %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.Entrypoint[0] != "/"+BinaryPath || !slices.Equal(cf.Config.Cmd[:2], []string{"supervise", "serve"}) || cf.Config.Labels["org.debian.packages"] != "e2fsprogs=1.47.0-2 libseccomp2=2.5.4-1+deb12u1" ||
		cf.Config.Labels["org.opencontainers.image.revision"] != "abc123" || cf.Created.Unix() != testEpoch {
		t.Fatalf("config %+v", cf)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("%d layers, %v", len(layers), err)
	}
	got := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.ModTime.Unix() != testEpoch || len(h.Xattrs) != 0 {
				t.Errorf("%s: owner %d:%d (%q:%q), mtime %v", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
			}
			got[h.Name] = h
		}
		rc.Close()
	}
	for name, want := range map[string]struct {
		typ  byte
		mode int64
		link string
	}{
		"sbin/mke2fs":                          {tar.TypeReg, 0o755, ""},
		"sbin/mkfs.ext4":                       {tar.TypeLink, 0o755, "sbin/mke2fs"},
		"lib/x86_64-linux-gnu/libseccomp.so.2": {tar.TypeSymlink, 0o777, "libseccomp.so.2.5.4"},
		"usr/share/doc/e2fsprogs/copyright":    {tar.TypeReg, 0o644, ""},
		BinaryPath:                             {tar.TypeReg, 0o755, ""},
		"tmp/":                                 {tar.TypeDir, 0o1777, ""},
		"etc/sandboxd/":                        {tar.TypeDir, 0o755, ""},
	} {
		h, ok := got[name]
		if !ok || h.Typeflag != want.typ || h.Mode != want.mode || h.Linkname != want.link {
			t.Errorf("%s: %+v, want type %c mode %o link %q", name, h, want.typ, want.mode, want.link)
		}
	}
	for _, name := range []string{"usr/share/man/", "usr/share/man/man8/mke2fs.8.gz", "usr/share/doc/e2fsprogs/changelog.gz"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s is in the image", name)
		}
	}
	// The docker-archive holds the same image.
	ai, err := tarball.ImageFromPath(o.archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustConfigName(t, ai), mustConfigName(t, img); a != b {
		t.Fatalf("docker-archive config %s, oci %s", a, b)
	}
}

func mustConfigName(t *testing.T, img v1.Image) string {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}
