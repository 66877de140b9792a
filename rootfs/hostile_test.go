package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// SECURITY.md case 19: every hostile layer is refused with a clear error (and
// nothing is published, nothing outside the cache changes) or its dangerous
// part is dropped.
func TestHostileLayersRejected(t *testing.T) {
	cases := []struct {
		name   string
		layers func(w *world) [][]ent
		err    string
	}{
		{"dotdot name", func(w *world) [][]ent { return [][]ent{{file("../evil", "x")}} }, "'..' component"},
		{"dotdot deep", func(w *world) [][]ent {
			return [][]ent{{dir("a/"), file("a/../../../../../../../../tmp/evil", "x")}}
		}, "'..' component"},
		{"absolute name", func(w *world) [][]ent { return [][]ent{{file(w.outside+"/evil", "x")}} }, "absolute name"},
		{"symlink then write through (absolute target)", func(w *world) [][]ent {
			return [][]ent{{symlink("x", w.outside), file("x/pwned", "x")}}
		}, "is a symlink"},
		{"symlink then write through (relative escape)", func(w *world) [][]ent {
			return [][]ent{{symlink("y", strings.Repeat("../", 20)+strings.TrimPrefix(w.outside, "/")), file("y/pwned", "x")}}
		}, "is a symlink"},
		{"symlink then write through, next layer", func(w *world) [][]ent {
			return [][]ent{{symlink("x", w.outside)}, {file("x/pwned", "x")}}
		}, "is a symlink"},
		{"symlink then overwrite via secret path", func(w *world) [][]ent {
			return [][]ent{{symlink("x", w.outside), file("x/secret", "owned")}}
		}, "is a symlink"},
		{"symlink then mkdir through", func(w *world) [][]ent {
			return [][]ent{{symlink("x", w.outside), dir("x/newdir/")}}
		}, "is a symlink"},
		{"hardlink out of the root (dotdot)", func(w *world) [][]ent {
			return [][]ent{{hardlink("h", "../../outside/secret")}}
		}, "'..' component"},
		{"hardlink out of the root (absolute)", func(w *world) [][]ent {
			return [][]ent{{hardlink("h", w.secret)}}
		}, "absolute name"},
		{"hardlink through a symlink", func(w *world) [][]ent {
			return [][]ent{{symlink("x", w.outside), hardlink("h", "x/secret")}}
		}, "is a symlink"},
		{"hardlink to a directory", func(w *world) [][]ent {
			return [][]ent{{dir("d/"), hardlink("h", "d")}}
		}, "not a regular file"},
		{"whiteout through a symlink", func(w *world) [][]ent {
			return [][]ent{{symlink("s", w.outside)}, {file("s/.wh.secret", "")}}
		}, "is a symlink"},
		{"opaque dir through a symlink", func(w *world) [][]ent {
			return [][]ent{{symlink("s", w.outside)}, {file("s/.wh..wh..opq", "")}}
		}, "is a symlink"},
		{"bad whiteout: empty name", func(w *world) [][]ent { return [][]ent{{file(".wh.", "")}} }, "names no file"},
		{"bad whiteout: dot", func(w *world) [][]ent { return [][]ent{{dir("a/"), file("a/.wh..", "")}} }, "names no file"},
		{"bad whiteout: dotdot", func(w *world) [][]ent { return [][]ent{{dir("a/"), file("a/.wh...", "")}} }, "names no file"},
		{"bad whiteout: unknown reserved", func(w *world) [][]ent { return [][]ent{{file(".wh..wh.plnk", "")}} }, "unknown reserved"},
		{"bad whiteout: used as a directory", func(w *world) [][]ent { return [][]ent{{file(".wh.a/b", "")}} }, "used as a directory"},
		{"bad whiteout: directory type", func(w *world) [][]ent { return [][]ent{{dir(".wh.a/")}} }, "a directory"},
		{"file replacing the root", func(w *world) [][]ent { return [][]ent{{file(".", "x")}} }, "only be a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			var layers [][]byte
			for _, l := range tc.layers(w) {
				layers = append(layers, tarOf(t, l...))
			}
			img := imageOf(t, layers...)
			before := w.snapshot(t)
			_, err := w.cache.UnpackImage(ctx(t), "crafted", img)
			wantErr(t, err, tc.err)
			w.assertUntouched(t, before)
			w.assertNothingPublished(t)
		})
	}
}

