package warmpool

import (
	"bytes"
	"testing"
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

// codeImportsPreload decides Claim's forks on demand from the code itself
// (its file is not written yet), scanning its first maxScannedSource
// bytes.
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
