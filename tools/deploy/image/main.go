// Command image builds the sandboxd worker image (tools/deploy/image/README.md)
// without Docker: a base layer of files unpacked from a few Debian packages
// (the C library, libseccomp and e2fsprogs' mkfs.ext4 and e2fsck, which the
// dynamically linked sandboxd needs), and a layer with the sandboxd binary.
// Every entry is owned by 0:0 (numerically: no user or group names), has its
// mtime set to SOURCE_DATE_EPOCH and no xattrs, set-id bits or device
// nodes; the layers are written in lexical order with a fixed gzip level,
// so the same inputs give the same digest. The outputs are an OCI image
// layout and a docker-archive (what `ctr images import` and `docker load`
// take), each written beside its final name and renamed into place.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sandboxd/sandboxd/tools/internal/ociout"
)

func main() {
	var o options
	flag.StringVar(&o.base, "base", "", "directory of the unpacked Debian packages (the base layer; required)")
	flag.StringVar(&o.packages, "packages", "", "NAME<TAB>VERSION per line: the packages unpacked in -base (required)")
	flag.StringVar(&o.binary, "binary", "", "the sandboxd binary (required)")
	flag.Int64Var(&o.epoch, "epoch", 0, "SOURCE_DATE_EPOCH: every mtime and the image's creation time (required)")
	flag.StringVar(&o.revision, "revision", "", "source revision label (the git commit)")
	flag.StringVar(&o.oci, "oci", "build/sandboxd-worker.oci", "OCI image layout directory to write")
	flag.StringVar(&o.archive, "archive", "build/sandboxd-worker.tar", "docker-archive tarball to write")
	flag.StringVar(&o.tag, "tag", "sandboxd-worker:latest", "image name and tag")
	flag.Parse()
	digest, err := run(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker-image: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("image %s\nmanifest digest %s\noci layout %s\ndocker-archive %s\n", o.tag, digest, o.oci, o.archive)
}

type options struct {
	base, packages, binary, revision, oci, archive, tag string
	epoch                                               int64
}

// BinaryPath is where the worker binary lives in the image.
const BinaryPath = "usr/local/bin/sandboxd"

func run(o options) (v1.Hash, error) {
	if o.base == "" || o.packages == "" || o.binary == "" || o.epoch <= 0 {
		return v1.Hash{}, errors.New("-base, -packages, -binary and -epoch are required")
	}
	tag, err := name.NewTag(o.tag)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("bad -tag: %w", err)
	}
	versions, err := ociout.ReadPackages(o.packages)
	if err != nil {
		return v1.Hash{}, err
	}
	img, err := build(o, versions)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := ociout.Save(o.oci, o.archive, img, tag); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// build assembles the image in memory (two layers of tens of MB).
func build(o options, versions map[string]string) (v1.Image, error) {
	created := time.Unix(o.epoch, 0).UTC()
	base := &layer{created: created}
	if err := base.addTree(o.base); err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	worker := &layer{created: created}
	for _, d := range []struct {
		name string
		mode int64
	}{
		// Mount points of the hostPath volumes and the ConfigMap
		// (tools/deploy/kubernetes), and a /tmp for the tools.
		{"etc/", 0o755}, {"etc/sandboxd/", 0o755}, {"run/", 0o755}, {"tmp/", 0o1777},
		{"usr/", 0o755}, {"usr/local/", 0o755}, {"usr/local/bin/", 0o755},
		{"var/", 0o755}, {"var/lib/", 0o755}, {"var/lib/sandboxd/", 0o755},
	} {
		worker.dir(d.name, d.mode)
	}
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return nil, err
	}
	worker.file(BinaryPath, 0o755, bin)

	labels := map[string]string{
		"org.opencontainers.image.title":       "sandboxd-worker",
		"org.opencontainers.image.description": "sandboxd supervise serve: one worker per node (tools/deploy/kubernetes); the python runtime image comes from the node (python_image)",
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
		"org.opencontainers.image.base.name":   "debian packages unpacked by tools/deploy/image/build.sh (no base image)",
	}
	if o.revision != "" {
		labels["org.opencontainers.image.revision"] = o.revision
	}
	all := ociout.PackageList(versions)
	labels["org.debian.packages"] = strings.Join(all, " ")
	cfg := &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Entrypoint: []string{"/" + BinaryPath},
			// pid 1 is the supervisor, serve its child: a serve killed by
			// a signal must not leave frozen session kernels that keep the
			// container from stopping (SECURITY.md case 60).
			Cmd:        []string{"supervise", "serve", "--config", "/etc/sandboxd/sandboxd.toml"},
			WorkingDir: "/",
			Labels:     labels,
		},
	}
	var layers []ociout.Layer
	for _, l := range []struct {
		l  *layer
		by string
	}{{base, "tools/deploy/image/build.sh: dpkg-deb -x " + strings.Join(all, " ")}, {worker, "tools/deploy/image: " + BinaryPath}} {
		gz, err := l.l.gzip()
		if err != nil {
			return nil, err
		}
		tl, err := ociout.GzipLayer(gz)
		if err != nil {
			return nil, err
		}
		layers = append(layers, ociout.Layer{Layer: tl, CreatedBy: l.by})
	}
	return ociout.Image(cfg, layers...)
}

