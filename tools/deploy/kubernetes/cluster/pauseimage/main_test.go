package main

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The docker-archive holds one layer with /pause alone (root-owned,
// executable, the epoch as mtime), runs it as the entrypoint, and two runs
// give the same digest and the same archive bytes.
func TestPauseImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "pause")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	var archives [2][]byte
	var digests [2]string
	for i := range 2 {
		o := options{pause: bin, tag: "registry.k8s.io/pause:3.10.2", epoch: 1700000000,
			oci: filepath.Join(dir, "pause.oci"), archive: filepath.Join(dir, "pause.tar")}
		d, err := run(o)
		if err != nil {
			t.Fatal(err)
		}
		digests[i] = d.String()
		if archives[i], err = os.ReadFile(o.archive); err != nil {
			t.Fatal(err)
		}
	}
	if digests[0] != digests[1] || string(archives[0]) != string(archives[1]) {
		t.Fatalf("two builds differ: %s, %s", digests[0], digests[1])
	}

	img, err := tarball.ImageFromPath(filepath.Join(dir, "pause.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/pause"}) || cfg.Created.Unix() != 1700000000 {
		t.Errorf("entrypoint %q, created %v", cfg.Config.Entrypoint, cfg.Created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Mode != 0o755 || h.ModTime.Unix() != 1700000000 {
			t.Errorf("%s: uid %d gid %d mode %o mtime %v", h.Name, h.Uid, h.Gid, h.Mode, h.ModTime)
		}
	}
	if !slices.Equal(names, []string{"pause"}) {
		t.Errorf("layer holds %q, want [pause]", names)
	}
}
