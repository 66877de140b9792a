package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Reference prefixes accepted by Resolve besides plain registry references.
const (
	OCILayoutPrefix     = "oci-layout:"
	DockerArchivePrefix = "docker-archive:"
)

// refName is the OCI annotation that names a manifest inside a layout's index.
const refName = "org.opencontainers.image.ref.name"

// Resolve opens the image named by ref without reading its layers:
//
//	oci-layout:PATH[:TAG]   an OCI image layout directory; TAG selects the
//	                        manifest by its org.opencontainers.image.ref.name
//	                        and may be left out when the layout holds one image
//	docker-archive:PATH     a `docker save` tarball holding one image
//	anything else           a registry reference (name[:tag][@digest]), pulled
//	                        with go-containerregistry
//
// The manifest is checked against the digest its index (or the reference)
// names, so the returned image's Digest is the verified content address.
func Resolve(ctx context.Context, ref string) (v1.Image, error) {
	switch {
	case strings.HasPrefix(ref, OCILayoutPrefix):
		return resolveLayout(strings.TrimPrefix(ref, OCILayoutPrefix))
	case strings.HasPrefix(ref, DockerArchivePrefix):
		path := strings.TrimPrefix(ref, DockerArchivePrefix)
		if path == "" {
			return nil, errors.New("docker-archive: needs a path, e.g. docker-archive:build/python-runtime.tar")
		}
		img, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			return nil, fmt.Errorf("docker-archive %s: %w", path, err)
		}
		return img, nil
	case ref == "":
		return nil, errors.New("empty image reference (want oci-layout:PATH[:TAG], docker-archive:PATH or a registry reference)")
	default:
		return resolveRemote(ctx, ref)
	}
}

func resolveRemote(ctx context.Context, ref string) (v1.Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("bad image reference %q (want oci-layout:PATH[:TAG], docker-archive:PATH or a registry reference): %w", ref, err)
	}
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(hostPlatform()))
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w (registry pulls need network access to %s; offline, use oci-layout:PATH or docker-archive:PATH)",
			ref, err, r.Context().RegistryStr())
	}
	if d, ok := r.(name.Digest); ok {
		if err := checkManifestDigest(img, d.DigestStr()); err != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, err)
		}
	}
	return img, nil
}

func hostPlatform() v1.Platform { return v1.Platform{OS: "linux", Architecture: runtime.GOARCH} }

// splitLayoutRef splits PATH[:TAG]. A path may itself contain ':', so the
// whole string wins when it names an existing directory.
func splitLayoutRef(s string) (path, tag string) {
	if fi, err := os.Stat(s); err == nil && fi.IsDir() {
		return s, ""
	}
	if i := strings.LastIndexByte(s, ':'); i > 0 && !strings.Contains(s[i+1:], "/") {
		return s[:i], s[i+1:]
	}
	return s, ""
}

func resolveLayout(s string) (v1.Image, error) {
	path, tag := splitLayoutRef(s)
	if path == "" {
		return nil, errors.New("oci-layout: needs a path, e.g. oci-layout:build/python-runtime.oci")
	}
	idx, err := layout.ImageIndexFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("oci-layout %s: %w", path, err)
	}
	img, err := pickFromIndex(idx, tag, 0)
	if err != nil {
		return nil, fmt.Errorf("oci-layout %s: %w", s, err)
	}
	return img, nil
}

// pickFromIndex selects the image named tag (any when tag is empty and there
// is exactly one) for this host's platform, descending into nested indexes.
func pickFromIndex(idx v1.ImageIndex, tag string, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("image indexes nested deeper than 4 levels")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var cands []v1.Descriptor
	var names []string
	for _, d := range im.Manifests {
		n := d.Annotations[refName]
		if n != "" {
			names = append(names, n)
		}
		if tag != "" && depth == 0 && n != tag && !strings.HasSuffix(n, ":"+tag) {
			continue
		}
		if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != runtime.GOARCH) {
			continue
		}
		cands = append(cands, d)
	}
	switch {
	case len(cands) == 0 && tag != "" && depth == 0:
		return nil, fmt.Errorf("no image tagged %q (tags: %s)", tag, strings.Join(names, ", "))
	case len(cands) == 0:
		return nil, fmt.Errorf("no image for linux/%s in the index", runtime.GOARCH)
	case len(cands) > 1:
		return nil, fmt.Errorf("%d images match; name one with :TAG (tags: %s)", len(cands), strings.Join(names, ", "))
	}
	d := cands[0]
	switch d.MediaType {
	case types.OCIImageIndex, types.DockerManifestList:
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		raw, err := child.RawManifest()
		if err != nil {
			return nil, err
		}
		if got := sha256Hex(raw); got != d.Digest.Hex {
			return nil, fmt.Errorf("index %s: blob hashes to sha256:%s (tampered or corrupt)", d.Digest, got)
		}
		return pickFromIndex(child, tag, depth+1)
	case types.OCIManifestSchema1, types.DockerManifestSchema2:
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		if err := checkManifestDigest(img, d.Digest.String()); err != nil {
			return nil, err
		}
		return img, nil
	default:
		return nil, fmt.Errorf("unsupported manifest media type %q", d.MediaType)
	}
}

// checkManifestDigest verifies that the manifest bytes hash to want, the
// digest that whoever pointed at it (an index, a digest reference) named.
func checkManifestDigest(img v1.Image, want string) error {
	raw, err := img.RawManifest()
	if err != nil {
		return err
	}
	if got := "sha256:" + sha256Hex(raw); got != want {
		return fmt.Errorf("manifest digest mismatch: expected %s, content hashes to %s (tampered or corrupt)", want, got)
	}
	return nil
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
