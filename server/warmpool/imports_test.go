package warmpool

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

func TestImportsAny(t *testing.T) {
	mods := topLevel([]string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot"})
	for _, c := range []struct {
		src  string
		want bool
	}{
		{"print(1)\n", false},
		{"import pandas as pd\n", true},
		{"import os, sys\nimport numpy\n", true},
		{"import os, numpy as np\n", true},
		{"from matplotlib import pyplot as plt\n", true},
		{"import matplotlib.pyplot as plt\n", true},
		{"def f():\n    import pandas\n", true},
		{"x = 1; import pandas\n", true},
		{"from pandasx import y\nimport numpyish\n", false},
		{"import os\nfrom . import pandas\n", false},
		{"# import pandas\n", false},
		{"s = 'import pandas'\n", false},
		{"importlib.import_module('pandas')\n", false},
		{"", false},
	} {
		if got := importsAny([]byte(c.src), mods); got != c.want {
			t.Errorf("importsAny(%q) = %v, want %v", c.src, got, c.want)
		}
	}
}

func TestImportsPreloadReadsTheExecutionsFile(t *testing.T) {
	dir := t.TempDir()
	preload := []string{"pandas"}
	spec := func(path string) *nsjail.Spec {
		return &nsjail.Spec{Args: []string{"python3", path}, Workspace: dir}
	}
	if err := os.WriteFile(filepath.Join(dir, "main.py"), []byte("import pandas as pd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain.py"), []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "x.py")
	if err := os.WriteFile(outside, []byte("import pandas\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link.py")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.py"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{
		{inside.Workspace + "/fifo.py", false}, // not read, never waited on
		{inside.Workspace + "/main.py", true},
		{inside.Workspace + "/plain.py", false},
		{inside.Workspace + "/missing.py", false},
		{inside.Workspace + "/link.py", false}, // leads out of the workspace
		{inside.Workspace + "/../main.py", false},
		{"/etc/main.py", false},
	} {
		if got := importsPreload(spec(c.path), preload); got != c.want {
			t.Errorf("importsPreload(%s) = %v, want %v", c.path, got, c.want)
		}
	}
	if importsPreload(spec(inside.Workspace+"/main.py"), nil) {
		t.Error("importsPreload with no preload = true")
	}
}

// codeImportsPreload decides Claim's forks on demand from the code itself
// (its file is not written yet), scanning as much of it as importsPreload
// scans of the file.
func TestCodeImportsPreload(t *testing.T) {
	preload := []string{"numpy", "matplotlib.pyplot"}
	late := bytes.Repeat([]byte("#\n"), maxScannedSource/2) // the scan's bound, in comments
	for _, c := range []struct {
		name string
		src  []byte
		want bool
	}{
		{"imports", []byte("import os\nimport numpy as np\n"), true},
		{"submodule", []byte("from matplotlib import pyplot\n"), true},
		{"none", []byte("import os\nprint(1)\n"), false},
		{"empty", nil, false},
		{"past the bound", append(late, "import numpy\n"...), false},
	} {
		if got := codeImportsPreload(c.src, preload); got != c.want {
			t.Errorf("%s: codeImportsPreload = %v, want %v", c.name, got, c.want)
		}
	}
	if codeImportsPreload([]byte("import numpy\n"), nil) {
		t.Error("codeImportsPreload with no preload = true")
	}
}