// Overwriting a symlink with a regular file replaces the link; it never
// writes through it.
func TestFileReplacesSymlinkWithoutWritingThrough(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t,
		tarOf(t, symlink("f", w.secret), symlink("g", "../../outside/secret")),
		tarOf(t, file("f", "layer2"), file("g", "layer2")))
	before := w.snapshot(t)
	got, err := w.cache.UnpackImage(ctx(t), "crafted", img)
	if err != nil {
		t.Fatal(err)
	}
	w.assertUntouched(t, before)
	for _, n := range []string{"f", "g"} {
		fi, err := os.Lstat(filepath.Join(got.RootfsPath, n))
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s: want a regular file, got %v %v", n, fi, err)
		}
	}
}

// Device nodes, set-id bits, xattrs and file capabilities are dropped; the
// rest of the layer is applied.
func TestPrivilegeBearingEntriesDropped(t *testing.T) {
	w := newWorld(t)
	capXattr := string([]byte{0x01, 0x00, 0x00, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	img := imageOf(t, tarOf(t,
		dir("dev/"),
		ent{name: "dev/mem", typ: tar.TypeChar, mode: 0o666, major: 1},
		ent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o666, major: 8},
		ent{name: "dev/fifo", typ: tar.TypeFifo, mode: 0o666},
		dir("bin/"),
		ent{name: "bin/su", typ: tar.TypeReg, mode: 0o4755, body: "#!/bin/sh\n"},
		ent{name: "bin/wall", typ: tar.TypeReg, mode: 0o2755, body: "#!/bin/sh\n"},
		ent{name: "bin/ping", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\n",
			pax: map[string]string{"SCHILY.xattr.security.capability": capXattr, "SCHILY.xattr.user.note": "x"}},
		ent{name: "tmpdir/", typ: tar.TypeDir, mode: 0o1777},
	))
	before := w.snapshot(t)
	got, err := w.cache.UnpackImage(ctx(t), "crafted", img)
	if err != nil {
		t.Fatal(err)
	}
	w.assertUntouched(t, before)
	for _, n := range []string{"dev/mem", "dev/sda", "dev/fifo"} {
		if _, err := os.Lstat(filepath.Join(got.RootfsPath, n)); !os.IsNotExist(err) {
			t.Errorf("%s: device node/fifo was created (err=%v)", n, err)
		}
	}
	for _, n := range []string{"bin/su", "bin/wall", "bin/ping"} {
		fi, err := os.Stat(filepath.Join(got.RootfsPath, n))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: mode %v, want -rwxr-xr-x without set-id bits", n, fi.Mode())
		}
		sz, err := unix.Llistxattr(filepath.Join(got.RootfsPath, n), make([]byte, 1024))
		if err != nil || sz != 0 {
			t.Errorf("%s: has xattrs (%d bytes, %v)", n, sz, err)
		}
	}
	fi, err := os.Stat(filepath.Join(got.RootfsPath, "tmpdir"))
	if err != nil || fi.Mode()&0o022 != 0 {
		t.Errorf("tmpdir: %v %v: a published dir must not be group/world-writable", fi.Mode(), err)
	}
	if got.DroppedCount != 7 { // 3 nodes, 2 set-id, 2 xattrs
		t.Errorf("dropped %d entries, want 7: %q", got.DroppedCount, got.Dropped)
	}
	joined := strings.Join(got.Dropped, "\n")
	for _, want := range []string{"dev/mem: device node", "bin/su: setuid", "bin/ping: xattr security.capability"} {
		if !strings.Contains(joined, want) {
			t.Errorf("dropped list lacks %q: %q", want, got.Dropped)
		}
	}
}

