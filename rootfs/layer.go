package rootfs

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"golang.org/x/sys/unix"
)

// Limits bound what one image may expand to, so that a gzip bomb or a tar of
// millions of empty files fails with an error instead of filling the disk.
type Limits struct {
	// MaxBytes caps both the uncompressed tar stream of all layers together
	// and the sum of the sizes of all regular files written (sparse entries
	// would otherwise expand without streaming the bytes).
	MaxBytes int64
	// MaxFiles caps the number of tar entries over all layers.
	MaxFiles int64
}

// DefaultLimits fit the python-runtime image (about 0.6 GB, 40k entries) with
// a wide margin.
var DefaultLimits = Limits{MaxBytes: 8 << 30, MaxFiles: 1_000_000}

// maxDropped caps how many dropped entries are remembered by name.
const maxDropped = 100

// extractor applies untrusted layers to a private directory. It never follows
// a symlink while writing: every parent of an entry must be a real directory
// that it created or checked itself, and every operation goes through an
// os.Root as a second fence, so no entry can reach outside the root.
type extractor struct {
	root   *os.Root
	limits Limits

	streamBytes int64 // uncompressed tar bytes read, all layers
	fileBytes   int64 // regular file bytes written, all layers
	entries     int64 // tar entries seen, all layers

	dirs     map[string]bool        // paths checked to be real directories
	dirModes map[string]fs.FileMode // final modes, applied by finish
	current  map[string]bool        // paths written by the layer being applied

	dropped      []string
	droppedCount int

	// Progress reporting (Cache.Progress; nil: none).
	progress      func(Progress)
	digest        string
	start         time.Time
	layer, layers int
	blobTotal     int64
	blobDone      int64           // compressed bytes of the layers done
	blob          *countingReader // the layer being applied
}

func newExtractor(dir string, limits Limits) (*extractor, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &extractor{
		root:     r,
		limits:   limits,
		dirs:     map[string]bool{".": true},
		dirModes: map[string]fs.FileMode{},
	}, nil
}

func (e *extractor) close() error { return e.root.Close() }

func (e *extractor) drop(name, why string) {
	e.droppedCount++
	if len(e.dropped) < maxDropped {
		e.dropped = append(e.dropped, name+": "+why)
	}
}

// layerInput is one layer with the digests the manifest and config promise.
type layerInput struct {
	layer     v1.Layer
	mediaType types.MediaType
	digest    v1.Hash // of the blob as stored (manifest)
	size      int64   // of the blob as stored (manifest)
	diffID    v1.Hash // of the uncompressed tar (config)
}

var errTooBig = errors.New("image expands beyond the byte limit (gzip bomb?)")

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// apply extracts one layer. Both digests are checked over the whole blob
// after extraction; on a mismatch the caller throws the tree away, so nothing
// of a tampered layer is ever published.
func (e *extractor) apply(ctx context.Context, i int, in layerInput) error {
	switch in.mediaType {
	case types.OCILayer, types.OCIUncompressedLayer, types.OCILayerZStd, types.DockerLayer,
		types.DockerUncompressedLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
	default:
		return fmt.Errorf("layer %d: unsupported media type %q", i, in.mediaType)
	}
	rc, err := in.layer.Compressed()
	if err != nil {
		return fmt.Errorf("layer %d (%s): %w", i, in.digest, err)
	}
	defer rc.Close()

	blobHash := sha256.New()
	blob := &countingReader{r: rc, h: blobHash, max: in.size}
	e.layer, e.blob = i+1, blob
	defer func() { e.blobDone += blob.n; e.blob = nil }()
	e.report(ProgressLayer)
	br := bufio.NewReaderSize(blob, 1<<20)
	magic, _ := br.Peek(4)
	var tarStream io.Reader = br
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("layer %d (%s): gzip: %w", i, in.digest, err)
		}
		defer zr.Close()
		tarStream = zr
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
		if err != nil {
			return fmt.Errorf("layer %d (%s): zstd: %w", i, in.digest, err)
		}
		defer zr.Close()
		tarStream = zr
	}
	diffHash := sha256.New()
	tarR := &countingReader{r: tarStream, h: diffHash, total: &e.streamBytes, limit: e.limits.MaxBytes}

	e.current = map[string]bool{}
	if err := e.applyTar(ctx, tarR); err != nil {
		return fmt.Errorf("layer %d (%s): %w", i, in.digest, err)
	}
	// The tar may end before its stream does (padding after the end
	// blocks, a trailing gzip member): hash everything.
	if _, err := io.Copy(io.Discard, tarR); err != nil {
		return fmt.Errorf("layer %d (%s): %w", i, in.digest, err)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return fmt.Errorf("layer %d (%s): %w", i, in.digest, err)
	}
	if got := hex.EncodeToString(blobHash.Sum(nil)); got != in.digest.Hex {
		return fmt.Errorf("layer %d: digest mismatch: manifest says %s, blob hashes to sha256:%s (tampered or corrupt)", i, in.digest, got)
	}
	if in.size > 0 && blob.n != in.size {
		return fmt.Errorf("layer %d (%s): blob is %d bytes, manifest says %d", i, in.digest, blob.n, in.size)
	}
	if got := hex.EncodeToString(diffHash.Sum(nil)); got != in.diffID.Hex {
		return fmt.Errorf("layer %d (%s): diff_id mismatch: config says %s, tar hashes to sha256:%s", i, in.digest, in.diffID, got)
	}
	return nil
}

