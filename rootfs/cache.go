// Package rootfs turns OCI images into read-only root filesystems for the
// sandbox, without trusting anything inside them.
//
// A Cache is a directory:
//
//	DIR/images/sha256-<hex>/rootfs      a published tree, never written again
//	DIR/images/sha256-<hex>/image.json  what it is (Image, as JSON)
//	DIR/tmp/                            unpacks in progress (0700)
//	DIR/locks/sha256-<hex>.lock         flock: one unpack per digest at a time
//	DIR/locks/sha256-<hex>.use          flock, shared: the image is in use
//
// Trees are keyed by manifest digest and appear only by one atomic rename of a
// complete, verified tree; a failed unpack removes its temporary directory, and
// a crashed one is swept by the next unpack of that digest or by GC. GC
// removes a tree only while it can lock both files exclusively.
package rootfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Cache is a content-addressed store of unpacked images. Its methods are safe
// for concurrent use, also by several processes sharing the directory.
type Cache struct {
	dir string
	// Limits bound every unpack; Open sets DefaultLimits.
	Limits Limits
	// Progress, when set, is told how an unpack proceeds (see Progress);
	// concurrent unpacks call it concurrently. It runs on the unpacking
	// goroutine, so it must be quick. Set it before the first Unpack.
	Progress func(Progress)
}

// Image is one unpacked image.
type Image struct {
	// Digest is the manifest digest, "sha256:<hex>": the cache key.
	Digest string `json:"digest"`
	// RootfsPath is the published tree, to be mounted read-only.
	RootfsPath string `json:"-"`
	// Ref is the reference it was first unpacked from.
	Ref string `json:"ref"`
	// Config is the config blob digest; Env and User come from it.
	Config string   `json:"config"`
	Env    []string `json:"env,omitempty"`
	User   string   `json:"user,omitempty"`
	// Labels are the config's labels (the package versions of our images,
	// org.debian.package.NAME=VERSION): what GET /v1/runtimes shows. Never
	// nil once read: an image.json written before labels were kept has
	// none, and the cache reads them from the config blob then.
	Labels map[string]string `json:"labels"`
	// Layers are the layer blob digests, in order.
	Layers []string `json:"layers"`
	// Entries and Bytes are the tar entries and uncompressed bytes applied.
	Entries int64 `json:"entries"`
	Bytes   int64 `json:"bytes"`
	// Dropped lists entries that were left out or changed (device nodes,
	// set-id bits, xattrs); at most 100 names, DroppedCount counts all.
	Dropped      []string  `json:"dropped,omitempty"`
	DroppedCount int       `json:"dropped_count"`
	UnpackedAt   time.Time `json:"unpacked_at"`
	// Cached is true when Unpack found the image already published.
	Cached bool `json:"-"`
}

// Open opens (creating it if needed) the cache in dir. The directory and the
// published trees are world-traversable: the sandbox's mapped root must be
// able to reach a rootfs to mount it. In-progress work and locks are 0700.
func Open(dir string) (*Cache, error) {
	if dir == "" {
		return nil, errors.New("rootfs cache: empty directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("rootfs cache %s: %w", dir, err)
	}
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{abs, 0o755}, {filepath.Join(abs, "images"), 0o755}, {filepath.Join(abs, "tmp"), 0o700}, {filepath.Join(abs, "locks"), 0o700}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("rootfs cache: %w", err)
		}
		fi, err := os.Lstat(d.path)
		if err != nil {
			return nil, fmt.Errorf("rootfs cache: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("rootfs cache: %s is not a directory", d.path)
		}
	}
	return &Cache{dir: abs, Limits: DefaultLimits}, nil
}

// CheckReachable reports whether every directory from / down to the cache
// lets other users search it. The sandbox's root maps to an unprivileged host
// uid, which must be able to reach a published rootfs to mount it; a cache
// under a 0700 directory fails at sandbox start with "permission denied".
func (c *Cache) CheckReachable() error {
	for d := c.dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("rootfs cache %s: %s is mode %v; the sandbox cannot reach the rootfs (needs o+x on every parent)", c.dir, d, fi.Mode().Perm())
		}
		if d == "/" {
			return nil
		}
	}
}

// Dir is the cache's absolute directory.
func (c *Cache) Dir() string { return c.dir }

