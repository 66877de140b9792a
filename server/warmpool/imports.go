package warmpool

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// maxScannedSource bounds how much of an execution's file importsPreload
// reads: imports are at the top, and a larger file is scanned that far.
const maxScannedSource = 256 << 10

// importsPreload reports whether the file spec runs (its hand-off's Path,
// in spec.Workspace) imports one of the preload's top-level packages. It
// decides whether an execution that found its pool empty gets a fork made
// on demand (forkForExecution): a fork pays for itself when the code uses
// what its template imported, and costs about what a cold start does when
// it does not (TEMPLATE.md section 12, "Forks on demand"). A guess, which
// costs time when wrong, never correctness: the file is the server's, not
// the code's (nothing has run yet), read through os.Root so that a link
// cannot lead outside the workspace.
func importsPreload(spec *nsjail.Spec, preload []string) bool {
	h, ok := handoffOf(spec)
	if !ok || len(preload) == 0 || spec.Workspace == "" {
		return false
	}
	rel, ok := strings.CutPrefix(h.Path, inside.Workspace+"/")
	if !ok {
		return false
	}
	root, err := os.OpenRoot(spec.Workspace)
	if err != nil {
		return false
	}
	defer root.Close()
	// O_NONBLOCK: a FIFO in its place opens at once, and is no file.
	f, err := root.OpenFile(filepath.Clean(rel), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	src, err := io.ReadAll(io.LimitReader(f, maxScannedSource))
	if err != nil {
		return false
	}
	return codeImportsPreload(src, preload)
}

// codeImportsPreload is importsPreload on the code itself (Pool.Claim's:
// its file is written only once a sandbox is claimed), of which the first
// maxScannedSource bytes are scanned, as of the file.
func codeImportsPreload(src []byte, preload []string) bool {
	if len(preload) == 0 {
		return false
	}
	return importsAny(src[:min(len(src), maxScannedSource)], topLevel(preload))
}

// topLevel is the set of the modules' top-level packages.
func topLevel(modules []string) map[string]bool {
	m := make(map[string]bool, len(modules))
	for _, mod := range modules {
		top, _, _ := strings.Cut(mod, ".")
		if top != "" {
			m[top] = true
		}
	}
	return m
}

// importsAny reports whether Python source src has an import statement
// ("import a.b as c, d" or "from a.b import c", at any indentation, also
// after a semicolon) of one of the top-level packages in mods. A line
// scan, not a parser: an import inside a string counts, one built at run
// time (importlib) does not.
func importsAny(src []byte, mods map[string]bool) bool {
	for line := range bytes.Lines(src) {
		for stmt := range strings.SplitSeq(string(line), ";") {
			stmt = strings.TrimSpace(stmt)
			var names []string
			if rest, ok := strings.CutPrefix(stmt, "import "); ok {
				names = strings.Split(rest, ",")
			} else if rest, ok := strings.CutPrefix(stmt, "from "); ok {
				names = []string{rest}
			}
			for _, name := range names {
				name = strings.TrimLeft(strings.TrimSpace(name), "(")
				if i := strings.IndexAny(name, ". \t"); i >= 0 {
					name = name[:i]
				}
				if mods[name] {
					return true
				}
			}
		}
	}
	return false
}
