// Package seccomp holds sandboxd's seccomp allowlist as typed Go data (one
// source of truth, in the style of gVisor's runsc/boot/filter) and turns it
// into what runc's libcontainer loads. The audit artifacts a security
// reviewer reads (SECCOMP.md, an OCI/Docker-format JSON profile, libseccomp's
// PFC export per architecture) and the profile diff are rendered from it by
// the sub-package seccomp/audit.
//
// Every rule carries a reason; rules whose action would equal the default
// action are forbidden, because libcontainer silently drops them
// (libcontainer/seccomp.matchCall: "This rule is redundant, silently skip it").
// Syscalls that are denied by default are documented in Profile.Denied with
// the attack they defend against, and proven denied by a real-kernel probe.
package seccomp

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Arch is a native Linux architecture the profile is written for. Only
// 64-bit native ABIs are allowed: compat ABIs (i386 via int 0x80, x32) are
// not added to the filter, so libseccomp's bad-architecture action kills
// the caller (see SECCOMP.md and TestForeignArchitecturesAreKilled).
type Arch string

const (
	ArchX86_64  Arch = "x86_64"
	ArchAArch64 Arch = "aarch64"
)

// Arches are the architectures the default profile supports, in the order
// used by every artifact.
var Arches = []Arch{ArchX86_64, ArchAArch64}

// GOARCH is the Go GOARCH name (what runc's configs.Seccomp.Architectures
// and Docker's "includes.arches" use).
func (a Arch) GOARCH() string {
	switch a {
	case ArchX86_64:
		return "amd64"
	case ArchAArch64:
		return "arm64"
	}
	return ""
}

// ParseArch accepts x86_64/amd64 and aarch64/arm64.
func ParseArch(s string) (Arch, error) {
	switch strings.ToLower(s) {
	case "x86_64", "amd64", "x86-64":
		return ArchX86_64, nil
	case "aarch64", "arm64":
		return ArchAArch64, nil
	}
	return "", fmt.Errorf("unsupported architecture %q: want x86_64 or aarch64", s)
}

// ActionKind is what the kernel does when a rule matches.
type ActionKind int

const (
	// Allow lets the syscall run.
	Allow ActionKind = iota + 1
	// Errno fails the syscall with Action.Errno without running it.
	Errno
	// Kill kills the whole process with SIGSYS (SECCOMP_RET_KILL_PROCESS).
	Kill
)

// Action is a rule's (or the profile's default) action.
type Action struct {
	Kind  ActionKind
	Errno uint // only for Errno
}

// Common actions.
var (
	ActAllow = Action{Kind: Allow}
	ActKill  = Action{Kind: Kill}
)

// ActErrno fails a syscall with errno e.
func ActErrno(e uint) Action { return Action{Kind: Errno, Errno: e} }

func (a Action) String() string {
	switch a.Kind {
	case Allow:
		return "allow"
	case Errno:
		return fmt.Sprintf("errno %s", errnoName(a.Errno))
	case Kill:
		return "kill"
	}
	return fmt.Sprintf("invalid action %d", a.Kind)
}

// Op compares one syscall argument.
type Op int

const (
	// Equal: arg == Value.
	Equal Op = iota + 1
	// NotEqual: arg != Value.
	NotEqual
	// Greater: arg > Value (unsigned 64-bit).
	Greater
	// MaskedEqual: arg & Mask == Value. Required for flag arguments, so
	// that set bits are tested one by one rather than the whole word.
	MaskedEqual
)

// Cond is one condition on a syscall argument. A rule's conditions are
// ANDed; alternatives are separate rules.
type Cond struct {
	// Index is the argument position (0-5) in the native calling
	// convention. For clone, flags is argument 0 on both x86_64 and
	// aarch64 (only the tls/child_tid order differs; s390 swaps 0 and 1).
	Index uint
	// Name documents the argument ("flags", "domain", "mode").
	Name  string
	Op    Op
	Value uint64
	Mask  uint64 // only for MaskedEqual
}