// A tampered blob is caught by its digest, even when the tar inside is
// harmless; a failed unpack publishes nothing and leaves no temp dir.
func TestDigestMismatchRejected(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t, tarOf(t, file("etc/motd", "hello from the real image")))
	dir := writeLayout(t, img, "latest")
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	blob := filepath.Join(dir, "blobs", "sha256", d.Hex)
	evil := gzipOf(t, tarOf(t, file("etc/motd", "hello from the attacker")))
	if err := os.WriteFile(blob, evil, 0o644); err != nil {
		t.Fatal(err)
	}
	before := w.snapshot(t)
	_, err := w.cache.Unpack(ctx(t), "oci-layout:"+dir)
	if err == nil || !(strings.Contains(err.Error(), "digest mismatch") || strings.Contains(err.Error(), "manifest says")) {
		t.Fatalf("want a digest error, got %v", err)
	}
	w.assertUntouched(t, before)
	w.assertNothingPublished(t)
}

func TestTamperedConfigAndManifestRejected(t *testing.T) {
	w := newWorld(t)
	img := imageOf(t, tarOf(t, file("a", "a")))
	dir := writeLayout(t, img, "latest")
	cfgName, _ := img.ConfigName()
	if err := os.WriteFile(filepath.Join(dir, "blobs/sha256", cfgName.Hex), []byte(`{"os":"linux","architecture":"amd64","rootfs":{"type":"layers","diff_ids":[]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := w.cache.Unpack(ctx(t), "oci-layout:"+dir)
	wantErr(t, err, "config digest mismatch")

	dir2 := writeLayout(t, img, "latest")
	md, _ := img.Digest()
	raw, _ := img.RawManifest()
	if err := os.WriteFile(filepath.Join(dir2, "blobs/sha256", md.Hex), bytes.Replace(raw, []byte("{"), []byte("{ "), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = w.cache.Unpack(ctx(t), "oci-layout:"+dir2)
	wantErr(t, err, "manifest digest mismatch")
	w.assertNothingPublished(t)
}

// A gzip bomb (a small blob that inflates without end) stops at the byte
// cap; so does a tar with too many entries.
func TestBombsCapped(t *testing.T) {
	t.Run("gzip bomb", func(t *testing.T) {
		w := newWorld(t)
		w.cache.Limits = Limits{MaxBytes: 16 << 20, MaxFiles: 1000}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		tw := tar.NewWriter(zw)
		const size = 256 << 20
		tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: size})
		zeros := make([]byte, 1<<20)
		for i := 0; i < size>>20; i++ {
			tw.Write(zeros)
		}
		tw.Close()
		zw.Close()
		if buf.Len() > 1<<20 {
			t.Fatalf("bomb is %d bytes compressed; expected under 1 MiB", buf.Len())
		}
		before := w.snapshot(t)
		_, err := w.cache.UnpackImage(ctx(t), "bomb", imageOf(t, buf.Bytes()))
		wantErr(t, err, "byte limit")
		w.assertUntouched(t, before)
		w.assertNothingPublished(t)
	})
	t.Run("file count", func(t *testing.T) {
		w := newWorld(t)
		w.cache.Limits = Limits{MaxBytes: 1 << 30, MaxFiles: 100}
		var ents []ent
		for i := 0; i < 150; i++ {
			ents = append(ents, file("f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)), ""))
		}
		_, err := w.cache.UnpackImage(ctx(t), "many", imageOf(t, tarOf(t, ents...)))
		wantErr(t, err, "more than 100 entries")
		w.assertNothingPublished(t)
	})
	t.Run("declared size larger than the cap", func(t *testing.T) {
		w := newWorld(t)
		w.cache.Limits = Limits{MaxBytes: 1 << 20, MaxFiles: 100}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2 << 20})
		tw.Write(make([]byte, 2<<20))
		tw.Close()
		_, err := w.cache.UnpackImage(ctx(t), "big", imageOf(t, buf.Bytes()))
		wantErr(t, err, "byte limit")
		w.assertNothingPublished(t)
	})
}
