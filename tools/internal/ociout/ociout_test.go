package ociout

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

// Save writes both outputs and Verify reads them back; a layer blob
// altered afterwards (same size) is caught by its re-hash.
func TestSaveVerify(t *testing.T) {
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	oci, archive := filepath.Join(dir, "i.oci"), filepath.Join(dir, "i.tar")
	tag, _ := name.NewTag("test:latest")
	if err := Save(oci, archive, img, tag); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(oci + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("the layout's temporary directory is left: %v", err)
	}
	layers, _ := img.Layers()
	d, _ := layers[1].Digest()
	blob := filepath.Join(oci, "blobs", d.Algorithm, d.Hex)
	data, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 0xff
	if err := os.WriteFile(blob, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Verify(oci, archive, img); err == nil || !strings.Contains(err.Error(), "verify oci layout: layer 1: stored blob hashes to") {
		t.Fatalf("a corrupted blob: %v", err)
	}
}

func TestReadPackages(t *testing.T) {
	p := filepath.Join(t.TempDir(), "p.txt")
	os.WriteFile(p, []byte("libc6\t2.36-9\npython3\t3.11.2-1+b1\n"), 0o644)
	got, err := ReadPackages(p)
	if err != nil || len(got) != 2 || got["python3"] != "3.11.2-1+b1" {
		t.Fatalf("%v %v", got, err)
	}
	if l := strings.Join(PackageList(got), " "); l != "libc6=2.36-9 python3=3.11.2-1+b1" {
		t.Errorf("package list %q", l)
	}
	os.WriteFile(p, []byte("libc6 2.36-9\n"), 0o644)
	if _, err := ReadPackages(p); err == nil || !strings.Contains(err.Error(), "bad line") {
		t.Errorf("a line without a tab: %v", err)
	}
}

// The layout names an image as containerd does: docker.io, not
// go-containerregistry's index.docker.io (CRI looks the image up by it).
func TestContainerdName(t *testing.T) {
	for in, want := range map[string]string{
		"sandboxd-worker:latest":         "docker.io/library/sandboxd-worker:latest",
		"example/worker:v1":              "docker.io/example/worker:v1",
		"registry.example:5000/w:abc":    "registry.example:5000/w:abc",
		"index.docker.io/library/x:tag1": "docker.io/library/x:tag1",
	} {
		tag, err := name.NewTag(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := ContainerdName(tag); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
