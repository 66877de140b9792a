//go:build cgo && seccomp

package seccomp

import (
	"strings"
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// profiles are the package's two profiles, which every property test
// below holds to: the execution profile and the template profile.
func profiles() map[string]*Profile {
	return map[string]*Profile{"execution": Default(), "template": Template()}
}

func TestDefaultValidates(t *testing.T) {
	for name, p := range profiles() {
		if err := p.Validate(); err != nil {
			t.Fatalf("%s profile: %v", name, err)
		}
	}
}

// Every name must resolve on every architecture its rule declares: runc
// silently ignores a name libseccomp does not know ("unknown seccomp
// syscall ignored"), so a typo would quietly deny a syscall, or, worse,
// drop an errno rule and let the default apply.
func TestNamesResolveOnDeclaredArches(t *testing.T) {
	for name, p := range profiles() {
		t.Run(name, func(t *testing.T) { namesResolve(t, p) })
	}
}

func namesResolve(t *testing.T, p *Profile) {
	for _, r := range p.Rules {
		for _, a := range p.RuleArches(&r) {
			for _, n := range r.Names {
				if _, ok := SyscallNumber(n, a); !ok {
					t.Errorf("%s does not exist on %s (libseccomp %s); restrict the rule's Arches", n, a, LibseccompVersion())
				}
			}
		}
	}
	// A rule limited to x86_64 must really be missing on aarch64;
	// otherwise aarch64 silently loses it.
	for _, r := range p.Rules {
		if len(r.Arches) == 0 {
			continue
		}
		for _, a := range p.Arches {
			if containsArch(r.Arches, a) {
				continue
			}
			for _, n := range r.Names {
				if _, ok := SyscallNumber(n, a); ok {
					t.Errorf("%s exists on %s but its rule is limited to %v", n, a, r.Arches)
				}
			}
		}
	}
	for _, d := range p.Denied {
		for _, n := range d.Names {
			found := false
			for _, a := range p.Arches {
				if _, ok := SyscallNumber(n, a); ok {
					found = true
				}
			}
			if !found {
				t.Errorf("denied syscall %s exists on no architecture", n)
			}
		}
	}
}

// libcontainer drops rules whose action equals the default action
// (matchCall: "This rule is redundant, silently skip it"). Check the
// compiled config, not only the Go data, for every architecture.
func TestNoRuleEqualsDefaultAction(t *testing.T) {
	for name, p := range profiles() {
		t.Run(name, func(t *testing.T) { noRuleEqualsDefault(t, p) })
	}
}

func noRuleEqualsDefault(t *testing.T, p *Profile) {
	for _, a := range p.Arches {
		cfg, err := p.libcontainerFor(a)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cfg.Syscalls {
			if c.Action == cfg.DefaultAction && ((c.ErrnoRet == nil) == (cfg.DefaultErrnoRet == nil)) &&
				(c.ErrnoRet == nil || *c.ErrnoRet == *cfg.DefaultErrnoRet) {
				t.Errorf("%s: rule for %s has the default action and would be dropped", a, c.Name)
			}
		}
	}
}

func TestEveryRuleHasReasonAndGroup(t *testing.T) {
	for name, p := range profiles() {
		t.Run(name, func(t *testing.T) { everyRuleHasReasonAndGroup(t, p) })
	}
}

func everyRuleHasReasonAndGroup(t *testing.T, p *Profile) {
	for _, r := range p.Rules {
		if len(strings.TrimSpace(r.Reason)) < 10 {
			t.Errorf("rule %v: reason %q is not an explanation", r.Names, r.Reason)
		}
		if r.Group == "" {
			t.Errorf("rule %v has no group", r.Names)
		}
	}
	for _, d := range p.Denied {
		if len(strings.TrimSpace(d.Reason)) < 10 {
			t.Errorf("denial %v: reason %q is not an explanation", d.Names, d.Reason)
		}
	}
}

func TestFlagArgumentsUseMaskedCompares(t *testing.T) {
	p := Default()
	var sawClone bool
	for _, r := range p.Rules {
		for _, n := range r.Names {
			if n == "clone" {
				sawClone = true
				if r.Action != ActAllow || len(r.Args) != 1 {
					t.Fatalf("clone rule: want one allow with one condition, got %+v", r)
				}
				c := r.Args[0]
				if c.Index != 0 || c.Op != MaskedEqual || c.Value != 0 {
					t.Errorf("clone must be allowed only when flags & CLONE_NEW* == 0, got %s", c)
				}
				for _, f := range []uint64{unix.CLONE_NEWUSER, unix.CLONE_NEWNS, unix.CLONE_NEWPID, unix.CLONE_NEWNET,
					unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWCGROUP, unix.CLONE_NEWTIME} {
					if c.Mask&f == 0 {
						t.Errorf("clone mask %#x misses namespace flag %#x", c.Mask, f)
					}
				}
				// Threads and fork must still pass.
				for _, ok := range []uint64{
					unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD |
						unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID,
					unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD),
					unix.CLONE_VM | unix.CLONE_VFORK | uint64(unix.SIGCHLD),
				} {
					if ok&c.Mask != 0 {
						t.Errorf("clone flags %#x (threads/fork/vfork) would be refused by mask %#x", ok, c.Mask)
					}
				}
			}
		}
	}
	if !sawClone {
		t.Fatal("no clone rule: threads could not start")
	}
	// Validate enforces the same for every flag argument; prove it does.
	bad := Default()
	bad.Rules = append(bad.Rules, Rule{Names: []string{"unshare"}, Action: ActErrno(uint(unix.EINVAL)), Group: "x", Reason: "test rule",
		Args: []Cond{{Index: 0, Op: Equal, Value: unix.CLONE_NEWUSER}}})
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "masked compare") {
		t.Errorf("Validate accepted an equality test on a flag word: %v", err)
	}
}

