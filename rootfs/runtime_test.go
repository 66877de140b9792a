package rootfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

func TestPythonRuntimeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: unpacking the python runtime takes ~15 s")
	}
	ref := nsjailtest.RuntimeImageRef(t)
	img, err := Resolve(ctx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.Config.Env, "MPLBACKEND=Agg") {
		t.Errorf("image env %q lacks MPLBACKEND=Agg", cfg.Config.Env)
	}
	for _, p := range []string{"python3", "python3-pandas", "python3-numpy", "python3-scipy", "python3-sklearn",
		"python3-matplotlib", "python3-openpyxl", "python3-seaborn", "python3-statsmodels",
		"tzdata", "tzdata-legacy", "locales"} {
		if cfg.Config.Labels["org.debian.package."+p] == "" {
			t.Errorf("no version label for %s", p)
		}
	}

	w := newWorld(t)
	got, err := w.cache.Unpack(ctx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unpacked %s: %d entries, %d bytes, dropped %d", got.Digest, got.Entries, got.Bytes, got.DroppedCount)
	again, err := w.cache.Unpack(ctx(t), ref)
	if err != nil || !again.Cached {
		t.Fatalf("second unpack: cached=%v err=%v", again.Cached, err)
	}
	r := got.RootfsPath
	for _, p := range []string{"usr/bin/python3", "workspace", "usr/share/sandboxd/matplotlib",
		"usr/lib/python3/dist-packages/zz_sandboxd_mplcache.pth",
		// the complete time-zone database (legacy names: tzdata-legacy) and
		// the UTF-8 locales (tools/runtime-image/customize.sh)
		"usr/share/zoneinfo/US/Pacific", "usr/share/zoneinfo/Europe/Berlin",
		"usr/lib/locale/C.utf8/LC_CTYPE", "usr/lib/locale/en_US.utf8/LC_CTYPE"} {
		if _, err := os.Stat(filepath.Join(r, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	fonts, _ := filepath.Glob(filepath.Join(r, "usr/share/sandboxd/matplotlib/fontlist-v*.json"))
	if len(fonts) != 1 {
		t.Errorf("prebuilt matplotlib font list: %q", fonts)
	}
	passwd, _ := os.ReadFile(filepath.Join(r, "etc/passwd"))
	if !strings.Contains(string(passwd), fmt.Sprintf("\nsandbox:x:%d:%d:", inside.UID, inside.GID)) {
		t.Errorf("etc/passwd lacks the sandbox user")
	}
	if os.Geteuid() != 0 {
		return
	}
	assertRootOwned(t, r)
	// inside.UID can write nothing in the published tree, so a plain chroot
	// is safe here; the read-only, fully isolated run is the e2e test.
	cmd := exec.Command("chroot", fmt.Sprintf("--userspec=%d:%d", inside.UID, inside.GID), r, "/usr/bin/python3", "-c",
		"import numpy, pandas, scipy.stats, sklearn, openpyxl, statsmodels.api; print(pandas.DataFrame({'a': [1, 2]}).a.sum())")
	cmd.Env = []string{"PATH=" + inside.DefaultPath, "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1"}
	// stdout only: a bare chroot has no /dev/shm, and joblib (via sklearn)
	// warns on stderr that it will run serially.
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "3" {
		t.Fatalf("python as the sandbox user in the unpacked runtime: %q %v (stderr %q)", out, err, stderr.String())
	}
}
