package seccomp

import (
	"fmt"
	"runtime"
	"syscall"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// NativeArch is the architecture this binary runs on, or an error when the
// profile does not support it.
func NativeArch() (Arch, error) {
	switch runtime.GOARCH {
	case "amd64":
		return ArchX86_64, nil
	case "arm64":
		return ArchAArch64, nil
	}
	return "", fmt.Errorf("seccomp: GOARCH %s is not supported: the profile covers x86_64 and aarch64 only", runtime.GOARCH)
}

// Libcontainer compiles the profile for the native architecture into the
// form runc's libcontainer loads (configs.Config.Seccomp). Only the native
// architecture is listed: i386 and x32 system calls then hit libseccomp's
// bad-architecture action and kill the caller.
func (p *Profile) Libcontainer() (*configs.Seccomp, error) {
	a, err := NativeArch()
	if err != nil {
		return nil, err
	}
	return p.libcontainerFor(a)
}

// libcontainerFor compiles the profile for architecture a.
func (p *Profile) libcontainerFor(a Arch) (*configs.Seccomp, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("invalid seccomp profile: %w", err)
	}
	if !containsArch(p.Arches, a) {
		return nil, fmt.Errorf("seccomp profile does not support architecture %s (it covers %v)", a, p.Arches)
	}
	defAct, defErrno := p.Default.libcontainer()
	cfg := &configs.Seccomp{
		DefaultAction:   defAct,
		DefaultErrnoRet: defErrno,
		Architectures:   []string{a.GOARCH()},
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if !containsArch(p.RuleArches(r), a) {
			continue
		}
		act, errno := r.Action.libcontainer()
		var args []*configs.Arg
		for _, c := range r.Args {
			args = append(args, c.libcontainer())
		}
		for _, n := range r.Names {
			cfg.Syscalls = append(cfg.Syscalls, &configs.Syscall{Name: n, Action: act, ErrnoRet: errno, Args: args})
		}
	}
	return cfg, nil
}

func containsArch(as []Arch, a Arch) bool {
	for _, x := range as {
		if x == a {
			return true
		}
	}
	return false
}

func (a Action) libcontainer() (configs.Action, *uint) {
	switch a.Kind {
	case Allow:
		return configs.Allow, nil
	case Errno:
		e := a.Errno
		return configs.Errno, &e
	default:
		// KillProcess, not Kill: configs.Kill is SECCOMP_RET_KILL_THREAD,
		// which would leave the rest of a multi-threaded process running.
		return configs.KillProcess, nil
	}
}

func (c Cond) libcontainer() *configs.Arg {
	switch c.Op {
	case Equal:
		return &configs.Arg{Index: c.Index, Op: configs.EqualTo, Value: c.Value}
	case NotEqual:
		return &configs.Arg{Index: c.Index, Op: configs.NotEqualTo, Value: c.Value}
	case Greater:
		return &configs.Arg{Index: c.Index, Op: configs.GreaterThan, Value: c.Value}
	default:
		// libseccomp's SCMP_CMP_MASKED_EQ takes the mask first, then the
		// datum (runc passes Value, ValueTwo in that order).
		return &configs.Arg{Index: c.Index, Op: configs.MaskEqualTo, Value: c.Mask, ValueTwo: c.Value}
	}
}

func errnoName(e uint) string {
	if n := unix.ErrnoName(syscall.Errno(e)); n != "" {
		return n
	}
	return fmt.Sprintf("%d", e)
}