func TestClone3IsENOSYS(t *testing.T) {
	p := Default()
	for _, r := range p.Rules {
		for _, n := range r.Names {
			if n == "clone3" {
				if r.Action != ActErrno(uint(unix.ENOSYS)) || len(r.Args) != 0 {
					t.Fatalf("clone3 must fail with ENOSYS unconditionally (glibc falls back to clone), got %s", r.Action)
				}
				return
			}
		}
	}
	t.Fatal("no clone3 rule: it would get EPERM and pthread_create would fail")
}

func TestDeniedAreNotAllowed(t *testing.T) {
	p := Default()
	allowed := map[string]bool{}
	for _, r := range p.Rules {
		if r.Action.Kind == Allow {
			for _, n := range r.Names {
				allowed[n] = true
			}
		}
	}
	must := []string{"ptrace", "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
		"fspick", "mount_setattr", "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
		"userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
		"init_module", "finit_module", "delete_module", "clone3", "open_by_handle_at"}
	denied := map[string]bool{}
	for _, d := range p.Denied {
		for _, n := range d.Names {
			denied[n] = true
		}
	}
	for _, n := range must {
		if allowed[n] {
			t.Errorf("%s is allowed", n)
		}
		if !denied[n] && n != "clone3" {
			t.Errorf("%s is not documented in Denied", n)
		}
	}
}

// Several rules for one syscall must not overlap with different actions:
// libseccomp would resolve the conflict by its own priorities, not ours.
// Socket is the only syscall with several rules; check its families.
func TestSocketFamilies(t *testing.T) {
	p := Default()
	for fam := uint64(0); fam < 64; fam++ {
		var acts []Action
		for _, r := range p.Rules {
			if len(r.Names) != 1 || r.Names[0] != "socket" {
				continue
			}
			if condsMatch(r.Args, [6]uint64{fam}) {
				acts = append(acts, r.Action)
			}
		}
		want := ActErrno(uint(unix.EAFNOSUPPORT))
		if fam == unix.AF_UNIX || fam == unix.AF_INET || fam == unix.AF_INET6 {
			want = ActAllow
		}
		if len(acts) != 1 || acts[0] != want {
			t.Errorf("socket family %d: rules %v, want exactly [%s]", fam, acts, want)
		}
	}
}

