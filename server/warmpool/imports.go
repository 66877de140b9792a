package warmpool

import (
	"bytes"
	"strings"
)

// maxScannedSource bounds how much of an execution's code
// codeImportsPreload scans: imports are at the top, and a larger file is
// scanned that far.
const maxScannedSource = 256 << 10

// codeImportsPreload reports whether src, the source of the file an
// execution runs, imports one of the preload's top-level packages,
// scanning its first maxScannedSource bytes. It decides whether an
// execution that found its pool empty gets a fork made on demand
// (Pool.Claim, forkForExecution): a fork pays for itself when the code
// uses what its template imported, and costs about what a cold start does
// when it does not (TEMPLATE.md section 12, "Forks on demand"). A guess,
// which costs time when wrong, never correctness.
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