func (c Cond) String() string {
	arg := fmt.Sprintf("arg%d", c.Index)
	if c.Name != "" {
		arg = fmt.Sprintf("arg%d(%s)", c.Index, c.Name)
	}
	switch c.Op {
	case Equal:
		return fmt.Sprintf("%s == %#x", arg, c.Value)
	case NotEqual:
		return fmt.Sprintf("%s != %#x", arg, c.Value)
	case Greater:
		return fmt.Sprintf("%s > %#x", arg, c.Value)
	case MaskedEqual:
		return fmt.Sprintf("%s & %#x == %#x", arg, c.Mask, c.Value)
	}
	return fmt.Sprintf("%s invalid-op(%d)", arg, c.Op)
}

// Rule applies one action to a set of syscalls, optionally only when the
// arguments match Args, on some architectures.
type Rule struct {
	Names  []string
	Action Action
	// Args are ANDed. At most one condition per argument index: runc
	// turns several conditions on the same argument into separate rules,
	// which ORs them (libcontainer/seccomp.matchCall, "hasMultipleArgs").
	Args []Cond
	// Arches limits the rule to some architectures; empty means all of
	// Profile.Arches (legacy syscalls such as open(2) exist only on x86_64).
	Arches []Arch
	// Group sorts the table ("files", "process", "network", ...).
	Group string
	// Reason says why the rule exists. Required.
	Reason string
	// Ref is a CVE or URL, where one explains the rule.
	Ref string
}

// Denial documents a syscall that is denied because it is absent from the
// allowlist (the default action applies; or ENOSYS when its number is above
// the highest number in the profile, see Profile.Describe). It is not
// compiled into the filter: a rule with the default action would be dropped
// by libcontainer anyway.
type Denial struct {
	Names  []string
	Group  string
	Reason string
	Ref    string
}

// Profile is a complete seccomp policy.
type Profile struct {
	// Default applies to every syscall no rule matches.
	Default Action
	// Arches the profile is written for. Compat ABIs are never added.
	Arches []Arch
	Rules  []Rule
	Denied []Denial
}

// RuleArches returns the architectures r applies to.
func (p *Profile) RuleArches(r *Rule) []Arch {
	if len(r.Arches) == 0 {
		return p.Arches
	}
	return r.Arches
}

