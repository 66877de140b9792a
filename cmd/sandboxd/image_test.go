package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/progress"
)

// manyFilesLayout is an OCI layout of one layer with n small files.
func manyFilesLayout(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), []byte(strings.Repeat("x", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return "oci-layout:" + ociLayout(t, dir)
}

// `sandboxd image unpack` off a terminal (a log, a pipe): one line per
// stage, not per entry, and no carriage returns or escape sequences; on a
// terminal the same stages plus a status line redrawn in place.
func TestImageUnpackProgressLines(t *testing.T) {
	ref := manyFilesLayout(t, 500)
	cache := t.TempDir()
	args := []string{"--image", ref, "--cache", cache}

	var out, logs bytes.Buffer
	if err := imageUnpack(context.Background(), args, &out, progress.NewMeter(&logs, false)); err != nil {
		t.Fatal(err)
	}
	text := logs.String()
	if strings.ContainsAny(text, "\r\x1b") || !strings.HasSuffix(text, "\n") {
		t.Fatalf("not line-based: %q", text)
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	var stages []string
	for _, l := range lines {
		if strings.HasPrefix(l, "warning: ") {
			continue // the temp dir's parents may not be o+x
		}
		stages = append(stages, l)
	}
	// start, layer 1/1, verified, sync, published, and the summary.
	if len(stages) != 6 {
		t.Fatalf("%d lines for one layer of 500 files, want 6:\n%s", len(stages), text)
	}
	for i, want := range []string{": 1 layer(s), ", ": layer 1/1", ": layer 1/1 verified: 500 entries", ": syncing to disk", ": published", "unpacked in "} {
		if !strings.Contains(stages[i], want) {
			t.Errorf("line %d %q lacks %q", i, stages[i], want)
		}
	}
	if !strings.Contains(out.String(), "rootfs "+cache) {
		t.Errorf("stdout: %q", out.String())
	}

	// Cached: the summary only.
	logs.Reset()
	if err := imageUnpack(context.Background(), args, &out, progress.NewMeter(&logs, false)); err != nil {
		t.Fatal(err)
	}
	if s := strings.TrimSuffix(logs.String(), "\n"); strings.Contains(s, "\n") && !strings.HasPrefix(s, "warning: ") || !strings.Contains(s, "cached in ") {
		t.Fatalf("cached unpack printed %q", logs.String())
	}

	// A terminal: the stage lines plus status lines redrawn in place, and
	// the status cleared before each stage line and at the end.
	var tty bytes.Buffer
	args = []string{"--image", ref, "--cache", t.TempDir()}
	if err := imageUnpack(context.Background(), args, &out, progress.NewMeter(&tty, true)); err != nil {
		t.Fatal(err)
	}
	s := tty.String()
	if strings.HasPrefix(s, "warning: ") {
		s = s[strings.IndexByte(s, '\n')+1:]
	}
	if !strings.Contains(s, "\r\x1b[Kunpack layer 1/1 ") || !strings.Contains(s, " entries, ") ||
		!strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 6 {
		t.Fatalf("terminal output: %q", s)
	}
}
