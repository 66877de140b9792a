// Command seccompgen writes the seccomp audit artifacts (SECCOMP.md,
// profile.json, pfc/<arch>.pfc, and the template profile's template.json
// and pfc/template-<arch>.pfc, rendered by seccomp/audit) from
// seccomp.Default(), or with -check fails when the committed ones differ.
// Used by `make seccomp` and `make seccomp-check`; build it with cgo and
// -tags seccomp.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/sandboxd/sandboxd/seccomp"
	"github.com/sandboxd/sandboxd/seccomp/audit"
)

func main() {
	dir := flag.String("dir", "seccomp", "directory holding the artifacts")
	check := flag.Bool("check", false, "compare instead of writing; exit 1 when they differ")
	flag.Parse()
	p := seccomp.Default()
	if *check {
		stale, err := audit.CheckArtifacts(p, *dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "seccompgen: %v\n", err)
			os.Exit(2)
		}
		if len(stale) > 0 {
			fmt.Fprintf(os.Stderr, "seccompgen: committed artifacts differ from seccomp/rules.go (run `make seccomp` and commit): %s\n", strings.Join(stale, ", "))
			os.Exit(1)
		}
		return
	}
	if err := audit.WriteArtifacts(p, *dir); err != nil {
		fmt.Fprintf(os.Stderr, "seccompgen: %v\n", err)
		os.Exit(1)
	}
}