// syscallName is compiled on first use: sandboxd's every sandbox init (the
// binary re-executed by libcontainer) initialises this package before it
// hands over, and never validates a profile.
var syscallName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z_][a-z0-9_]*$`) })

// Validate rejects a profile that libcontainer would compile into something
// other than what it says: rules equal to the default action (silently
// dropped by libcontainer), several conditions on one argument (ORed by
// runc), unmasked flag compares, rules without a reason, unknown arches.
func (p *Profile) Validate() error {
	if p == nil {
		return errors.New("seccomp profile is nil")
	}
	var errs []error
	if err := p.Default.validate(); err != nil {
		errs = append(errs, fmt.Errorf("default action: %w", err))
	}
	if p.Default.Kind == Allow {
		errs = append(errs, errors.New("default action must not be allow: the profile is an allowlist"))
	}
	if len(p.Arches) == 0 {
		errs = append(errs, errors.New("at least one architecture is required"))
	}
	for _, a := range p.Arches {
		if a.GOARCH() == "" {
			errs = append(errs, fmt.Errorf("architecture %q is not supported: want x86_64 or aarch64 (no compat ABIs)", a))
		}
	}
	allowed := map[string]bool{}
	for i := range p.Rules {
		r := &p.Rules[i]
		where := fmt.Sprintf("rule %d (%s)", i, strings.Join(r.Names, ","))
		if len(r.Names) == 0 {
			errs = append(errs, fmt.Errorf("rule %d names no syscall", i))
		}
		for _, n := range r.Names {
			if !syscallName().MatchString(n) {
				errs = append(errs, fmt.Errorf("%s: %q is not a syscall name", where, n))
			}
		}
		if err := r.Action.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		if r.Action == p.Default {
			errs = append(errs, fmt.Errorf("%s: action %s equals the default action; libcontainer would silently drop it (list it in Denied instead)", where, r.Action))
		}
		if strings.TrimSpace(r.Reason) == "" {
			errs = append(errs, fmt.Errorf("%s: a reason is required", where))
		}
		if strings.TrimSpace(r.Group) == "" {
			errs = append(errs, fmt.Errorf("%s: a group is required", where))
		}
		for _, a := range r.Arches {
			if !slices.Contains(p.Arches, a) {
				errs = append(errs, fmt.Errorf("%s: architecture %q is not one of the profile's %v", where, a, p.Arches))
			}
		}
		seen := map[uint]bool{}
		for _, c := range r.Args {
			if c.Index > 5 {
				errs = append(errs, fmt.Errorf("%s: argument index must be 0-5, got: %d", where, c.Index))
			}
			if seen[c.Index] {
				errs = append(errs, fmt.Errorf("%s: two conditions on argument %d; runc ORs them (split the rule instead)", where, c.Index))
			}
			seen[c.Index] = true
			switch c.Op {
			case Equal, NotEqual, Greater:
				if c.Mask != 0 {
					errs = append(errs, fmt.Errorf("%s: %s has a mask but is not a masked compare", where, c))
				}
			case MaskedEqual:
				if c.Mask == 0 {
					errs = append(errs, fmt.Errorf("%s: %s: masked compare with mask 0 matches everything", where, c))
				}
				if c.Value&^c.Mask != 0 {
					errs = append(errs, fmt.Errorf("%s: %s: value has bits outside the mask and can never match", where, c))
				}
			default:
				errs = append(errs, fmt.Errorf("%s: invalid operator %d", where, c.Op))
			}
			for _, n := range r.Names {
				if flagArgs[n][c.Index] && c.Op != MaskedEqual {
					errs = append(errs, fmt.Errorf("%s: argument %d of %s is a flag word and must use a masked compare, got: %s", where, c.Index, n, c))
				}
			}
		}
		if r.Action.Kind == Allow {
			for _, n := range r.Names {
				allowed[n] = true
			}
		}
	}
	for i, d := range p.Denied {
		if len(d.Names) == 0 {
			errs = append(errs, fmt.Errorf("denial %d names no syscall", i))
		}
		if strings.TrimSpace(d.Reason) == "" {
			errs = append(errs, fmt.Errorf("denial %d (%s): a reason is required", i, strings.Join(d.Names, ",")))
		}
		for _, n := range d.Names {
			if allowed[n] {
				errs = append(errs, fmt.Errorf("denial %d: %s is documented as denied but a rule allows it", i, n))
			}
		}
	}
	return errors.Join(errs...)
}

func (a Action) validate() error {
	switch a.Kind {
	case Allow, Kill:
		if a.Errno != 0 {
			return fmt.Errorf("%s must not carry an errno, got: %d", a, a.Errno)
		}
	case Errno:
		if a.Errno == 0 || a.Errno > 4095 {
			return fmt.Errorf("errno must be 1-4095, got: %d", a.Errno)
		}
	default:
		return fmt.Errorf("invalid action kind %d", a.Kind)
	}
	return nil
}

// flagArgs lists, per syscall, the argument indexes that are bit sets: a
// condition on them must be a masked compare, or one extra bit (say
// CLONE_NEWUSER next to CLONE_THREAD) would slip past an equality test.
var flagArgs = map[string]map[uint]bool{
	"clone":   {0: true},
	"unshare": {0: true},
	"setns":   {1: true},
	"mknod":   {1: true},
	"mknodat": {2: true},
	"open":    {1: true},
	"openat":  {2: true},
	"mmap":    {2: true, 3: true},
	"prctl":   {},
	"seccomp": {1: true},
}
