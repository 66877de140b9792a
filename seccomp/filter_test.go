//go:build cgo && seccomp

package seccomp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	runcseccomp "github.com/opencontainers/runc/libcontainer/seccomp"
	"golang.org/x/sys/unix"
)

// SECCOMP_RET_* values as the kernel sees them.
const (
	retKillProcess = 0x80000000
	retKillThread  = 0x00000000
	retErrno       = 0x00050000
	retAllow       = 0x7fff0000

	auditArchX86_64  = 0xc000003e
	auditArchAArch64 = 0xc00000b7
	auditArchI386    = 0x40000003
	x32SyscallBit    = 0x40000000
)

func auditArch(a Arch) uint32 {
	if a == ArchAArch64 {
		return auditArchAArch64
	}
	return auditArchX86_64
}

// input is one struct seccomp_data.
type input struct {
	Arch uint32
	Nr   uint32 // the int nr as the filter's 32-bit loads see it
	Args [6]uint64
}

func (in input) bytes() []byte {
	b := make([]byte, 64)
	binary.NativeEndian.PutUint32(b[0:], in.Nr)
	binary.NativeEndian.PutUint32(b[4:], in.Arch)
	for i, a := range in.Args {
		binary.NativeEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// runBPF interprets a classic BPF seccomp program: the subset of cBPF
// that libseccomp and runc's patchbpf emit, and the kernel accepts.
func runBPF(prog []unix.SockFilter, in input) (uint32, error) {
	data := in.bytes()
	var A, X uint32
	var mem [16]uint32
	for pc := 0; pc < len(prog); pc++ {
		ins := prog[pc]
		k := ins.K
		switch ins.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if k%4 != 0 || int(k)+4 > len(data) {
				return 0, fmt.Errorf("pc %d: load at %d out of seccomp_data", pc, k)
			}
			A = binary.NativeEndian.Uint32(data[k:])
		case unix.BPF_LD | unix.BPF_MEM:
			A = mem[k]
		case unix.BPF_LDX | unix.BPF_MEM:
			X = mem[k]
		case unix.BPF_ST:
			mem[k] = A
		case unix.BPF_STX:
			mem[k] = X
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			A &= k
		case unix.BPF_ALU | unix.BPF_OR | unix.BPF_K:
			A |= k
		case unix.BPF_MISC | unix.BPF_TAX:
			X = A
		case unix.BPF_MISC | unix.BPF_TXA:
			A = X
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(k)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += jump(A == k, ins)
		case unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K:
			pc += jump(A > k, ins)
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			pc += jump(A >= k, ins)
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			pc += jump(A&k != 0, ins)
		case unix.BPF_RET | unix.BPF_K:
			return k, nil
		case unix.BPF_RET | unix.BPF_A:
			return A, nil
		default:
			return 0, fmt.Errorf("pc %d: opcode %#x not handled by the test interpreter", pc, ins.Code)
		}
	}
	return 0, fmt.Errorf("program fell off its end")
}

func jump(cond bool, ins unix.SockFilter) int {
	if cond {
		return int(ins.Jt)
	}
	return int(ins.Jf)
}

func condsMatch(cs []Cond, args [6]uint64) bool {
	for _, c := range cs {
		v := args[c.Index]
		var ok bool
		switch c.Op {
		case Equal:
			ok = v == c.Value
		case NotEqual:
			ok = v != c.Value
		case Greater:
			ok = v > c.Value
		case MaskedEqual:
			ok = v&c.Mask == c.Value
		}
		if !ok {
			return false
		}
	}
	return true
}

func actionRet(a Action) uint32 {
	switch a.Kind {
	case Allow:
		return retAllow
	case Errno:
		return retErrno | uint32(a.Errno)
	}
	return retKillProcess
}

// expect is the reference model: what the profile, read as documented in
// SECCOMP.md, says must happen to in on a host of architecture a. stub
// says whether runc's ENOSYS stub is in front of the filter.
func (p *Profile) expect(a Arch, in input, stub bool) (uint32, error) {
	if in.Arch != auditArch(a) {
		return retKillThread, nil // libseccomp's bad-arch action (SCMP_ACT_KILL)
	}
	if a == ArchX86_64 && in.Nr&x32SyscallBit != 0 {
		return retKillThread, nil // x32 is not in the filter; runc's stub skips these too
	}
	if stub {
		above, err := p.ENOSYSAbove(a)
		if err != nil {
			return 0, err
		}
		if r, ok := runcStub(a, above, in); ok {
			return r, nil
		}
	}
	if a == ArchX86_64 && in.Nr >= x32SyscallBit {
		// libseccomp's x86_64 filter sends every number >= 0x40000000 to
		// the bad-arch action; with runc's stub in front only numbers with
		// bit 30 set get that far.
		return retKillThread, nil
	}
	var got []uint32
	for i := range p.Rules {
		r := &p.Rules[i]
		if !containsArch(p.RuleArches(r), a) {
			continue
		}
		for _, n := range r.Names {
			if nr, ok := SyscallNumber(n, a); ok && uint32(nr) == in.Nr && condsMatch(r.Args, in.Args) {
				got = append(got, actionRet(r.Action))
			}
		}
	}
	if len(got) == 0 {
		return actionRet(p.Default), nil
	}
	for _, g := range got[1:] {
		if g != got[0] {
			return 0, fmt.Errorf("rules conflict for nr %d: %#x", in.Nr, got)
		}
	}
	return got[0], nil
}

// runcStub is the answer of runc's patchbpf stub, in front of a filter
// for a whose highest syscall number is above, to in; ok is false when
// the stub passes in on to the filter (another architecture, an x32
// number, a number the profile may name).
func runcStub(a Arch, above int, in input) (ret uint32, ok bool) {
	if in.Arch != auditArch(a) || (a == ArchX86_64 && in.Nr&x32SyscallBit != 0) || in.Nr <= uint32(above) {
		return 0, false
	}
	return retErrno | uint32(unix.ENOSYS), true
}

func retString(r uint32) string {
	switch {
	case r == retAllow:
		return "ALLOW"
	case r == retKillProcess:
		return "KILL_PROCESS"
	case r == retKillThread:
		return "KILL_THREAD"
	case r&0xffff0000 == retErrno:
		return "ERRNO(" + errnoName(uint(r&0xffff)) + ")"
	}
	return fmt.Sprintf("%#x", r)
}

// --- the filter the kernel really holds ------------------------------------

const loaderEnv = "SANDBOXD_SECCOMP_TEST_LOADER"

// A re-executed test binary loads the profile with runc's own
// libcontainer/seccomp.InitSeccomp (the exact code path of a sandbox's
// init) on one locked thread, prints that thread's id and blocks, so the
// parent can read the loaded program back from the kernel.
func init() {
	if os.Getenv(loaderEnv) != "1" {
		return
	}
	runtime.LockOSThread()
	cfg, err := Default().Libcontainer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "no_new_privs:", err)
		os.Exit(3)
	}
	if _, err := runcseccomp.InitSeccomp(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "InitSeccomp:", err)
		os.Exit(3)
	}
	fmt.Printf("%d\n", unix.Gettid())
	var b [1]byte
	_, _ = unix.Read(0, b[:])
	os.Exit(0)
}