// layer is a tar stream built in lexical order of its entries' names.
type layer struct {
	created time.Time
	entries []entry
}

type entry struct {
	hdr  tar.Header
	data []byte
	// inode, when not 0, is the file's on disk: the packages' hard links
	// (mkfs.ext4 is mke2fs) stay links, to the name first in the layer.
	inode uint64
}

func (l *layer) dir(name string, mode int64) {
	l.entries = append(l.entries, entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}})
}

func (l *layer) file(name string, mode int64, data []byte) {
	l.entries = append(l.entries, entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, data: data})
}

// dropped are the parts of the packages a worker never reads: manuals,
// translations, documentation (the copyright files stay: they are the
// packages' licences) and lintian overrides.
func dropped(rel string) bool {
	for _, p := range []string{"usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian"} {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(rel, "usr/share/doc/"); ok {
		_, file, nested := strings.Cut(rest, "/")
		return nested && file != "copyright"
	}
	return false
}

// addTree adds root's entries. Owners, times and everything but the
// permission bits (no set-id) come from the layer, not from the disk; only
// directories, regular files and symlinks are taken (a package's tree has
// nothing else).
func (l *layer) addTree(root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if dropped(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := int64(fi.Mode().Perm())
		switch {
		case fi.IsDir():
			if fi.Mode()&fs.ModeSticky != 0 {
				mode |= 0o1000
			}
			l.dir(rel+"/", mode)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			l.entries = append(l.entries, entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: rel, Linkname: target, Mode: 0o777}})
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			l.file(rel, mode, data)
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				l.entries[len(l.entries)-1].inode = st.Ino
			}
		default:
			return fmt.Errorf("%s: a %s (only directories, files and symlinks belong in the image)", rel, fi.Mode().Type())
		}
		return nil
	})
}

// gzip writes the tar stream and compresses it.
func (l *layer) gzip() ([]byte, error) {
	sort.Slice(l.entries, func(i, j int) bool { return l.entries[i].hdr.Name < l.entries[j].hdr.Name })
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	links := map[uint64]string{}
	for i, e := range l.entries {
		if i > 0 && e.hdr.Name == l.entries[i-1].hdr.Name {
			return nil, fmt.Errorf("%s twice in one layer", e.hdr.Name)
		}
		h := e.hdr
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.ModTime = l.created
		h.Format = tar.FormatPAX
		data := e.data
		if e.inode != 0 {
			if first, ok := links[e.inode]; ok {
				h.Typeflag, h.Linkname, h.Size, data = tar.TypeLink, first, 0, nil
			} else {
				links[e.inode] = h.Name
			}
		}
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("%s: %w", h.Name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
