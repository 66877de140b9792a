//go:build cgo && seccomp

package audit

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/seccomp"
)

// The committed artifacts must be what the source generates (the same
// check as `make seccomp-check`, so `go test` catches a stale file too).
func TestArtifactsUpToDate(t *testing.T) {
	stale, err := CheckArtifacts(seccomp.Default(), "..")
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) > 0 {
		t.Fatalf("stale artifacts (run `make seccomp`): %v", stale)
	}
	// Byte-reproducible: two renders are identical.
	a1, _ := Artifacts(seccomp.Default())
	a2, _ := Artifacts(seccomp.Default())
	for k := range a1 {
		if string(a1[k]) != string(a2[k]) {
			t.Errorf("%s differs between two renders", k)
		}
	}
}

func TestDiff(t *testing.T) {
	old, err := JSON(seccomp.Default())
	if err != nil {
		t.Fatal(err)
	}
	p := seccomp.Default()
	for i := range p.Rules {
		if p.Rules[i].Names[0] == "clone3" {
			p.Rules[i].Action = seccomp.ActAllow
		}
	}
	p.Rules = append(p.Rules, seccomp.Rule{Names: []string{"ptrace"}, Action: seccomp.ActAllow, Arches: []seccomp.Arch{seccomp.ArchX86_64}, Group: "g", Reason: "debugging"})
	p.Denied = nil
	p.Default = seccomp.ActErrno(uint(unix.EACCES))
	nw, err := JSON(p)
	if err != nil {
		t.Fatal(err)
	}
	header, changes, err := Diff(old, nw)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	got = append(got, header...)
	for _, c := range changes {
		got = append(got, c.String())
	}
	want := []string{
		"default action: ERRNO(EPERM) -> ERRNO(EACCES)",
		"~ aarch64  clone3                 ERRNO(ENOSYS) -> ALLOW",
		"~ x86_64   clone3                 ERRNO(ENOSYS) -> ALLOW",
		"+ x86_64   ptrace                 (default) -> ALLOW",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if h, c, err := Diff(old, old); err != nil || len(h)+len(c) != 0 {
		t.Errorf("a profile differs from itself: %v %v %v", h, c, err)
	}
	if _, _, err := Diff([]byte(`{"defaultAction":"SCMP_ACT_ERRNO","bogus":1}`), old); err == nil {
		t.Error("unknown field accepted")
	}
	if _, _, err := Diff([]byte(`{}`), old); err == nil {
		t.Error("profile without defaultAction accepted")
	}
}