var (
	kernelOnce sync.Once
	kernelProg []unix.SockFilter
	kernelErr  error
)

// kernelFilter returns the BPF program runc's InitSeccomp loads for
// Default(), as the kernel reports it (PTRACE_SECCOMP_GET_FILTER): runc's
// ENOSYS stub followed by libseccomp's filter. Needs root.
func kernelFilter(t testing.TB) []unix.SockFilter {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: reads the loaded filter back with PTRACE_SECCOMP_GET_FILTER (CAP_SYS_ADMIN)")
	}
	kernelOnce.Do(func() { kernelProg, kernelErr = readKernelFilter() })
	if kernelErr != nil {
		t.Fatalf("reading the loaded filter: %v", kernelErr)
	}
	return kernelProg
}

func readKernelFilter() ([]unix.SockFilter, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), loaderEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Wait()
		return nil, fmt.Errorf("loader: %v: %s", err, stderr.String())
	}
	tid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return nil, fmt.Errorf("loader said %q", line)
	}
	prog, err := LoadedProgram(tid)
	if err != nil {
		return nil, err
	}
	return prog.Instructions(), nil
}

// libseccompFilter is the BPF libseccomp exports for a, without runc's stub.
func libseccompFilter(t testing.TB, a Arch) []unix.SockFilter {
	t.Helper()
	return exportedFilter(t, Default(), a)
}