var errBlobTooBig = errors.New("blob is larger than its manifest descriptor says")

// countingReader hashes and counts what passes through and enforces caps.
type countingReader struct {
	r     io.Reader
	h     hash.Hash
	n     int64
	max   int64  // this reader's own cap (0: none): the descriptor size
	total *int64 // shared running total, checked against limit
	limit int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.h.Write(p[:n])
		c.n += int64(n)
		if c.max > 0 && c.n > c.max {
			return n, errBlobTooBig
		}
		if c.total != nil {
			*c.total += int64(n)
			if *c.total > c.limit {
				return n, errTooBig
			}
		}
	}
	return n, err
}

func (e *extractor) applyTar(ctx context.Context, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("tar: %w", err)
		}
		e.entries++
		if e.entries > e.limits.MaxFiles {
			return fmt.Errorf("image has more than %d entries (file count limit)", e.limits.MaxFiles)
		}
		if err := e.entry(hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		e.report(ProgressUpdate)
	}
}

// cleanName turns a tar entry name into a clean relative path, refusing the
// names that point outside the root ("tar slip"; CVE-2014-9356-class
// absolute paths, ../ traversal).
func cleanName(n string) (string, error) {
	switch {
	case n == "":
		return "", errors.New("empty name")
	case strings.IndexByte(n, 0) >= 0:
		return "", errors.New("NUL byte in name")
	case strings.HasPrefix(n, "/"):
		return "", errors.New("absolute name refused (would escape the root)")
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", errors.New("'..' component refused (path traversal out of the root)")
		}
	}
	return path.Clean(n), nil
}

