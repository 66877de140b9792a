// Command runtime-image turns the root filesystem that build.sh made with
// mmdebstrap into the python-runtime OCI image: one gzip layer written in a
// fixed order with clamped timestamps (reproducible for a given rootfs), saved
// as an OCI image layout and as a docker-archive that `docker load` accepts.
// Both outputs are written beside their final name and renamed into place, so
// a failed build never leaves a half-written image that make takes as done.
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/tools/internal/ociout"
)

func main() {
	var o options
	flag.StringVar(&o.rootfs, "rootfs", "", "root filesystem made by mmdebstrap (required)")
	flag.StringVar(&o.packages, "packages", "", "dpkg-query list: NAME<TAB>VERSION per line (required)")
	flag.StringVar(&o.labelPackages, "label-packages", "", "comma-separated packages that get one label each")
	flag.Int64Var(&o.epoch, "epoch", 0, "SOURCE_DATE_EPOCH: image creation time and mtime clamp (required)")
	flag.StringVar(&o.oci, "oci", "build/python-runtime.oci", "OCI image layout directory to write")
	flag.StringVar(&o.archive, "archive", "build/python-runtime.tar", "docker-archive tarball to write")
	flag.StringVar(&o.tag, "tag", "python-runtime:latest", "image name and tag")
	flag.StringVar(&o.title, "title", "python-runtime", "image title label (the variant's name)")
	flag.StringVar(&o.suite, "suite", "", "the Debian suite the rootfs was built from (base name label; required)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "runtime-image: %v\n", err)
		os.Exit(1)
	}
}

type options struct {
	rootfs, packages, labelPackages, oci, archive, tag, title, suite string
	epoch                                                            int64
}

func run(o options) error {
	if o.rootfs == "" || o.packages == "" || o.suite == "" || o.epoch <= 0 {
		return errors.New("-rootfs, -packages, -suite and -epoch are required")
	}
	tag, err := name.NewTag(o.tag)
	if err != nil {
		return fmt.Errorf("bad -tag: %w", err)
	}
	versions, err := ociout.ReadPackages(o.packages)
	if err != nil {
		return err
	}
	created := time.Unix(o.epoch, 0).UTC()

	start := time.Now()
	layerPath := o.oci + ".layer.tar.gz"
	defer os.Remove(layerPath)
	m := progress.NewMeter(os.Stderr, progress.IsTerminal(os.Stderr))
	total, err := measure(o.rootfs)
	if err != nil {
		return err
	}
	m.Line("runtime-image: writing the layer: %d entries, ~%s of tar", total.entries, progress.Bytes(total.uncompressed))
	st, err := writeLayer(o.rootfs, layerPath, created, func(done layerStats) {
		m.Status(progress.Status{Label: "layer", Done: done.uncompressed, Total: total.uncompressed,
			Bytes: done.uncompressed, Entries: done.entries, TotalEntries: total.entries, Elapsed: time.Since(start)})
	})
	m.Clear()
	if err != nil {
		return err
	}
	m.Line("layer: %d entries, %d bytes uncompressed, %d gzip, dropped %d, in %s",
		st.entries, st.uncompressed, st.compressed, len(st.dropped), time.Since(start).Round(time.Millisecond))
	for _, d := range st.dropped {
		fmt.Fprintf(os.Stderr, "  dropped %s\n", d)
	}

	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	if d, _ := layer.Digest(); d.Hex != st.digest {
		return fmt.Errorf("layer digest changed between write and read: %s vs sha256:%s", d, st.digest)
	}

	img, err := buildImage(layer, versions, o, created)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if err := ociout.Save(o.oci, o.archive, img, tag); err != nil {
		return err
	}
	fmt.Printf("image %s\nmanifest digest %s\nlayer digest sha256:%s (%d bytes)\noci layout %s\ndocker-archive %s\n",
		tag, digest, st.digest, st.compressed, o.oci, o.archive)
	return nil
}