// exportedFilter is the BPF libseccomp exports for p on a, without runc's
// stub.
func exportedFilter(t testing.TB, p *Profile, a Arch) []unix.SockFilter {
	t.Helper()
	raw, err := p.BPF(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw)%8 != 0 {
		t.Fatalf("BPF export of %d bytes is not whole instructions", len(raw))
	}
	prog := make([]unix.SockFilter, len(raw)/8)
	for i := range prog {
		b := raw[8*i:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:])}
	}
	return prog
}

func nr(t testing.TB, name string, a Arch) uint32 {
	t.Helper()
	n, ok := SyscallNumber(name, a)
	if !ok {
		t.Fatalf("%s unknown on %s", name, a)
	}
	return uint32(n)
}

// TestLoadedFilterIsTheExportedOne proves the PFC artifacts describe what
// runs: the program the kernel holds ends with exactly the BPF our
// filterFor builds, so only runc's stub is in front of it.
func TestLoadedFilterIsTheExportedOne(t *testing.T) {
	native, _ := NativeArch()
	kp := kernelFilter(t)
	lp := libseccompFilter(t, native)
	if len(kp) <= len(lp) {
		t.Fatalf("loaded program has %d instructions, libseccomp's alone %d: no ENOSYS stub?", len(kp), len(lp))
	}
	tail := kp[len(kp)-len(lp):]
	for i := range lp {
		if tail[i] != lp[i] {
			t.Fatalf("instruction %d of the filter differs: kernel %+v, export %+v", i, tail[i], lp[i])
		}
	}
	t.Logf("loaded filter: %d instructions (runc stub %d + libseccomp %d)", len(kp), len(kp)-len(lp), len(lp))
}

