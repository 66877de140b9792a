package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The freezer anchor exists, frozen and empty, while a sandbox holds it
// (one per parent, counted; a sandbox a level deeper, as a template fork's
// is, takes a hold on the one held rather than making its own), and goes
// with the last release; a release
// called twice counts once; one a killed worker left is removed by the
// sweep, one held is not.
func TestFreezerAnchor(t *testing.T) {
	h := realHost(t)
	if h.Mode.V2() {
		t.Skip("v2's freezer has no anchor")
	}
	a, b := sandboxCgroup(t, h, "anchor-a"), sandboxCgroup(t, h, "anchor-b")
	dir := anchorDir(a)
	if dir != anchorDir(b) || filepath.Dir(dir) != filepath.Dir(a["freezer"]) {
		t.Fatalf("anchor %q beside %q / %q", dir, a["freezer"], anchorDir(b))
	}
	exists := func() bool { _, err := os.Stat(dir); return err == nil }
	relA, err := AcquireFreezerAnchor(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relA() })
	if got := strings.TrimSpace(readT(t, filepath.Join(dir, "freezer.state"))); got != "FROZEN" {
		t.Fatalf("anchor state %q", got)
	}
	if got := strings.TrimSpace(readT(t, filepath.Join(dir, "cgroup.procs"))); got != "" {
		t.Fatalf("anchor holds tasks: %q", got)
	}
	relB, err := AcquireFreezerAnchor(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relB() })
	deeper := Paths{"freezer": filepath.Join(a["freezer"], "deeper")}
	relC, err := AcquireFreezerAnchor(deeper)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(anchorDir(deeper)); err == nil {
		t.Fatalf("a deeper sandbox made its own anchor %s while %s is held", anchorDir(deeper), dir)
	}
	if err := relC(); err != nil || !exists() {
		t.Fatalf("the deeper sandbox's release (err %v) took the anchor others hold", err)
	}
	if err := relA(); err != nil {
		t.Fatal(err)
	}
	if err := relA(); err != nil { // counted once
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("anchor removed while b still holds it")
	}
	parents, err := h.ParentDirs(testParent)
	if err != nil {
		t.Fatal(err)
	}
	if err := removeIdleAnchor(parents["freezer"]); err != nil || !exists() {
		t.Fatalf("the sweep removed a held anchor (err %v)", err)
	}
	if err := relB(); err != nil {
		t.Fatal(err)
	}
	if exists() {
		t.Fatal("anchor left after the last release")
	}
	// A killed worker's: frozen, held by nobody in this process. Not
	// adopted (this process did not make it), removed by the sweep.
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeT(t, filepath.Join(dir, "freezer.state"), "FROZEN")
	if _, err := AcquireFreezerAnchor(a); err == nil {
		t.Fatal("an anchor this process did not make was adopted")
	}
	if err := removeIdleAnchor(parents["freezer"]); err != nil || exists() {
		t.Fatalf("the sweep left an idle anchor (err %v)", err)
	}
}

// BenchmarkFreezeThaw is one freeze and one thaw of a cgroup holding one
// sleeping process, with and without the anchor: on v1 without it, and
// nothing else frozen on the host, each is a change of the kernel's
// freezer static key (anchor.go). "alone" is alone only when no other
// cgroup on the host is frozen meanwhile (a session kernel idling).
func BenchmarkFreezeThaw(b *testing.B) {
	h := realHost(b)
	for _, anchored := range []bool{false, true} {
		name := map[bool]string{false: "alone", true: "anchored"}[anchored]
		b.Run(name, func(b *testing.B) {
			paths := sandboxCgroup(b, h, "freeze-bench-"+name)
			startIn(b, uniqueDirs(paths), "sleep 600")
			if anchored {
				release, err := AcquireFreezerAnchor(paths)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { release() })
			}
			for b.Loop() {
				if err := Freeze(paths, 10*time.Second); err != nil {
					b.Fatal(err)
				}
				if err := Thaw(paths); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
