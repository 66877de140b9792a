//go:build cgo && seccomp

package seccomp

import (
	"fmt"
	"os"

	"github.com/opencontainers/runc/libcontainer/configs"
	libseccomp "github.com/seccomp/libseccomp-golang"
)

func (a Arch) scmp() (libseccomp.ScmpArch, error) {
	switch a {
	case ArchX86_64:
		return libseccomp.ArchAMD64, nil
	case ArchAArch64:
		return libseccomp.ArchARM64, nil
	}
	return libseccomp.ArchInvalid, fmt.Errorf("unsupported architecture %q", a)
}

// SyscallNumber resolves name on architecture a with libseccomp's tables.
// ok is false when the syscall does not exist there (or libseccomp is too
// old to know it).
func SyscallNumber(name string, a Arch) (nr int, ok bool) {
	sa, err := a.scmp()
	if err != nil {
		return 0, false
	}
	n, err := libseccomp.GetSyscallFromNameByArch(name, sa)
	if err != nil || n < 0 {
		return 0, false
	}
	return int(n), true
}

// SyscallName is the inverse of SyscallNumber.
func SyscallName(nr int, a Arch) (string, bool) {
	sa, err := a.scmp()
	if err != nil {
		return "", false
	}
	n, err := libseccomp.ScmpSyscall(nr).GetNameByArch(sa)
	if err != nil {
		return "", false
	}
	return n, true
}

// ENOSYSAbove is the highest syscall number the compiled profile names on
// a. runc's patchbpf prepends a stub that returns ENOSYS for every number
// above it on this architecture, so that a libc meeting a syscall newer
// than the profile falls back (as for clone3) instead of failing with
// EPERM. The value mirrors patchbpf.findLastSyscalls: every rule counts,
// whatever its action.
func (p *Profile) ENOSYSAbove(a Arch) (int, error) {
	cfg, err := p.libcontainerFor(a)
	if err != nil {
		return 0, err
	}
	max := 0
	for _, c := range cfg.Syscalls {
		if n, ok := SyscallNumber(c.Name, a); ok && n > max {
			max = n
		}
	}
	return max, nil
}

// LibseccompVersion is the version of the libseccomp the binary links,
// which decides the syscall tables and the exact BPF produced.
func LibseccompVersion() string {
	ma, mi, pa := libseccomp.GetLibraryVersion()
	return fmt.Sprintf("%d.%d.%d", ma, mi, pa)
}

// filterFor builds the libseccomp filter for architecture a exactly the
// way runc v1.5.3's libcontainer/seccomp.InitSeccomp does before
// patchbpf.PatchAndLoad adds the ENOSYS stub: same default action, same
// optimisation level, same rule skipping. On a foreign architecture the
// native one is removed so the export shows only a.
func (p *Profile) filterFor(a Arch) (*libseccomp.ScmpFilter, error) {
	cfg, err := p.libcontainerFor(a)
	if err != nil {
		return nil, err
	}
	sa, err := a.scmp()
	if err != nil {
		return nil, err
	}
	defAct, err := scmpAction(cfg.DefaultAction, cfg.DefaultErrnoRet)
	if err != nil {
		return nil, err
	}
	f, err := libseccomp.NewFilter(defAct)
	if err != nil {
		return nil, fmt.Errorf("creating libseccomp filter: %w", err)
	}
	native, err := libseccomp.GetNativeArch()
	if err != nil {
		f.Release()
		return nil, err
	}
	if native != sa {
		if err := f.AddArch(sa); err != nil {
			f.Release()
			return nil, fmt.Errorf("adding %s: %w", a, err)
		}
		if err := f.RemoveArch(native); err != nil {
			f.Release()
			return nil, fmt.Errorf("removing native %s: %w", native, err)
		}
	}
	if len(cfg.Syscalls) > 32 {
		if err := f.SetOptimize(2); err != nil {
			f.Release()
			return nil, fmt.Errorf("binary tree optimisation: %w", err)
		}
	}
	if err := f.SetNoNewPrivsBit(false); err != nil {
		f.Release()
		return nil, err
	}
	for _, c := range cfg.Syscalls {
		if err := addRule(f, c, defAct); err != nil {
			f.Release()
			return nil, err
		}
	}
	return f, nil
}

