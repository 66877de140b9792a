//go:build !(cgo && seccomp)

package audit

import (
	"errors"

	"github.com/sandboxd/sandboxd/seccomp"
)

// errNoLibseccomp: SECCOMP.md and the PFC export need libseccomp's syscall
// tables and filter compiler.
var errNoLibseccomp = errors.New("seccomp audit: built without cgo and -tags seccomp; libseccomp is needed for syscall numbers and PFC")

// Markdown needs libseccomp.
func Markdown(p *seccomp.Profile, arches ...seccomp.Arch) ([]byte, error) {
	return nil, errNoLibseccomp
}

// PFC needs libseccomp.
func PFC(p *seccomp.Profile, a seccomp.Arch) ([]byte, error) { return nil, errNoLibseccomp }

// TemplatePFC needs libseccomp.
func TemplatePFC(p *seccomp.Profile, a seccomp.Arch) ([]byte, error) { return nil, errNoLibseccomp }
