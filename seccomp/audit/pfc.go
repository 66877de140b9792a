//go:build cgo && seccomp

package audit

import (
	"bytes"
	"fmt"

	"github.com/sandboxd/sandboxd/seccomp"
)

// PFC returns libseccomp's human-readable export of p's filter for a,
// preceded by comments stating what runc adds around it: pfc/<arch>.pfc.
func PFC(p *seccomp.Profile, a seccomp.Arch) ([]byte, error) {
	return pfc(p, a, "seccomp filter")
}

// TemplatePFC is PFC of the template profile over p (seccomp.TemplateOf,
// the filter of a template's process; SECCOMP.md's last section):
// pfc/template-<arch>.pfc.
func TemplatePFC(p *seccomp.Profile, a seccomp.Arch) ([]byte, error) {
	return pfc(seccomp.TemplateOf(p), a, "template seccomp filter (the execution filter plus SECCOMP.md's \"Template profile\" rules)")
}

func pfc(p *seccomp.Profile, a seccomp.Arch, what string) ([]byte, error) {
	above, err := p.ENOSYSAbove(a)
	if err != nil {
		return nil, err
	}
	out, err := p.ExportPFC(a)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "#\n# sandboxd %s for %s, generated from seccomp/rules.go by `make seccomp`.\n", what, a)
	fmt.Fprintf(&b, "# libseccomp %s PFC export of the filter runc v1.5.3 builds (libcontainer/seccomp.InitSeccomp).\n", seccomp.LibseccompVersion())
	fmt.Fprintf(&b, "# runc's patchbpf prepends, before this filter:\n")
	fmt.Fprintf(&b, "#   if ($arch == %s && $syscall > %d) action ERRNO(%d);  # ENOSYS for syscalls newer than the profile\n", a, above, 38)
	fmt.Fprintf(&b, "# Any other architecture (i386, x32 numbers with bit 30 set) takes the bad-arch action below.\n#\n")
	b.Write(out)
	return b.Bytes(), nil
}