func scmpAction(act configs.Action, errno *uint) (libseccomp.ScmpAction, error) {
	switch act {
	case configs.Allow:
		return libseccomp.ActAllow, nil
	case configs.Errno:
		if errno == nil {
			return libseccomp.ActErrno.SetReturnCode(1), nil
		}
		return libseccomp.ActErrno.SetReturnCode(int16(*errno)), nil
	case configs.KillProcess:
		return libseccomp.ActKillProcess, nil
	case configs.Kill, configs.KillThread:
		return libseccomp.ActKillThread, nil
	}
	return libseccomp.ActInvalid, fmt.Errorf("action %d is not used by sandboxd profiles", act)
}

// addRule mirrors libcontainer/seccomp.matchCall.
func addRule(f *libseccomp.ScmpFilter, c *configs.Syscall, defAct libseccomp.ScmpAction) error {
	act, err := scmpAction(c.Action, c.ErrnoRet)
	if err != nil {
		return err
	}
	if act == defAct {
		return nil // matchCall drops it too; Validate forbids it
	}
	nr, err := libseccomp.GetSyscallFromName(c.Name)
	if err != nil {
		return nil // matchCall ignores unknown names; TestNamesResolve forbids them
	}
	if len(c.Args) == 0 {
		if err := f.AddRule(nr, act); err != nil {
			return fmt.Errorf("rule for %s: %w", c.Name, err)
		}
		return nil
	}
	var conds []libseccomp.ScmpCondition
	for _, a := range c.Args {
		op, err := scmpOp(a.Op)
		if err != nil {
			return err
		}
		cond, err := libseccomp.MakeCondition(a.Index, op, a.Value, a.ValueTwo)
		if err != nil {
			return fmt.Errorf("condition for %s: %w", c.Name, err)
		}
		conds = append(conds, cond)
	}
	// Validate guarantees one condition per argument, so runc takes its
	// "proper behaviour" branch: all conditions in one rule (ANDed).
	if err := f.AddRuleConditional(nr, act, conds); err != nil {
		return fmt.Errorf("rule for %s: %w", c.Name, err)
	}
	return nil
}

func scmpOp(op configs.Operator) (libseccomp.ScmpCompareOp, error) {
	switch op {
	case configs.EqualTo:
		return libseccomp.CompareEqual, nil
	case configs.NotEqualTo:
		return libseccomp.CompareNotEqual, nil
	case configs.GreaterThan:
		return libseccomp.CompareGreater, nil
	case configs.MaskEqualTo:
		return libseccomp.CompareMaskedEqual, nil
	}
	return libseccomp.CompareInvalid, fmt.Errorf("operator %d is not used by sandboxd profiles", op)
}

// BPF returns the classic BPF program libseccomp generates for a (without
// runc's ENOSYS stub).
func (p *Profile) BPF(a Arch) ([]byte, error) {
	f, err := p.filterFor(a)
	if err != nil {
		return nil, err
	}
	defer f.Release()
	// ExportBPFMem needs libseccomp 2.6; a file works everywhere.
	return exportVia(f.ExportBPF)
}

// ExportPFC returns libseccomp's human-readable (PFC) export of the filter
// for a, as libseccomp writes it; audit.PFC adds the header that states
// what runc puts in front of it.
func (p *Profile) ExportPFC(a Arch) ([]byte, error) {
	f, err := p.filterFor(a)
	if err != nil {
		return nil, err
	}
	defer f.Release()
	return exportVia(f.ExportPFC)
}

func exportVia(export func(*os.File) error) ([]byte, error) {
	tmp, err := os.CreateTemp("", "sandboxd-seccomp-export-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := export(tmp); err != nil {
		return nil, fmt.Errorf("libseccomp export: %w", err)
	}
	return os.ReadFile(tmp.Name())
}
