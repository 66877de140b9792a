package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Set writes v1's cpu.shares or v2's cpu.weight, background or foreground,
// through the file opened once; a cgroup without a cpu hierarchy has no
// weight to open.
func TestCPUWeight(t *testing.T) {
	for _, tc := range []struct {
		name   string
		paths  func(dir string) Paths
		file   string
		bg, fg string
	}{
		{"v1", func(d string) Paths { return Paths{"cpu": d, "memory": t.TempDir()} }, "cpu.shares", "64", "1024"},
		{"v2", func(d string) Paths { return Paths{"": d} }, "cpu.weight", "6", "100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, tc.file)
			if err := os.WriteFile(file, []byte("1024\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			w, err := OpenCPUWeight(tc.paths(dir))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			for _, background := range []bool{true, false, true} {
				if err := os.Truncate(file, 0); err != nil {
					t.Fatal(err)
				}
				if err := w.Set(background); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				want := map[bool]string{true: tc.bg, false: tc.fg}[background]
				if string(b) != want {
					t.Errorf("background %v: file says %q, want %s", background, b, want)
				}
			}
		})
	}
	if _, err := OpenCPUWeight(Paths{"memory": t.TempDir()}); err == nil || !strings.Contains(err.Error(), "no cpu hierarchy") {
		t.Errorf("no cpu hierarchy: %v", err)
	}
	if _, err := OpenCPUWeight(Paths{"cpu": t.TempDir()}); err == nil {
		t.Error("a cpu directory without cpu.shares opened")
	}
}