func keyOf(digest string) (string, error) {
	hexPart, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexPart) != 64 || strings.Trim(hexPart, "0123456789abcdef") != "" {
		return "", fmt.Errorf("bad digest %q (want sha256:<64 hex>)", digest)
	}
	return "sha256-" + hexPart, nil
}

// Lookup returns the published image with this manifest digest.
func (c *Cache) Lookup(digest string) (Image, bool) {
	key, err := keyOf(digest)
	if err != nil {
		return Image{}, false
	}
	img, err := c.readPublished(key)
	return img, err == nil
}

func (c *Cache) readPublished(key string) (Image, error) {
	dir := filepath.Join(c.dir, "images", key)
	data, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		return Image{}, err
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil {
		return Image{}, fmt.Errorf("%s/image.json: %w", dir, err)
	}
	if k, err := keyOf(img.Digest); err != nil || k != key {
		return Image{}, fmt.Errorf("%s/image.json names %q", dir, img.Digest)
	}
	img.RootfsPath = filepath.Join(dir, "rootfs")
	return img, nil
}

// Unpack makes the image named by ref (see Resolve) available as a read-only
// rootfs and returns it. When the digest is already published this only
// resolves the reference and reads image.json. Concurrent calls for one
// digest, in any process, unpack it once; the others wait and share it.
func (c *Cache) Unpack(ctx context.Context, ref string) (Image, error) {
	img, err := Resolve(ctx, ref)
	if err != nil {
		return Image{}, err
	}
	return c.UnpackImage(ctx, ref, img)
}

// UnpackAndUse is Unpack that returns with the image already marked in use
// (see Use), so no GC can remove it between the unpack and its use.
func (c *Cache) UnpackAndUse(ctx context.Context, ref string) (Image, func(), error) {
	img, err := Resolve(ctx, ref)
	if err != nil {
		return Image{}, nil, err
	}
	return c.UnpackImageAndUse(ctx, ref, img)
}

// testHookUnpacked, when set, runs in UnpackImageAndUse after the unpack and
// before it returns: where `serve` used to release the unpack's lock and
// then take the in-use hold.
var testHookUnpacked func()

// UnpackImageAndUse is UnpackAndUse for an image already resolved. The
// in-use hold is taken first, before the cache is even looked at, and GC
// removes nothing held (SECURITY.md case 36): there is no moment between
// publishing (or finding) the tree and holding it.
func (c *Cache) UnpackImageAndUse(ctx context.Context, ref string, img v1.Image) (Image, func(), error) {
	key, err := imageKey(ref, img)
	if err != nil {
		return Image{}, nil, err
	}
	release, err := c.lock(ctx, key+".use", unix.LOCK_SH)
	if err != nil {
		return Image{}, nil, fmt.Errorf("unpack %s: %w", ref, err)
	}
	meta, err := c.UnpackImage(ctx, ref, img)
	if err != nil {
		release()
		return Image{}, nil, err
	}
	if testHookUnpacked != nil {
		testHookUnpacked()
	}
	return meta, release, nil
}

func imageKey(ref string, img v1.Image) (string, error) {
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("unpack %s: %w", ref, err)
	}
	key, err := keyOf(d.String())
	if err != nil {
		return "", fmt.Errorf("unpack %s: %w", ref, err)
	}
	return key, nil
}