func (e *extractor) entry(hdr *tar.Header, tr *tar.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("the root itself can only be a directory")
		}
		return nil // the root's own mode is ours to choose
	}
	parent, base := path.Split(name)
	parent = path.Clean(parent)
	for _, c := range strings.Split(parent, "/") {
		if strings.HasPrefix(c, ".wh.") {
			return errors.New("bad whiteout: a whiteout name used as a directory")
		}
	}
	if strings.HasPrefix(base, ".wh.") {
		return e.whiteout(parent, base, hdr)
	}

	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			// security.capability would grant file capabilities; other
			// xattrs (security.*, trusted.*, user.*) have no business in
			// a read-only sandbox root either.
			e.drop(name, "xattr "+strings.TrimPrefix(k, "SCHILY.xattr.")+" dropped")
		}
	}
	if hdr.Mode&(cISUID|cISGID) != 0 && hdr.Typeflag != tar.TypeDir {
		e.drop(name, "setuid/setgid bit dropped")
	}

	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		// A device node in the rootfs would give whoever can open it raw
		// access to host hardware; the sandbox builds its own minimal /dev.
		e.drop(name, "device node dropped")
		return nil
	case tar.TypeFifo:
		e.drop(name, "fifo dropped")
		return nil
	}

	if err := e.mkParents(parent); err != nil {
		return err
	}
	e.current[name] = true

	switch hdr.Typeflag {
	case tar.TypeDir:
		fi, err := e.root.Lstat(name)
		switch {
		case err == nil && fi.IsDir():
		case err == nil:
			if err := e.remove(name); err != nil {
				return err
			}
			fallthrough
		case errors.Is(err, fs.ErrNotExist):
			if err := e.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		default:
			return err
		}
		e.dirs[name] = true
		e.dirModes[name] = sandboxMode(hdr.Mode, hdr.Uid, hdr.Gid, true)
		return nil

	case tar.TypeReg, tar.TypeRegA:
		if err := e.remove(name); err != nil {
			return err
		}
		e.fileBytes += hdr.Size
		if hdr.Size < 0 || e.fileBytes > e.limits.MaxBytes {
			return errTooBig
		}
		// O_EXCL: the name was just removed, so this creates a new inode
		// and never writes through a symlink or into a hardlinked file.
		f, err := e.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		bp := copyBufs.Get().(*[]byte)
		n, err := io.CopyBuffer(onlyWriter{f}, io.LimitReader(tr, hdr.Size), *bp)
		copyBufs.Put(bp)
		if err == nil && n != hdr.Size {
			err = io.ErrUnexpectedEOF
		}
		if err == nil {
			err = f.Chmod(sandboxMode(hdr.Mode, hdr.Uid, hdr.Gid, false))
		}
		if err == nil {
			err = futimens(f, hdr.ModTime)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err

	case tar.TypeSymlink:
		// The target is stored verbatim: it is only ever resolved inside
		// the sandbox, where "/" is this rootfs. We never follow it here.
		if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 || len(hdr.Linkname) >= 4096 {
			return errors.New("bad symlink target")
		}
		if err := e.remove(name); err != nil {
			return err
		}
		return e.root.Symlink(hdr.Linkname, name)

	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hardlink target %q: %w (hardlink out of the root, CVE-2014-6407)", hdr.Linkname, err)
		}
		if target == name {
			return errors.New("hardlink to itself")
		}
		if err := e.checkParents(path.Dir(target)); err != nil {
			return fmt.Errorf("hardlink target %q: %w", hdr.Linkname, err)
		}
		fi, err := e.root.Lstat(target)
		if err != nil {
			return fmt.Errorf("hardlink target %q: %w", hdr.Linkname, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("hardlink target %q is not a regular file", hdr.Linkname)
		}
		if err := e.remove(name); err != nil {
			return err
		}
		return e.root.Link(target, name)

	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
}

const cISUID, cISGID, cISVTX = 0o4000, 0o2000, 0o1000

// sandboxMode is the permission a published entry gets. Everything in the
// cache belongs to host root; inside the sandbox the code runs as
// inside.UID:inside.GID (host base+UID) and container root is an
// unprivileged host uid, so both see files through the group/other bits.
// Those get exactly the access that uid and gid had in the image, never write (no host user
// may change the cache); set-id bits are dropped (no privilege gain).
func sandboxMode(mode int64, uid, gid int, dir bool) fs.FileMode {
	owner := (mode >> 6) & 7
	var sb int64
	switch {
	case uid == inside.UID:
		sb = owner
	case gid == inside.GID:
		sb = (mode >> 3) & 7
	default:
		sb = mode & 7
	}
	sb &^= 2
	m := fs.FileMode(owner<<6 | sb<<3 | sb)
	if dir {
		m |= 0o700 // we own it; keeps the tree removable without chmod
		if mode&cISVTX != 0 {
			m |= fs.ModeSticky
		}
	}
	return m
}

// mkParents makes sure every component of dir is a real directory, creating
// missing ones. A symlink on the way is refused: a layer that plants
// "x -> /etc" and then writes "x/passwd" must not reach the host
// (symlink-then-write-through, CVE-2014-6407).
func (e *extractor) mkParents(dir string) error {
	if e.dirs[dir] {
		return nil
	}
	if err := e.mkParents(path.Dir(dir)); err != nil {
		return err
	}
	fi, err := e.root.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := e.root.Mkdir(dir, 0o700); err != nil {
			return err
		}
		e.dirModes[dir] = 0o755
	case err != nil:
		return err
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("parent %q is a symlink: refusing to write through it (symlink-then-write-through, CVE-2014-6407)", dir)
	case !fi.IsDir():
		return fmt.Errorf("parent %q is not a directory", dir)
	}
	e.dirs[dir] = true
	return nil
}