// TestCompiledFilterTable runs named, synthetic inputs through the filter
// the kernel holds.
func TestCompiledFilterTable(t *testing.T) {
	native, _ := NativeArch()
	prog := kernelFilter(t)
	a := native
	arch := auditArch(a)
	sys := func(name string, args ...uint64) input {
		in := input{Arch: arch, Nr: nr(t, name, a)}
		copy(in.Args[:], args)
		return in
	}
	threadFlags := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD |
		unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID)
	eperm := uint32(retErrno | unix.EPERM)
	enosys := uint32(retErrno | unix.ENOSYS)
	eafnosupport := uint32(retErrno | unix.EAFNOSUPPORT)
	above, err := Default().ENOSYSAbove(a)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		in   input
		want uint32
	}{
		{"read", sys("read", 0), retAllow},
		{"write", sys("write", 1), retAllow},
		{"clone for a thread", sys("clone", threadFlags), retAllow},
		{"clone for fork", sys("clone", uint64(unix.CLONE_CHILD_SETTID|unix.CLONE_CHILD_CLEARTID|unix.SIGCHLD)), retAllow},
		{"clone for vfork/posix_spawn", sys("clone", uint64(unix.CLONE_VM|unix.CLONE_VFORK|unix.SIGCHLD)), retAllow},
		{"clone NEWUSER", sys("clone", unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), eperm},
		{"clone NEWNS", sys("clone", unix.CLONE_NEWNS), eperm},
		{"clone NEWPID", sys("clone", unix.CLONE_NEWPID), eperm},
		{"clone NEWNET", sys("clone", unix.CLONE_NEWNET), eperm},
		{"clone NEWUTS", sys("clone", unix.CLONE_NEWUTS), eperm},
		{"clone NEWIPC", sys("clone", unix.CLONE_NEWIPC), eperm},
		{"clone NEWCGROUP", sys("clone", unix.CLONE_NEWCGROUP), eperm},
		{"clone thread+NEWUSER", sys("clone", threadFlags|unix.CLONE_NEWUSER), eperm},
		{"clone flags with high bits", sys("clone", 1<<40|uint64(unix.SIGCHLD)), retAllow},
		{"clone3", sys("clone3", 0, 88), enosys},
		{"socket AF_UNIX", sys("socket", unix.AF_UNIX, unix.SOCK_STREAM), retAllow},
		{"socket AF_INET", sys("socket", unix.AF_INET, unix.SOCK_DGRAM), retAllow},
		{"socket AF_INET6", sys("socket", unix.AF_INET6, unix.SOCK_STREAM), retAllow},
		{"socket AF_NETLINK", sys("socket", unix.AF_NETLINK, unix.SOCK_RAW), eafnosupport},
		{"socket AF_PACKET", sys("socket", unix.AF_PACKET, unix.SOCK_RAW), eafnosupport},
		{"socket AF_VSOCK", sys("socket", unix.AF_VSOCK, unix.SOCK_STREAM), eafnosupport},
		{"socket AF_ALG", sys("socket", unix.AF_ALG, unix.SOCK_SEQPACKET), eafnosupport},
		{"socket AF_UNSPEC", sys("socket", unix.AF_UNSPEC), eafnosupport},
		{"socket AF_AX25", sys("socket", unix.AF_AX25), eafnosupport},
		// The kernel truncates domain to int: 1<<32|AF_UNIX must not pass as AF_UNIX.
		{"socket AF_UNIX with high bits", sys("socket", 1<<32|unix.AF_UNIX), eafnosupport},
		{"socketpair AF_UNIX", sys("socketpair", unix.AF_UNIX), retAllow},
		{"socketpair AF_INET", sys("socketpair", unix.AF_INET), eperm},
		{"mknodat FIFO", sys("mknodat", 0, 0, unix.S_IFIFO|0o644), retAllow},
		{"mknodat char device", sys("mknodat", 0, 0, unix.S_IFCHR|0o666, 0x103), eperm},
		{"mknodat block device", sys("mknodat", 0, 0, unix.S_IFBLK|0o666), eperm},
		{"ptrace", sys("ptrace"), eperm},
		{"mount", sys("mount"), eperm},
		{"umount2", sys("umount2"), eperm},
		{"pivot_root", sys("pivot_root"), eperm},
		{"unshare", sys("unshare", unix.CLONE_NEWUSER), eperm},
		{"setns", sys("setns"), eperm},
		{"keyctl", sys("keyctl"), eperm},
		{"bpf", sys("bpf"), eperm},
		{"perf_event_open", sys("perf_event_open"), eperm},
		{"userfaultfd", sys("userfaultfd"), eperm},
		{"io_uring_setup", sys("io_uring_setup"), eperm},
		{"fsopen", sys("fsopen"), eperm},
		{"mount_setattr", sys("mount_setattr"), eperm},
		{"kexec_load", sys("kexec_load"), eperm},
		{"finit_module", sys("finit_module"), eperm},
		{"open_by_handle_at", sys("open_by_handle_at"), eperm},
		{"setuid", sys("setuid", 0), eperm},
		{"highest named syscall is filtered, not stubbed", input{Arch: arch, Nr: uint32(above)}, retAllow},
		{"first number above the profile", input{Arch: arch, Nr: uint32(above) + 1}, enosys},
		{"far future syscall", input{Arch: arch, Nr: 1000}, enosys},
		{"i386 int 0x80 getpid", input{Arch: auditArchI386, Nr: 20}, retKillThread},
		{"i386 int 0x80 execve", input{Arch: auditArchI386, Nr: 11}, retKillThread},
		{"aarch64 audit arch on this host", input{Arch: auditArch(otherArch(a)), Nr: 63}, retKillThread},
	}
	if a == ArchX86_64 {
		cases = append(cases,
			struct {
				name string
				in   input
				want uint32
			}{"x32 read", input{Arch: arch, Nr: x32SyscallBit | 0}, retKillThread},
			struct {
				name string
				in   input
				want uint32
			}{"x32 execve", input{Arch: arch, Nr: x32SyscallBit | 520}, retKillThread},
			struct {
				name string
				in   input
				want uint32
			}{"x32 numbering of clone3", input{Arch: arch, Nr: x32SyscallBit | 435}, retKillThread},
		)
	}
	p := Default()
	for _, c := range cases {
		got, err := runBPF(prog, c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: filter says %s, want %s", c.name, retString(got), retString(c.want))
		}
		// The model must agree with every hand-written case too.
		if m, err := p.expect(a, c.in, true); err != nil || m != c.want {
			t.Errorf("%s: model says %s (%v), want %s", c.name, retString(m), err, retString(c.want))
		}
	}
}