func buildImage(layer v1.Layer, versions map[string]string, o options, created time.Time) (v1.Image, error) {
	labels := map[string]string{
		"org.opencontainers.image.title":       o.title,
		"org.opencontainers.image.description": "sandboxd python runtime: Debian python3 data stack",
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
		"org.opencontainers.image.base.name":   "debian:" + o.suite + " (mmdebstrap --variant=essential)",
	}
	for _, p := range strings.Split(o.labelPackages, ",") {
		if p == "" {
			continue
		}
		v, ok := versions[p]
		if !ok {
			return nil, fmt.Errorf("package %s is not installed in the rootfs", p)
		}
		labels["org.debian.package."+p] = v
	}
	labels["org.debian.packages"] = strings.Join(ociout.PackageList(versions), " ")

	cfg := &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"LANG=C.UTF-8",
				"MPLBACKEND=Agg",
				"PYTHONDONTWRITEBYTECODE=1",
			},
			User:       fmt.Sprintf("%d:%d", inside.UID, inside.GID),
			WorkingDir: inside.Workspace,
			Cmd:        []string{"python3"},
			Labels:     labels,
		},
	}
	return ociout.Image(cfg, ociout.Layer{Layer: layer,
		CreatedBy: "tools/runtime-image/build.sh (mmdebstrap " + o.suite + ")"})
}

type layerStats struct {
	entries, uncompressed, compressed int64
	digest                            string
	dropped                           []string
}

// writeLayer tars rootfs in lexical order. Timestamps are clamped to created;
// owners are kept numerically (no names); setuid/setgid bits, device nodes,
// FIFOs, sockets and all xattrs (so file capabilities) are left out: the image
// must not carry anything that grants privileges.
//
// progress, when not nil, is called after each entry with the counts so far
// (uncompressed: the tar stream).
func writeLayer(rootfs, out string, created time.Time, progress func(layerStats)) (st layerStats, err error) {
	f, err := os.Create(out)
	if err != nil {
		return st, err
	}
	defer f.Close()
	zsum := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, zsum)}
	zw, err := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
	if err != nil {
		return st, err
	}
	usum := sha256.New()
	uw := &countWriter{w: io.MultiWriter(zw, usum)}
	tw := tar.NewWriter(uw)

	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err = filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rootfs, path)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		sys := fi.Sys().(*syscall.Stat_t)
		hdr := &tar.Header{
			Name:    filepath.ToSlash(rel),
			Mode:    int64(fi.Mode().Perm()),
			Uid:     int(sys.Uid),
			Gid:     int(sys.Gid),
			ModTime: fi.ModTime(),
			Format:  tar.FormatPAX,
		}
		if hdr.ModTime.After(created) {
			hdr.ModTime = created
		}
		if fi.Mode()&fs.ModeSticky != 0 && fi.IsDir() {
			hdr.Mode |= 01000 // /tmp-style dirs keep their sticky bit
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			st.dropped = append(st.dropped, rel+" (setuid/setgid bit)")
		}
		switch {
		case fi.IsDir():
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case fi.Mode()&fs.ModeSymlink != 0:
			hdr.Typeflag = tar.TypeSymlink
			if hdr.Linkname, err = os.Readlink(path); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			key := inode{uint64(sys.Dev), sys.Ino}
			if first, ok := seen[key]; ok && sys.Nlink > 1 {
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = first
				break
			}
			seen[key] = hdr.Name
			hdr.Typeflag = tar.TypeReg
			hdr.Size = fi.Size()
		default:
			st.dropped = append(st.dropped, rel+" ("+fi.Mode().Type().String()+")")
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		st.entries++
		if hdr.Typeflag == tar.TypeReg {
			src, err := os.Open(path)
			if err != nil {
				return err
			}
			n, err := io.Copy(tw, src)
			src.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			if n != hdr.Size {
				return fmt.Errorf("%s: changed while being read", rel)
			}
		}
		if progress != nil {
			progress(layerStats{entries: st.entries, uncompressed: uw.n})
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("tar %s: %w", rootfs, err)
	}
	if err := tw.Close(); err != nil {
		return st, err
	}
	if err := zw.Close(); err != nil {
		return st, err
	}
	if err := f.Close(); err != nil {
		return st, err
	}
	st.uncompressed, st.compressed = uw.n, cw.n
	st.digest = hex.EncodeToString(zsum.Sum(nil))
	return st, nil
}

// measure estimates the entries and tar bytes writeLayer will write (one
// header block per entry, file data in 512-byte blocks, hardlinks once; PAX
// records aside), for its percentage and ETA: a stat of each entry, well
// under a second against 10-30 s of gzip.
func measure(rootfs string) (st layerStats, err error) {
	seen := map[uint64]bool{}
	err = filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == rootfs {
			return err
		}
		st.entries++
		st.uncompressed += 512
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if ino := fi.Sys().(*syscall.Stat_t).Ino; !seen[ino] {
				seen[ino] = true
				st.uncompressed += (fi.Size() + 511) &^ 511
			}
		}
		return nil
	})
	return st, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
