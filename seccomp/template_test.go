//go:build cgo && seccomp

package seccomp

import (
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// The template profile under the execution profile (TEMPLATE.md section 6,
// SECURITY.md case 63). A fork G holds two filters: the template's,
// inherited from T, and the execution's, which it loads last. These tests
// need no root: they run libseccomp's exports of both profiles, with runc's
// ENOSYS stub in front, through the package's BPF interpreter (runBPF, the
// one TestCompiledFilterMatchesModel checks against the kernel's filter).

// retActionFull is SECCOMP_RET_ACTION_FULL: the action bits of an answer.
const retActionFull = 0xffff0000

// stacked is the kernel's answer (seccomp_run_filters) for a thread under
// two filters, older loaded before newer: every filter runs, and the
// answer whose action has the highest precedence wins (KILL_PROCESS >
// KILL_THREAD > TRAP > ERRNO > USER_NOTIF > TRACE > LOG > ALLOW: the
// action bits read as a signed 32-bit number, lowest first). The kernel
// walks the filters from the newest and replaces its answer only by one of
// strictly higher precedence, so on a tie the newer filter's answer, with
// its data (the errno), stands.
func stacked(older, newer uint32) uint32 {
	if int32(older&retActionFull) < int32(newer&retActionFull) {
		return older
	}
	return newer
}

func TestStackedPrecedence(t *testing.T) {
	const (
		retTrap   = 0x00030000
		retNotify = 0x7fc00000
		retTrace  = 0x7ff00000
		retLog    = 0x7ffc0000
	)
	eperm, eacces := uint32(retErrno|unix.EPERM), uint32(retErrno|unix.EACCES)
	// Highest precedence first.
	order := []uint32{retKillProcess, retKillThread, retTrap, eperm, retNotify, retTrace, retLog, retAllow}
	for i, hi := range order {
		for _, lo := range order[i+1:] {
			if got := stacked(hi, lo); got != hi {
				t.Errorf("older %s, newer %s: %s, want the older", retString(hi), retString(lo), retString(got))
			}
			if got := stacked(lo, hi); got != hi {
				t.Errorf("older %s, newer %s: %s, want the newer", retString(lo), retString(hi), retString(got))
			}
		}
	}
	if got := stacked(eacces, eperm); got != eperm {
		t.Errorf("a tie of errnos: %s, want the newer filter's EPERM", retString(got))
	}
}

// compiled is one profile's filter for one architecture as the kernel
// runs it: runc's ENOSYS stub, then libseccomp's program.
type compiled struct {
	a     Arch
	prog  []unix.SockFilter
	above int
}

func compileFor(t *testing.T, p *Profile, a Arch) compiled {
	t.Helper()
	above, err := p.ENOSYSAbove(a)
	if err != nil {
		t.Fatal(err)
	}
	return compiled{a: a, prog: exportedFilter(t, p, a), above: above}
}

func (c compiled) answer(t *testing.T, in input) uint32 {
	t.Helper()
	if r, ok := runcStub(c.a, c.above, in); ok {
		return r
	}
	r, err := runBPF(c.prog, in)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// templateArgs are the argument values of the template profile's own
// rules (unshare's and setns's namespace flags, keyctl's operations, the
// sandbox user's ids, seccomp's operation and flag are among them or
// interestingArgs).
var templateArgs = []uint64{
	unix.CLONE_NEWPID, unix.CLONE_NEWUSER | unix.CLONE_NEWPID, unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
	unix.CLONE_NEWNS, unix.CLONE_NEWNET, unix.CLONE_NEWIPC, unix.CLONE_NEWUTS, unix.CLONE_NEWCGROUP,
	unix.KEYCTL_JOIN_SESSION_KEYRING, unix.KEYCTL_DESCRIBE, unix.KEYCTL_SETPERM, inside.UID, inside.GID,
}

// stackInputs calls f on every syscall number 0-1023 (and its x32
// number) of the three audit architectures with each boundary or
// template argument in every position, then on a fixed-seed random sample,
// until f returns false.
func stackInputs(f func(input) bool) {
	args := append(slices.Clone(interestingArgs), templateArgs...)
	for _, arch := range []uint32{auditArchX86_64, auditArchAArch64, auditArchI386} {
		for n := uint32(0); n < 1024; n++ {
			for _, nn := range []uint32{n, n | x32SyscallBit} {
				for _, v := range args {
					in := input{Arch: arch, Nr: nn}
					for i := range in.Args {
						in.Args[i] = v
					}
					if !f(in) {
						return
					}
				}
			}
		}
	}
	rng := rand.New(rand.NewSource(1))
	for range 20000 {
		if !f(randomInput(rng.Uint32(), rng.Uint32(), [6]uint64{rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64()})) {
			return
		}
	}
}

// stackViolation is the first input on which a thread under tpl, then
// exec, gets another answer than under exec alone; ok when there is none.
// differ counts the inputs exec alone and tpl alone answer differently
// (what the template adds).
func stackViolation(t *testing.T, exec, tpl compiled) (bad input, alone, both uint32, differ int, ok bool) {
	t.Helper()
	ok = true
	stackInputs(func(in input) bool {
		e, p := exec.answer(t, in), tpl.answer(t, in)
		if e != p {
			differ++
		}
		if s := stacked(p, e); s != e {
			bad, alone, both, ok = in, e, s, false
			return false
		}
		return true
	})
	return bad, alone, both, differ, ok
}

// TestTemplateStacksToTheExecutionProfile: for every syscall and argument
// of the inputs above, on both architectures, a thread under the template
// filter and then the execution filter gets exactly the execution filter's
// answer: where the execution profile allows, the template allows; where
// it answers an errno, the template's answer is of no higher precedence
// (no kill). So a fork's effective policy is the execution profile's, the
// template's additions unreachable once G has loaded it. The same check
// must catch a template that denies what the execution profile allows or
// kills what it refuses, and let pass one that only answers another
// errno (a tie: the execution's errno stands).
func TestTemplateStacksToTheExecutionProfile(t *testing.T) {
	for _, a := range Arches {
		exec := compileFor(t, Default(), a)
		bad, alone, both, differ, ok := stackViolation(t, exec, compileFor(t, Template(), a))
		switch {
		case !ok:
			t.Errorf("%s: arch %#x nr %d args %#x: the execution filter alone answers %s, under the template's %s",
				a, bad.Arch, bad.Nr, bad.Args, retString(alone), retString(both))
		case differ == 0:
			t.Errorf("%s: the template profile answered every input as the execution profile: the test compares nothing", a)
		default:
			t.Logf("%s: the two profiles answer %d inputs differently, stacked always as the execution profile's", a, differ)
		}

		for _, c := range []struct {
			name  string
			edit  func(*Profile)
			fails bool
		}{
			{"denies getpid", func(p *Profile) {
				for i := range p.Rules {
					p.Rules[i].Names = slices.DeleteFunc(slices.Clone(p.Rules[i].Names), func(n string) bool { return n == "getpid" })
				}
				p.Rules = slices.DeleteFunc(p.Rules, func(r Rule) bool { return len(r.Names) == 0 })
			}, true},
			{"kills ptrace", func(p *Profile) {
				p.Rules = append(p.Rules, Rule{Names: []string{"ptrace"}, Action: ActKill, Group: "test", Reason: "test rule"})
			}, true},
			{"answers EACCES to mount", func(p *Profile) {
				p.Rules = append(p.Rules, Rule{Names: []string{"mount"}, Action: ActErrno(uint(unix.EACCES)), Group: "test", Reason: "test rule"})
			}, false},
		} {
			p := Template()
			c.edit(p)
			if _, _, _, _, ok := stackViolation(t, exec, compileFor(t, p, a)); ok == c.fails {
				t.Errorf("%s: a template that %s: violation found %v, want %v", a, c.name, !ok, c.fails)
			}
		}
	}
}

// TestTemplateProfileTable: what the template profile adds, on its
// compiled filter and in the model: exactly the calls template.py makes
// before G's drop, and no neighbour of them.
func TestTemplateProfileTable(t *testing.T) {
	p := Template()
	eperm := uint32(retErrno | unix.EPERM)
	for _, a := range p.Arches {
		c := compileFor(t, p, a)
		sys := func(name string, args ...uint64) input {
			in := input{Arch: auditArch(a), Nr: nr(t, name, a)}
			copy(in.Args[:], args)
			return in
		}
		u, g := uint64(inside.UID), uint64(inside.GID)
		for _, tc := range []struct {
			name string
			in   input
			want uint32
		}{
			{"unshare NEWUSER", sys("unshare", unix.CLONE_NEWUSER), eperm},
			{"unshare NEWPID", sys("unshare", unix.CLONE_NEWPID), eperm},
			{"unshare NEWNS", sys("unshare", unix.CLONE_NEWNS), eperm},
			{"unshare NEWNET", sys("unshare", unix.CLONE_NEWNET), eperm},
			{"unshare NEWUSER|NEWNS", sys("unshare", unix.CLONE_NEWUSER|unix.CLONE_NEWNS), eperm},
			{"unshare NEWUSER|CLONE_FILES", sys("unshare", unix.CLONE_NEWUSER|unix.CLONE_FILES), eperm},
			{"unshare NEWUSER with high bits", sys("unshare", 1<<32|unix.CLONE_NEWUSER), eperm},
			{"setns mount (G)", sys("setns", 5, unix.CLONE_NEWNS), retAllow},
			{"setns net (G)", sys("setns", 5, unix.CLONE_NEWNET), retAllow},
			{"setns ipc (G)", sys("setns", 5, unix.CLONE_NEWIPC), retAllow},
			{"setns uts (G)", sys("setns", 5, unix.CLONE_NEWUTS), retAllow},
			{"setns cgroup (G)", sys("setns", 5, unix.CLONE_NEWCGROUP), retAllow},
			{"setns any type", sys("setns", 5, 0), eperm},
			{"setns user", sys("setns", 5, unix.CLONE_NEWUSER), eperm},
			{"setns pid", sys("setns", 5, unix.CLONE_NEWPID), eperm},
			{"setns time", sys("setns", 5, unix.CLONE_NEWTIME), eperm},
			{"setns net|pid (a pidfd)", sys("setns", 5, unix.CLONE_NEWNET|unix.CLONE_NEWPID), eperm},
			{"setresuid 0 (G)", sys("setresuid", 0, 0, 0), retAllow},
			{"setresuid sandbox user (G)", sys("setresuid", u, u, u), retAllow},
			{"setresuid to HostIDBase", sys("setresuid", 1<<30, 1<<30, 1<<30), eperm},
			{"setresuid mixed", sys("setresuid", u, u, 0), eperm},
			{"setresuid -1", sys("setresuid", ^uint64(0), u, u), eperm},
			{"setresgid 0 (G)", sys("setresgid", 0, 0, 0), retAllow},
			{"setresgid sandbox group (G)", sys("setresgid", g, g, g), retAllow},
			{"setresgid other", sys("setresgid", 1, 1, 1), eperm},
			{"setgroups empty (G)", sys("setgroups", 0, 0), retAllow},
			{"setgroups one", sys("setgroups", 1, 0x1000), eperm},
			{"setuid", sys("setuid", 0), eperm},
			{"setreuid", sys("setreuid", 0, 0), eperm},
			{"capset", sys("capset"), eperm},
			{"keyctl JOIN_SESSION_KEYRING (G)", sys("keyctl", unix.KEYCTL_JOIN_SESSION_KEYRING, 0x1000), retAllow},
			{"keyctl DESCRIBE (G)", sys("keyctl", unix.KEYCTL_DESCRIBE, 5, 0x1000, 512), retAllow},
			{"keyctl SETPERM (G)", sys("keyctl", unix.KEYCTL_SETPERM, 5, 0x3f3f0008), retAllow},
			{"keyctl GET_KEYRING_ID", sys("keyctl", unix.KEYCTL_GET_KEYRING_ID), eperm},
			{"keyctl READ", sys("keyctl", unix.KEYCTL_READ, 5), eperm},
			{"keyctl JOIN with high bits", sys("keyctl", 1<<32|unix.KEYCTL_JOIN_SESSION_KEYRING), eperm},
			{"add_key", sys("add_key"), eperm},
			{"request_key", sys("request_key"), eperm},
			{"seccomp filter TSYNC (G)", sys("seccomp", unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, 0x1000), retAllow},
			{"seccomp filter TSYNC|SPEC_ALLOW", sys("seccomp", unix.SECCOMP_SET_MODE_FILTER,
				unix.SECCOMP_FILTER_FLAG_TSYNC|unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW), eperm},
			{"seccomp filter NEW_LISTENER", sys("seccomp", unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER), eperm},
			{"seccomp filter without TSYNC", sys("seccomp", unix.SECCOMP_SET_MODE_FILTER, 0), eperm},
			{"seccomp strict", sys("seccomp", unix.SECCOMP_SET_MODE_STRICT, 0), eperm},
			// What the execution profile denies stays denied.
			{"ptrace", sys("ptrace"), eperm},
			{"process_vm_readv", sys("process_vm_readv"), eperm},
			{"pidfd_getfd", sys("pidfd_getfd"), eperm},
			{"mount", sys("mount"), eperm},
			// SECURITY.md case 70: G, root of U_F in the shell's mount
			// namespace before its drop, could otherwise make the
			// shell's read-only cgroup mount writable (mount_setattr
			// needs CAP_SYS_ADMIN over the caller's own mount namespace)
			// or make mounts of its own.
			{"mount_setattr", sys("mount_setattr"), eperm},
			{"open_tree", sys("open_tree"), eperm},
			{"move_mount", sys("move_mount"), eperm},
			{"fsopen", sys("fsopen"), eperm},
			{"fsmount", sys("fsmount"), eperm},
			{"fspick", sys("fspick"), eperm},
			{"clone NEWUSER", sys("clone", unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), eperm},
			// T's clone3 of G (with CLONE_INTO_CGROUP on v2): allowed whole.
			{"clone3", sys("clone3"), retAllow},
			{"bpf", sys("bpf"), eperm},
			// What it allows stays allowed.
			{"fork", sys("clone", uint64(unix.CLONE_CHILD_SETTID|unix.CLONE_CHILD_CLEARTID|unix.SIGCHLD)), retAllow},
			{"pidfd_open", sys("pidfd_open"), retAllow},
			{"prctl", sys("prctl", unix.PR_CAPBSET_DROP, 0), retAllow},
		} {
			if got := c.answer(t, tc.in); got != tc.want {
				t.Errorf("%s: %s: the template filter answers %s, want %s", a, tc.name, retString(got), retString(tc.want))
			}
			if m, err := p.expect(a, tc.in, true); err != nil || m != tc.want {
				t.Errorf("%s: %s: the model says %s (%v), want %s", a, tc.name, retString(m), err, retString(tc.want))
			}
		}
	}
}

// TestTemplateRulesNameTheirStep: every rule the template profile adds
// says which step of template.py needs it, and allows only what the
// execution profile refuses.
func TestTemplateRulesNameTheirStep(t *testing.T) {
	exec := Default()
	allowed := map[string]bool{}
	for _, r := range exec.Rules {
		if r.Action == ActAllow {
			for _, n := range r.Names {
				allowed[n] = true
			}
		}
	}
	for _, r := range templateRules() {
		if r.Action != ActAllow {
			t.Errorf("template rule %v: %s; the template profile may only allow (anything else could answer a fork before the execution filter)", r.Names, r.Action)
		}
		if !strings.HasPrefix(r.Reason, "template.py ") {
			t.Errorf("template rule %v: its reason does not name template.py's step: %q", r.Names, r.Reason)
		}
		for _, n := range r.Names {
			if allowed[n] {
				t.Errorf("template rule for %s: the execution profile allows it already", n)
			}
		}
	}
	if err := Template().Validate(); err != nil {
		t.Fatal(err)
	}
	// TemplateOf leaves its argument alone.
	_ = TemplateOf(exec)
	if !reflect.DeepEqual(exec, Default()) {
		t.Error("TemplateOf changed the execution profile")
	}
}
