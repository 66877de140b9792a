package rootfs

import (
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"
)

type syscallStat = syscall.Stat_t

// assertRootOwned checks that every entry under root belongs to host root
// and that nothing is group/world-writable or set-id.
func assertRootOwned(t testing.TB, root string) {
	t.Helper()
	n := 0
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, err := d.Info()
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: owned by %d:%d, want 0:0", p, st.Uid, st.Gid)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && (fi.Mode()&0o022 != 0 || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0) {
			t.Errorf("%s: mode %v is writable by others or set-id", p, fi.Mode())
		}
		if n++; n > 200000 {
			return filepath.SkipAll
		}
		return nil
	})
}
