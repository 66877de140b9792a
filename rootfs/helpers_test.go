package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ent is one crafted tar entry.
type ent struct {
	name     string
	typ      byte
	mode     int64
	body     string
	link     string
	uid, gid int
	pax      map[string]string
	major    int64
}

func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func file(name, body string) ent { return ent{name: name, typ: tar.TypeReg, mode: 0o644, body: body} }
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}
func hardlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, mode: 0o644, link: target}
}

func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.gid,
			PAXRecords: e.pax, Devmajor: e.major, ModTime: time.Unix(1700000000, 0)}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("crafting %q: %v", e.name, err)
		}
		if e.body != "" {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf builds an OCI image whose layers are the given tars (or gzip
// streams), in order.
func imageOf(t testing.TB, layers ...[]byte) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH,
		Config: v1.Config{Env: []string{"PATH=/bin"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range layers {
		if img, err = mutate.AppendLayers(img, layerOf(t, b)); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

// writeLayout saves img as an OCI layout tagged tag and returns the dir.
func writeLayout(t testing.TB, img v1.Image, tag string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img.oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refName: tag})); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeArchive(t testing.TB, img v1.Image) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "img.tar")
	if err := tarball.WriteToFile(path, name.MustParseReference("test/img:latest"), img); err != nil {
		t.Fatal(err)
	}
	return path
}

// world is a scratch area: a cache beside an "outside" directory holding a
// secret that hostile layers aim at. snapshot covers everything but the cache.
type world struct {
	base, outside, secret string
	cache                 *Cache
}

func newWorld(t testing.TB) *world {
	t.Helper()
	base := t.TempDir()
	w := &world{base: base, outside: filepath.Join(base, "outside")}
	w.secret = filepath.Join(w.outside, "secret")
	if err := os.MkdirAll(w.outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.secret, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Open(filepath.Join(base, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	w.cache = c
	return w
}

// snapshot records path, type, mode, size, mtime and content hash of
// everything under base except the cache.
func (w *world) snapshot(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(w.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == w.cache.Dir() {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fmt.Sprintf("%v %d %d", fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			s := sha256.Sum256(b)
			v += " " + hex.EncodeToString(s[:])
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// assertUntouched fails if anything outside the cache changed, or if the
// cache holds anything but what a successful unpack published.
func (w *world) assertUntouched(t testing.TB, before map[string]string) {
	t.Helper()
	after := w.snapshot(t)
	for p, v := range before {
		if after[p] != v {
			t.Errorf("outside the cache, %s changed: %q -> %q", p, v, after[p])
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("outside the cache, %s appeared", p)
		}
	}
	if b, _ := os.ReadFile(w.secret); string(b) != "host secret\n" {
		t.Errorf("secret was changed: %q", b)
	}
	tmps, _ := os.ReadDir(filepath.Join(w.cache.Dir(), "tmp"))
	for _, e := range tmps {
		t.Errorf("cache tmp/ not cleaned: %s", e.Name())
	}
}

func (w *world) assertNothingPublished(t testing.TB) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(w.cache.Dir(), "images"))
	for _, e := range ents {
		t.Errorf("a failed unpack published %s", e.Name())
	}
}

func gzipOf(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

func wantErr(t testing.TB, err error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an error containing %q, got success", substr)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("expected an error containing %q, got: %v", substr, err)
	}
}
