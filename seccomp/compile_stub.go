//go:build !(cgo && seccomp)

package seccomp

import "errors"

// errNoLibseccomp: the audit artifacts need libseccomp's syscall tables.
var errNoLibseccomp = errors.New("seccomp: built without cgo and -tags seccomp; libseccomp is needed for syscall numbers, PFC and BPF")

// SyscallNumber needs libseccomp; without it nothing resolves.
func SyscallNumber(name string, a Arch) (int, bool) { return 0, false }

// SyscallName needs libseccomp; without it nothing resolves.
func SyscallName(nr int, a Arch) (string, bool) { return "", false }

// ENOSYSAbove needs libseccomp.
func (p *Profile) ENOSYSAbove(a Arch) (int, error) { return 0, errNoLibseccomp }

// LibseccompVersion is "none" without libseccomp.
func LibseccompVersion() string { return "none" }

// PFC needs libseccomp.
func (p *Profile) PFC(a Arch) ([]byte, error) { return nil, errNoLibseccomp }

// BPF needs libseccomp.
func (p *Profile) BPF(a Arch) ([]byte, error) { return nil, errNoLibseccomp }

// Markdown needs libseccomp.
func (p *Profile) Markdown(arches ...Arch) ([]byte, error) { return nil, errNoLibseccomp }
