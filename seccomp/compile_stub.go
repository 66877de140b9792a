//go:build !(cgo && seccomp)

package seccomp

import "errors"

// errNoLibseccomp: syscall numbers and the filter exports need libseccomp.
var errNoLibseccomp = errors.New("seccomp: built without cgo and -tags seccomp; libseccomp is needed for syscall numbers, PFC and BPF")

// SyscallNumber needs libseccomp; without it nothing resolves.
func SyscallNumber(name string, a Arch) (int, bool) { return 0, false }

// SyscallName needs libseccomp; without it nothing resolves.
func SyscallName(nr int, a Arch) (string, bool) { return "", false }

// ENOSYSAbove needs libseccomp.
func (p *Profile) ENOSYSAbove(a Arch) (int, error) { return 0, errNoLibseccomp }

// LibseccompVersion is "none" without libseccomp.
func LibseccompVersion() string { return "none" }

// ExportPFC needs libseccomp.
func (p *Profile) ExportPFC(a Arch) ([]byte, error) { return nil, errNoLibseccomp }

// BPF needs libseccomp.
func (p *Profile) BPF(a Arch) ([]byte, error) { return nil, errNoLibseccomp }