// Validate must reject each way a profile can silently mean something else
// once libcontainer compiles it.
func TestValidateRejects(t *testing.T) {
	cases := map[string]func(p *Profile){
		"rule equal to default": func(p *Profile) {
			p.Rules = append(p.Rules, Rule{Names: []string{"ptrace"}, Action: p.Default, Group: "g", Reason: "deny ptrace explicitly"})
		},
		"missing reason": func(p *Profile) { p.Rules[0].Reason = " " },
		"missing group":  func(p *Profile) { p.Rules[0].Group = "" },
		"two conditions on one argument": func(p *Profile) {
			p.Rules = append(p.Rules, Rule{Names: []string{"socket"}, Action: ActErrno(22), Group: "g", Reason: "range of families",
				Args: []Cond{{Index: 0, Op: Greater, Value: 3}, {Index: 0, Op: Equal, Value: 9}}})
		},
		"mask zero":          func(p *Profile) { p.Rules = append(p.Rules, maskedRule(0, 0)) },
		"value outside mask": func(p *Profile) { p.Rules = append(p.Rules, maskedRule(0xf0, 0x1)) },
		"compat arch":        func(p *Profile) { p.Arches = append(p.Arches, "i386") },
		"rule arch not in profile": func(p *Profile) {
			p.Arches = []Arch{ArchX86_64}
			p.Rules[0].Arches = []Arch{ArchAArch64}
		},
		"allow default":      func(p *Profile) { p.Default = ActAllow },
		"errno out of range": func(p *Profile) { p.Rules[0].Action = ActErrno(5000) },
		"errno zero":         func(p *Profile) { p.Rules[0].Action = ActErrno(0) },
		"bad name":           func(p *Profile) { p.Rules[0].Names = []string{"Read;"} },
		"argument index": func(p *Profile) {
			p.Rules = append(p.Rules, Rule{Names: []string{"read"}, Action: ActAllow, Group: "g", Reason: "xxxxxxxxxx", Args: []Cond{{Index: 6, Op: Equal}}})
		},
		"denied but allowed": func(p *Profile) {
			p.Denied = append(p.Denied, Denial{Names: []string{"read"}, Reason: "contradiction"})
		},
		"no architectures": func(p *Profile) { p.Arches = nil },
		"invalid action":   func(p *Profile) { p.Rules[0].Action = Action{} },
		"invalid operator": func(p *Profile) {
			p.Rules = append(p.Rules, Rule{Names: []string{"read"}, Action: ActAllow, Group: "g", Reason: "xxxxxxxxxx", Args: []Cond{{Index: 1}}})
		},
		"rule without a name": func(p *Profile) { p.Rules[0].Names = nil },
		"mask on equality": func(p *Profile) {
			p.Rules = append(p.Rules, Rule{Names: []string{"read"}, Action: ActAllow, Group: "g", Reason: "xxxxxxxxxx", Args: []Cond{{Index: 0, Op: Equal, Mask: 1}}})
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := Default()
			mutate(p)
			if err := p.Validate(); err == nil {
				t.Fatal("Validate accepted it")
			} else {
				t.Log(err)
			}
			if _, err := p.libcontainerFor(ArchX86_64); err == nil {
				t.Fatal("libcontainerFor compiled an invalid profile")
			}
		})
	}
}

func maskedRule(mask, value uint64) Rule {
	return Rule{Names: []string{"mknodat"}, Action: ActAllow, Group: "g", Reason: "masked test rule",
		Args: []Cond{{Index: 2, Op: MaskedEqual, Mask: mask, Value: value}}}
}

func TestLibcontainerConfig(t *testing.T) {
	cfg, err := Default().Libcontainer()
	if err != nil {
		t.Fatal(err)
	}
	native, _ := NativeArch()
	if len(cfg.Architectures) != 1 || cfg.Architectures[0] != native.GOARCH() {
		t.Errorf("architectures %v: want only the native %s (no compat ABIs)", cfg.Architectures, native.GOARCH())
	}
	if cfg.DefaultAction != configs.Errno || cfg.DefaultErrnoRet == nil || *cfg.DefaultErrnoRet != uint(unix.EPERM) {
		t.Errorf("default action %v/%v: want errno EPERM", cfg.DefaultAction, cfg.DefaultErrnoRet)
	}
	for _, c := range cfg.Syscalls {
		if c.Action == configs.Kill || c.Action == configs.KillThread {
			t.Errorf("%s: kill must be KillProcess, not thread-only", c.Name)
		}
		if c.Name == "clone" {
			if len(c.Args) != 1 || c.Args[0].Op != configs.MaskEqualTo || c.Args[0].Value != cloneNewMask || c.Args[0].ValueTwo != 0 {
				t.Errorf("clone arg: %+v; want MaskEqualTo mask %#x datum 0", c.Args, cloneNewMask)
			}
		}
	}
	// A fresh copy each call: callers may not alias the default.
	a, b := Default(), Default()
	a.Rules[0].Names[0] = "changed"
	if b.Rules[0].Names[0] == "changed" {
		t.Error("Default returns shared data")
	}
}