// UnpackImage is Unpack for an image already resolved; ref is only recorded.
func (c *Cache) UnpackImage(ctx context.Context, ref string, img v1.Image) (Image, error) {
	key, err := imageKey(ref, img)
	if err != nil {
		return Image{}, err
	}
	d := "sha256:" + strings.TrimPrefix(key, "sha256-")
	if pub, err := c.readPublished(key); err == nil {
		return cached(pub, img)
	}

	unlock, err := c.lock(ctx, key+".lock", unix.LOCK_EX)
	if err != nil {
		return Image{}, fmt.Errorf("unpack %s: %w", ref, err)
	}
	defer unlock()
	if pub, err := c.readPublished(key); err == nil { // another process won
		return cached(pub, img)
	}
	// We hold the lock: whatever is left in tmp for this digest is from an
	// unpack that crashed.
	stale, _ := filepath.Glob(filepath.Join(c.dir, "tmp", key+"-*"))
	for _, s := range stale {
		os.RemoveAll(s)
	}

	tmp, err := os.MkdirTemp(filepath.Join(c.dir, "tmp"), key+"-")
	if err != nil {
		return Image{}, fmt.Errorf("unpack %s: %w", ref, err)
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	e, meta, err := c.build(ctx, d, img, filepath.Join(tmp, "rootfs"))
	if err != nil {
		return Image{}, fmt.Errorf("unpack %s: %w", ref, err)
	}
	meta.Digest = d
	meta.Ref = ref
	meta.UnpackedAt = time.Now().UTC()
	data, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return Image{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "image.json"), append(data, '\n'), 0o644); err != nil {
		return Image{}, fmt.Errorf("unpack %s: %w", ref, err)
	}
	e.report(ProgressSync)
	if err := syncDir(tmp); err != nil {
		return Image{}, fmt.Errorf("unpack %s: sync: %w", ref, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Image{}, err
	}
	dst := filepath.Join(c.dir, "images", key)
	if err := os.Rename(tmp, dst); err != nil {
		return Image{}, fmt.Errorf("unpack %s: publish: %w", ref, err)
	}
	published = true
	syncDir(filepath.Join(c.dir, "images"))
	meta.RootfsPath = filepath.Join(dst, "rootfs")
	e.report(ProgressPublished)
	return meta, nil
}

// cached is a published image found by UnpackImage. One published before
// image.json kept the labels gets them from img's config blob, verified
// against the manifest as an unpack verifies it.
func cached(pub Image, img v1.Image) (Image, error) {
	pub.Cached = true
	if pub.Labels == nil {
		_, cfg, err := verifiedConfig(img)
		if err != nil {
			return Image{}, fmt.Errorf("image %s: %w", pub.Digest, err)
		}
		pub.Labels = labelsOf(cfg)
	}
	return pub, nil
}

// verifiedConfig is img's manifest and config file, the config blob's
// digest checked against the manifest's.
func verifiedConfig(img v1.Image) (*v1.Manifest, *v1.ConfigFile, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, nil, fmt.Errorf("manifest: %w", err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	if got := sha256Hex(rawCfg); got != m.Config.Digest.Hex {
		return nil, nil, fmt.Errorf("config digest mismatch: manifest says %s, blob hashes to sha256:%s (tampered or corrupt)", m.Config.Digest, got)
	}
	cfg, err := v1.ParseConfigFile(strings.NewReader(string(rawCfg)))
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	return m, cfg, nil
}

// labelsOf is the config's labels, never nil (see Image.Labels).
func labelsOf(cfg *v1.ConfigFile) map[string]string {
	out := map[string]string{}
	for k, v := range cfg.Config.Labels {
		out[k] = v
	}
	return out
}

// build verifies and applies every layer of img (manifest digest d) into
// dir. The extractor it returns is closed; it only reports progress.
func (c *Cache) build(ctx context.Context, d string, img v1.Image, dir string) (*extractor, Image, error) {
	start := time.Now()
	m, cfg, err := verifiedConfig(img)
	if err != nil {
		return nil, Image{}, err
	}
	if cfg.OS != "linux" || (cfg.Architecture != "" && cfg.Architecture != runtime.GOARCH) {
		return nil, Image{}, fmt.Errorf("image is for %s/%s, this host runs linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if len(m.Layers) != len(cfg.RootFS.DiffIDs) {
		return nil, Image{}, fmt.Errorf("manifest has %d layers, config lists %d diff_ids", len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, Image{}, fmt.Errorf("layers: %w", err)
	}
	if len(layers) != len(m.Layers) {
		return nil, Image{}, fmt.Errorf("image yields %d layers, manifest lists %d", len(layers), len(m.Layers))
	}

	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, Image{}, err
	}
	e, err := newExtractor(dir, c.Limits)
	if err != nil {
		return nil, Image{}, err
	}
	defer e.close()
	e.progress, e.digest, e.start, e.layers = c.Progress, d, start, len(layers)
	for _, l := range m.Layers {
		e.blobTotal += l.Size
	}
	e.report(ProgressStart)
	meta := Image{Config: m.Config.Digest.String(), Env: cfg.Config.Env, User: cfg.Config.User, Labels: labelsOf(cfg)}
	for i, l := range layers {
		desc := m.Layers[i]
		if err := e.apply(ctx, i, layerInput{layer: l, mediaType: desc.MediaType, digest: desc.Digest, size: desc.Size, diffID: cfg.RootFS.DiffIDs[i]}); err != nil {
			return nil, Image{}, err
		}
		e.report(ProgressLayerDone)
		meta.Layers = append(meta.Layers, desc.Digest.String())
	}
	if err := e.finish(); err != nil {
		return nil, Image{}, err
	}
	meta.Entries, meta.Bytes = e.entries, e.fileBytes
	meta.Dropped, meta.DroppedCount = e.dropped, e.droppedCount
	return e, meta, nil
}

// syncDir flushes the file system holding dir, so a published tree survives a
// crash right after the rename with its content, not as empty files.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// lock takes an flock on the file locks/<name>, polling so ctx can cancel.
// The lock lasts until the returned func is called: it keeps the file
// reachable, so no finalizer closes it (and drops the lock) before.
func (c *Cache) lock(ctx context.Context, name string, how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(c.dir, "locks", name), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Use marks a published image as in use until release is called: GC skips
// it. It holds one file descriptor open; the caller must keep release
// reachable and call it (a worker, at exit). UnpackAndUse takes the same
// hold without a gap after unpacking.
func (c *Cache) Use(ctx context.Context, digest string) (release func(), err error) {
	key, err := keyOf(digest)
	if err != nil {
		return nil, err
	}
	unlock, err := c.lock(ctx, key+".use", unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	if _, err := c.readPublished(key); err != nil {
		unlock()
		return nil, fmt.Errorf("image %s is not in the cache: %w", digest, err)
	}
	return unlock, nil
}

// List returns the published images, oldest unpack first.
func (c *Cache) List() ([]Image, error) {
	ents, err := os.ReadDir(filepath.Join(c.dir, "images"))
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, ent := range ents {
		if !strings.HasPrefix(ent.Name(), "sha256-") {
			continue
		}
		img, err := c.readPublished(ent.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UnpackedAt.Before(out[j].UnpackedAt) })
	return out, nil
}

// GC removes every published image whose digest is not in keep and that no
// one is using (Use) or unpacking, and sweeps leftovers of crashed unpacks.
// It returns the digests it removed.
func (c *Cache) GC(keep ...string) ([]string, error) {
	keepSet := map[string]bool{}
	for _, k := range keep {
		if _, err := keyOf(k); err != nil {
			return nil, fmt.Errorf("gc: keep: %w", err)
		}
		keepSet[k] = true
	}
	imgs, err := c.List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, img := range imgs {
		if keepSet[img.Digest] {
			continue
		}
		key, _ := keyOf(img.Digest)
		unuse, err := c.tryLock(key + ".use")
		if err != nil {
			continue // in use
		}
		unlock, err := c.tryLock(key + ".lock")
		if err != nil {
			unuse()
			continue // being unpacked
		}
		// Unpublish atomically first, then delete at leisure.
		trash, err := os.MkdirTemp(filepath.Join(c.dir, "tmp"), "gc-")
		if err == nil {
			err = os.Rename(filepath.Join(c.dir, "images", key), filepath.Join(trash, key))
		}
		if err == nil {
			err = os.RemoveAll(trash)
			removed = append(removed, img.Digest)
		}
		unlock()
		unuse()
		if err != nil {
			errs = append(errs, fmt.Errorf("gc %s: %w", img.Digest, err))
		}
	}
	// Crashed unpacks (key-random, whose lock is free) and gc trash.
	tmps, _ := os.ReadDir(filepath.Join(c.dir, "tmp"))
	for _, t := range tmps {
		name := t.Name()
		if strings.HasPrefix(name, "gc-") {
			os.RemoveAll(filepath.Join(c.dir, "tmp", name))
			continue
		}
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if unlock, err := c.tryLock(name[:i] + ".lock"); err == nil {
				os.RemoveAll(filepath.Join(c.dir, "tmp", name))
				unlock()
			}
		}
	}
	return removed, errors.Join(errs...)
}

func (c *Cache) tryLock(name string) (func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // one attempt only
	return c.lock(ctx, name, unix.LOCK_EX)
}
