package ociout

import (
	"bytes"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Layer is one layer of an image and the history line that says what
// made it.
type Layer struct {
	Layer     v1.Layer
	CreatedBy string
}

// GzipLayer is an OCI layer of a gzip-compressed tar built in memory.
func GzipLayer(gz []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(gz)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// Image is an OCI image (OCI manifest and config media types) of cfg and
// layers, in order, each with a history entry dated cfg.Created: the
// assembly every image tool of this repository does the same way, so the
// same inputs give the same digest.
func Image(cfg *v1.ConfigFile, layers ...Layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		img, err = mutate.Append(img, mutate.Addendum{Layer: l.Layer, MediaType: types.OCILayer,
			History: v1.History{Created: cfg.Created, CreatedBy: l.CreatedBy}})
		if err != nil {
			return nil, err
		}
	}
	return img, nil
}
