// Package ociout is what the image tools (tools/runtime-image,
// tools/deploy/image, the test cluster's pauseimage) share: assembling the
// image from its config and layers (Image), the package list they label it
// with, and writing it as an OCI image layout
// and a docker-archive, each beside its final name and renamed into place
// (a failed build never leaves a half-written image that make takes as
// done), then read back and checked. Nothing here changes the image: its
// digest is the caller's.
package ociout

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ReadPackages parses `dpkg-query -W -f '${Package}\t${Version}\n'` output.
func ReadPackages(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("package list: %w", err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		name, version, ok := strings.Cut(line, "\t")
		if !ok || name == "" || version == "" {
			return nil, fmt.Errorf("package list %s: bad line %q", path, line)
		}
		out[name] = version
	}
	return out, nil
}

// PackageList is versions as sorted NAME=VERSION words (the
// org.debian.packages label's value, joined by spaces).
func PackageList(versions map[string]string) []string {
	all := make([]string, 0, len(versions))
	for p, v := range versions {
		all = append(all, p+"="+v)
	}
	sort.Strings(all)
	return all
}

// Save writes img as the OCI image layout oci and the docker-archive
// archive, both named tag, and reads both back (Verify).
func Save(oci, archive string, img v1.Image, tag name.Tag) error {
	if err := writeLayout(oci, img, tag); err != nil {
		return err
	}
	if err := writeArchive(archive, img, tag); err != nil {
		return err
	}
	return Verify(oci, archive, img)
}

func writeLayout(dir string, img v1.Image, tag name.Tag) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          ContainerdName(tag),
	})); err != nil {
		return fmt.Errorf("oci layout: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// ContainerdName is the name containerd gives tag: Docker Hub's registry
// spelled docker.io, as containerd's reference normalisation spells it, not
// go-containerregistry's index.docker.io. An image imported under the
// latter is found by the kubelet (by digest) but not by containerd's CRI
// when it creates the container ("image docker.io/library/NAME:TAG not
// found"), seen on containerd 1.6 in make test-k8s.
func ContainerdName(tag name.Tag) string {
	if tag.RegistryStr() == name.DefaultRegistry {
		return "docker.io/" + tag.RepositoryStr() + ":" + tag.TagStr()
	}
	return tag.Name()
}

func writeArchive(path string, img v1.Image, tag name.Tag) error {
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("docker-archive: %w", err)
	}
	return os.Rename(tmp, path)
}

// Verify reads both outputs back with go-containerregistry's own readers
// (the docker-archive reader parses the same manifest.json `docker load`
// does) and checks that they hold want: the layout's index names want's
// digest and nothing else, and each holds want's config and layers, every
// stored layer blob re-hashed.
func Verify(oci, archive string, want v1.Image) error {
	wantDigest, err := want.Digest()
	if err != nil {
		return err
	}
	idx, err := layout.ImageIndexFromPath(oci)
	if err != nil {
		return fmt.Errorf("verify oci layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Digest != wantDigest {
		return fmt.Errorf("verify oci layout: index does not name %s (%v)", wantDigest, err)
	}
	got, err := idx.Image(wantDigest)
	if err != nil {
		return fmt.Errorf("verify oci layout: %w", err)
	}
	if err := sameContent(got, want); err != nil {
		return fmt.Errorf("verify oci layout: %w", err)
	}
	if got, err = tarball.ImageFromPath(archive, nil); err != nil {
		return fmt.Errorf("verify docker-archive: %w", err)
	}
	if err := sameContent(got, want); err != nil {
		return fmt.Errorf("verify docker-archive: %w", err)
	}
	return nil
}

func sameContent(got, want v1.Image) error {
	gc, err := got.ConfigName()
	if err != nil {
		return err
	}
	if wc, err := want.ConfigName(); err != nil || gc != wc {
		return fmt.Errorf("config %s, want %s (%v)", gc, wc, err)
	}
	gl, err := got.Layers()
	if err != nil {
		return err
	}
	wl, err := want.Layers()
	if err != nil {
		return err
	}
	if len(gl) != len(wl) {
		return fmt.Errorf("%d layers, want %d", len(gl), len(wl))
	}
	for i := range gl {
		w, err := wl[i].Digest()
		if err != nil {
			return err
		}
		if g, err := gl[i].Digest(); err != nil || g != w {
			return fmt.Errorf("layer %d: %s, want %s (%v)", i, g, w, err)
		}
		// Re-hash the stored blob: catches a truncated or corrupted copy.
		rc, err := gl[i].Compressed()
		if err != nil {
			return err
		}
		h, _, err := v1.SHA256(rc)
		rc.Close()
		if err != nil {
			return err
		}
		if h != w {
			return fmt.Errorf("layer %d: stored blob hashes to %s, want %s", i, h, w)
		}
	}
	return nil
}