// checkParents is mkParents without creating: missing is an error.
func (e *extractor) checkParents(dir string) error {
	if e.dirs[dir] {
		return nil
	}
	if err := e.checkParents(path.Dir(dir)); err != nil {
		return err
	}
	fi, err := e.root.Lstat(dir)
	switch {
	case err != nil:
		return err
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("parent %q is a symlink: refusing to resolve through it (CVE-2014-6407)", dir)
	case !fi.IsDir():
		return fmt.Errorf("parent %q is not a directory", dir)
	}
	e.dirs[dir] = true
	return nil
}

// remove deletes whatever is at name (a lower layer's file, link or tree).
func (e *extractor) remove(name string) error {
	fi, err := e.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		e.forget(name)
	}
	return e.root.RemoveAll(name)
}

// forget drops name and everything below it from the directory caches.
func (e *extractor) forget(name string) {
	prefix := name + "/"
	for k := range e.dirs {
		if k == name || strings.HasPrefix(k, prefix) {
			delete(e.dirs, k)
		}
	}
	for k := range e.dirModes {
		if k == name || strings.HasPrefix(k, prefix) {
			delete(e.dirModes, k)
		}
	}
}

// whiteout applies an OCI whiteout: ".wh.NAME" deletes NAME from lower
// layers, ".wh..wh..opq" empties its directory of lower-layer content.
func (e *extractor) whiteout(parent, base string, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeDir {
		return errors.New("bad whiteout: a directory")
	}
	if base == ".wh..wh..opq" {
		if err := e.mkParents(parent); err != nil {
			return err
		}
		return e.removeLower(parent)
	}
	if strings.HasPrefix(base, ".wh..wh.") {
		return fmt.Errorf("bad whiteout: unknown reserved name %q", base)
	}
	target := strings.TrimPrefix(base, ".wh.")
	if target == "" || target == "." || target == ".." {
		return fmt.Errorf("bad whiteout %q: names no file", base)
	}
	if err := e.checkParents(parent); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // nothing there to hide
		}
		return fmt.Errorf("bad whiteout: %w", err)
	}
	full := path.Join(parent, target)
	if e.current[full] {
		return nil // same-layer content is not hidden by its own whiteout
	}
	return e.remove(full)
}

// removeLower deletes everything in dir that the current layer did not write.
func (e *extractor) removeLower(dir string) error {
	f, err := e.root.Open(dir)
	if err != nil {
		return err
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, ent := range ents {
		p := path.Join(dir, ent.Name())
		if !e.current[p] {
			if err := e.remove(p); err != nil {
				return err
			}
		} else if ent.IsDir() {
			if err := e.removeLower(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// MountPoints are the directories the sandbox mounts over (proc, a tmpfs
// /dev, sysfs, a tmpfs /tmp, the workspace bind). finish creates the missing
// ones: on a read-only root the sandbox could not create them, and it must
// never write into a published tree anyway.
var MountPoints = []string{"dev", "proc", "sys", "tmp", "workspace"}

// finish applies directory modes (deepest first, so a parent may become
// read-only after its children are done).
func (e *extractor) finish() error {
	for _, m := range MountPoints {
		if _, err := e.root.Lstat(m); errors.Is(err, fs.ErrNotExist) {
			if err := e.root.Mkdir(m, 0o700); err != nil {
				return err
			}
			e.dirModes[m] = 0o755
		}
	}
	names := make([]string, 0, len(e.dirModes))
	for n := range e.dirModes {
		names = append(names, n)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	for _, n := range names {
		if err := e.root.Chmod(n, e.dirModes[n]); err != nil {
			return err
		}
	}
	return e.root.Chmod(".", 0o755)
}

// onlyWriter hides *os.File's ReadFrom so CopyBuffer uses our buffer.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

// futimens sets a file's times through its descriptor (no path, no race).
func futimens(f *os.File, t time.Time) error {
	if t.IsZero() {
		return nil
	}
	ts := []unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, f.Fd(), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("futimens: %w", errno)
	}
	return nil
}
