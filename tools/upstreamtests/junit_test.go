package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const sampleXML = `<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5">
<testcase classname="numpy.tests.test_a.TestX" name="test_ok" time="0.1"/>
<testcase classname="numpy.tests.test_a.TestX" name="test_fail" time="0.1"><failure message="boom">trace</failure></testcase>
<testcase classname="numpy.tests.test_a" name="test_skip[1]" time="0"><skipped type="pytest.skip" message="no">why</skipped></testcase>
<testcase classname="numpy.tests.test_a" name="test_teardown" time="0.1"/>
<testcase classname="numpy.tests.test_a" name="test_teardown" time="0.1"><error message="teardown">x</error></testcase>
</testsuite></testsuites>`

func TestParseJUnit(t *testing.T) {
	got, err := ParseJUnit(strings.NewReader(sampleXML))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Outcome{
		"numpy.tests.test_a.TestX::test_ok":   Passed,
		"numpy.tests.test_a.TestX::test_fail": Failed,
		"numpy.tests.test_a::test_skip[1]":    Skipped,
		"numpy.tests.test_a::test_teardown":   Errored, // the worst of its two reports
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for id, o := range want {
		if got[id] != o {
			t.Errorf("%s: %s, want %s", id, got[id], o)
		}
	}
	if _, err := ParseJUnit(strings.NewReader("<testsuites><testsuite>")); err == nil {
		t.Error("truncated XML parsed without error")
	}
}

// A test that passes outside and fails, errors, is skipped or is missing
// inside is a regression; the reverse is only noted.
func TestCompare(t *testing.T) {
	outside := map[string]Outcome{"a": Passed, "b": Passed, "c": Passed, "d": Passed, "e": Failed, "f": Passed, "g": Skipped}
	inside := map[string]Outcome{"a": Passed, "b": Failed, "c": Errored, "d": Skipped, "e": Passed, "g": Skipped, "h": Passed}
	c := Compare("s", outside, inside)
	wantReg := []string{"b (inside: failed)", "c (inside: error)", "d (inside: skipped)", "f (inside: missing)"}
	if !slices.Equal(c.Regressions, wantReg) {
		t.Errorf("regressions %q, want %q", c.Regressions, wantReg)
	}
	wantGain := []string{"e (outside: failed)", "h (outside: missing)"}
	if !slices.Equal(c.Gained, wantGain) {
		t.Errorf("gained %q, want %q", c.Gained, wantGain)
	}
	if c.Outside[Passed] != 5 || c.Inside[Passed] != 3 || c.Outside[Missing] != 1 || c.Inside[Missing] != 1 {
		t.Errorf("counts outside %v inside %v", c.Outside, c.Inside)
	}
	r := Report([]Comparison{c}, []string{"pyarrow: not in this image"})
	if !strings.Contains(r, "| s | 8 | 5 | 3 | 1 | 2 | 1 | 2 | 4 |") || !strings.Contains(r, "REGRESSION s: f (inside: missing)") ||
		!strings.Contains(r, "\npyarrow: not in this image\n") {
		t.Errorf("report:\n%s", r)
	}
}

func TestNodeID(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, distPackages, "pyarrow", "tests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"test_csv.py", "test_io.py"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]string{
		"pyarrow.tests.test_csv.TestThreadedStreamingCSVRead::test_batch_lifetime": "pyarrow/tests/test_csv.py::TestThreadedStreamingCSVRead::test_batch_lifetime",
		"pyarrow.tests.test_io::test_os_file_large_seeks[a.b]":                     "pyarrow/tests/test_io.py::test_os_file_large_seeks[a.b]",
		"pyarrow.tests.test_gone::test_x":                                          "",
		"no-separator":                                                             "",
	} {
		got, ok := nodeID(root, id)
		if got != want || ok != (want != "") {
			t.Errorf("nodeID(%q) = %q, %v; want %q", id, got, ok, want)
		}
	}
}

// A library the image lacks is reported, not failed; missing test files of
// a library it has are dropped and listed; a library without any of its
// test files means the wrong image and is an error.
func TestAvailable(t *testing.T) {
	root := t.TempDir()
	dist := filepath.Join(root, distPackages)
	for _, f := range []string{"numpy/_core/tests/test_a.py", "numpy/lib/tests/test_io.py", "pandas/__init__.py"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dist, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dist, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dist, "pandas/tests/tslibs"), 0o755); err != nil {
		t.Fatal(err)
	}

	s, gone, err := available(root, suite{name: "pyarrow", paths: []string{"pyarrow/tests/test_io.py"}})
	if err != nil || len(s.paths) != 0 || len(gone) != 0 {
		t.Errorf("pyarrow absent: %v %q %v, want no paths and no error", s.paths, gone, err)
	}
	np := suite{name: "numpy", paths: []string{"numpy/_core/tests/test_a.py", "numpy/_core/tests/test_gone.py", "numpy/lib/tests/test_io.py"}, args: []string{"-m", "not slow"}}
	s, gone, err = available(root, np)
	if err != nil || !slices.Equal(s.paths, []string{"numpy/_core/tests/test_a.py", "numpy/lib/tests/test_io.py"}) ||
		!slices.Equal(gone, []string{"numpy/_core/tests/test_gone.py"}) || !slices.Equal(s.args, np.args) {
		t.Errorf("numpy: %v %q %v", s, gone, err)
	}
	s, _, err = available(root, suite{name: "pandas", paths: []string{"pandas/tests/tslibs", "pandas/tests/io/test_parquet.py"}})
	if err != nil || !slices.Equal(s.paths, []string{"pandas/tests/tslibs"}) {
		t.Errorf("pandas (a directory path): %v %v", s.paths, err)
	}
	if _, _, err := available(root, suite{name: "pandas", paths: []string{"pandas/tests/io/test_parquet.py"}}); err == nil {
		t.Error("pandas without any of its test files: no error")
	}
}
