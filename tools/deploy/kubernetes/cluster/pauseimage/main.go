// Command pauseimage writes the pod sandbox image of the test cluster
// (tools/deploy/kubernetes/cluster/README.md, Components): one layer
// holding the static pause binary as /pause, entrypoint ["/pause"], as
// an OCI image layout and a docker-archive (`ctr -n k8s.io images import`),
// under the tag containerd's sandbox_image names. Nothing is pulled: no
// registry is reachable where the cluster runs. The entry is owned by 0:0,
// its mtime and the image's creation time are -epoch, and the layer is
// compressed at a fixed level: the same binary gives the same digest.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sandboxd/sandboxd/tools/internal/ociout"
)

func main() {
	var o options
	flag.StringVar(&o.pause, "pause", "build/k8s/bin/pause", "the static pause binary")
	flag.StringVar(&o.tag, "tag", "", "image name and tag, e.g. registry.k8s.io/pause:3.10.2 (required)")
	flag.Int64Var(&o.epoch, "epoch", 0, "SOURCE_DATE_EPOCH: the file's mtime and the image's creation time (required)")
	flag.StringVar(&o.oci, "oci", "build/k8s/pause.oci", "OCI image layout directory to write")
	flag.StringVar(&o.archive, "archive", "build/k8s/pause.tar", "docker-archive tarball to write")
	flag.Parse()
	digest, err := run(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pauseimage: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("image %s\nmanifest digest %s\noci layout %s\ndocker-archive %s\n", o.tag, digest, o.oci, o.archive)
}

type options struct {
	pause, tag, oci, archive string
	epoch                    int64
}

func run(o options) (v1.Hash, error) {
	if o.tag == "" || o.epoch <= 0 {
		return v1.Hash{}, errors.New("-tag and -epoch are required")
	}
	tag, err := name.NewTag(o.tag)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("bad -tag: %w", err)
	}
	bin, err := os.ReadFile(o.pause)
	if err != nil {
		return v1.Hash{}, err
	}
	img, err := build(bin, time.Unix(o.epoch, 0).UTC())
	if err != nil {
		return v1.Hash{}, err
	}
	if err := ociout.Save(o.oci, o.archive, img, tag); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// build assembles the image: the layer is one file, /pause.
func build(pause []byte, created time.Time) (v1.Image, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "pause", Mode: 0o755,
		Size: int64(len(pause)), ModTime: created, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(pause); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	layer, err := ociout.GzipLayer(buf.Bytes())
	if err != nil {
		return nil, err
	}
	cfg := &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			Entrypoint: []string{"/pause"},
			WorkingDir: "/",
			// As upstream's image: the sandbox runs as nobody unless the
			// pod's security context says otherwise.
			User: "65535:65535",
			Labels: map[string]string{
				"org.opencontainers.image.title":       "pause",
				"org.opencontainers.image.description": "the pod sandbox: k8s.io/kubernetes build/pause/linux/pause.c, built by `make k8s-components`",
				"org.opencontainers.image.created":     created.Format(time.RFC3339),
			},
		},
	}
	return ociout.Image(cfg, ociout.Layer{Layer: layer, CreatedBy: "tools/deploy/kubernetes/cluster/pauseimage: /pause"})
}