// TestForeignArchitecturesAreKilled: compat ABIs are not in the filter, so
// every i386 syscall and every x32-numbered one is killed, whatever its
// number, on the program the kernel holds.
func TestForeignArchitecturesAreKilled(t *testing.T) {
	native, _ := NativeArch()
	prog := kernelFilter(t)
	for n := uint32(0); n < 1024; n++ {
		for _, in := range []input{
			{Arch: auditArchI386, Nr: n},
			{Arch: auditArch(otherArch(native)), Nr: n},
			{Arch: 0x40000028, Nr: n}, // AUDIT_ARCH_ARM (aarch32 compat)
		} {
			if got, err := runBPF(prog, in); err != nil || got != retKillThread {
				t.Fatalf("arch %#x nr %d: %s %v, want KILL_THREAD", in.Arch, n, retString(got), err)
			}
		}
		if native == ArchX86_64 {
			in := input{Arch: auditArchX86_64, Nr: x32SyscallBit | n}
			if got, err := runBPF(prog, in); err != nil || got != retKillThread {
				t.Fatalf("x32 nr %d: %s %v, want KILL_THREAD", n, retString(got), err)
			}
		}
	}
}

func otherArch(a Arch) Arch {
	if a == ArchX86_64 {
		return ArchAArch64
	}
	return ArchX86_64
}

// interestingArgs are argument values that sit on rule boundaries.
var interestingArgs = []uint64{
	0, 1, 2, 3, 9, 10, 11, 16, 17, 38, 40, 1 << 32, 1<<32 | 1, ^uint64(0),
	cloneNewMask, unix.CLONE_NEWUSER, unix.CLONE_NEWTIME, unix.CLONE_THREAD | unix.CLONE_VM,
	unix.S_IFIFO | 0o644, unix.S_IFCHR, unix.S_IFBLK, unix.S_IFREG, unix.S_IFSOCK,
}

// checkInput compares the compiled filter with the model for one input,
// on every program available: the kernel's (root only) and libseccomp's
// export for each architecture.
func checkInput(t *testing.T, kernel []unix.SockFilter, exports map[Arch][]unix.SockFilter, in input) {
	t.Helper()
	p := Default()
	native, _ := NativeArch()
	if kernel != nil {
		want, err := p.expect(native, in, true)
		if err != nil {
			t.Fatal(err)
		}
		got, err := runBPF(kernel, in)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("kernel filter, arch %#x nr %d args %#x: got %s, model says %s", in.Arch, in.Nr, in.Args, retString(got), retString(want))
		}
	}
	for a, prog := range exports {
		want, err := p.expect(a, in, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := runBPF(prog, in)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s export, arch %#x nr %d args %#x: got %s, model says %s", a, in.Arch, in.Nr, in.Args, retString(got), retString(want))
		}
	}
}

func programs(t *testing.T) ([]unix.SockFilter, map[Arch][]unix.SockFilter) {
	var kernel []unix.SockFilter
	if os.Geteuid() == 0 {
		kernel = kernelFilter(t)
	} else {
		t.Log("not root: checking libseccomp's exports only, not the loaded filter")
	}
	exports := map[Arch][]unix.SockFilter{}
	for _, a := range Default().Arches {
		exports[a] = libseccompFilter(t, a)
	}
	return kernel, exports
}

// TestCompiledFilterMatchesModel is the static twin of the fuzz test: every
// syscall number 0-1023 on every architecture value, with boundary
// arguments, plus a fixed-seed random sample.
func TestCompiledFilterMatchesModel(t *testing.T) {
	kernel, exports := programs(t)
	arches := []uint32{auditArchX86_64, auditArchAArch64, auditArchI386}
	for _, arch := range arches {
		for n := uint32(0); n < 1024; n++ {
			for _, nn := range []uint32{n, n | x32SyscallBit} {
				for _, v := range interestingArgs {
					in := input{Arch: arch, Nr: nn}
					for i := range in.Args {
						in.Args[i] = v
					}
					checkInput(t, kernel, exports, in)
				}
			}
		}
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		checkInput(t, kernel, exports, randomInput(rng.Uint32(), rng.Uint32(), [6]uint64{rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64()}))
	}
}

// randomInput biases raw fuzz values towards the interesting region: real
// architectures, numbers below 1024, and boundary arguments.
func randomInput(archSel, nrRaw uint32, raw [6]uint64) input {
	arches := []uint32{auditArchX86_64, auditArchAArch64, auditArchI386, archSel}
	in := input{Arch: arches[archSel%4]}
	switch (nrRaw >> 28) % 4 {
	case 0:
		in.Nr = nrRaw
	case 1:
		in.Nr = x32SyscallBit | nrRaw%1024
	default:
		in.Nr = nrRaw % 1024
	}
	for i, r := range raw {
		if r%3 == 0 {
			in.Args[i] = interestingArgs[int(r>>8)%len(interestingArgs)]
		} else {
			in.Args[i] = r
		}
	}
	return in
}

// FuzzCompiledFilter compares the compiled filter with the model on
// arbitrary seccomp_data. `go test` runs the seeds below (and any in
// testdata/fuzz); `go test -fuzz FuzzCompiledFilter` explores.
func FuzzCompiledFilter(f *testing.F) {
	f.Add(uint32(0), uint32(56), uint64(unix.CLONE_NEWUSER), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint32(0), uint32(41), uint64(unix.AF_NETLINK), uint64(3), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint32(1), uint32(198), uint64(1<<32|1), uint64(1), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint32(2), uint32(11), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint32(0), uint32(1<<28|435), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint32(0), uint32(259), uint64(0), uint64(0), uint64(unix.S_IFCHR), uint64(0), uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, archSel, nrRaw uint32, a0, a1, a2, a3, a4, a5 uint64) {
		kernel, exports := fuzzPrograms(t)
		checkInput(t, kernel, exports, randomInput(archSel, nrRaw, [6]uint64{a0, a1, a2, a3, a4, a5}))
	})
}

var (
	fuzzOnce    sync.Once
	fuzzKernel  []unix.SockFilter
	fuzzExports map[Arch][]unix.SockFilter
)

func fuzzPrograms(t *testing.T) ([]unix.SockFilter, map[Arch][]unix.SockFilter) {
	fuzzOnce.Do(func() { fuzzKernel, fuzzExports = programs(t) })
	return fuzzKernel, fuzzExports
}
