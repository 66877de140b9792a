//go:build cgo && seccomp

package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/seccomp"
	"github.com/sandboxd/sandboxd/seccomp/audit"
)

func TestSeccompPrint(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "# sandboxd seccomp profile"},
		{[]string{"--format", "table", "--arch", "aarch64"}, "| syscall | number (aarch64) |"},
		{[]string{"--format", "json"}, `"SCMP_ARCH_AARCH64"`},
		{[]string{"--format", "json", "--arch", "amd64"}, `"SCMP_ARCH_X86_64"`},
		{[]string{"--format", "pfc", "--arch", "arm64"}, "filter for arch aarch64"},
		{[]string{"--format", "pfc"}, "# pseudo filter code start"},
		{[]string{"--format", "pfc", "--template"}, "template seccomp filter"},
		{[]string{"--format", "json", "--template"}, `"setns"`},
	} {
		var out bytes.Buffer
		if err := seccompPrint(&out, c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("%v: output lacks %q", c.args, c.want)
		}
	}
	var out bytes.Buffer
	if err := seccompPrint(&out, []string{"--format", "json", "--arch", "aarch64"}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "X86_64") || strings.Contains(out.String(), `"open"`) {
		t.Error("--arch aarch64 JSON mentions x86_64 or its legacy open(2)")
	}
	for _, bad := range [][]string{
		{"--format", "yaml"}, {"--arch", "i386"}, {"--arch", "x32"}, {"--bogus"}, {"extra"}, {"--template"},
	} {
		err := seccompPrint(&out, bad)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: want a usage error, got %v", bad, err)
		}
	}
}

func TestSeccompDiffCommand(t *testing.T) {
	dir := t.TempDir()
	old, err := audit.JSON(seccomp.Default())
	if err != nil {
		t.Fatal(err)
	}
	p := seccomp.Default()
	p.Rules = append(p.Rules, seccomp.Rule{Names: []string{"ptrace"}, Action: seccomp.ActAllow, Group: "debug", Reason: "let a debugger attach"})
	p.Denied = nil
	nw, err := audit.JSON(p)
	if err != nil {
		t.Fatal(err)
	}
	oldPath, newPath := filepath.Join(dir, "old.json"), filepath.Join(dir, "new.json")
	if err := os.WriteFile(oldPath, old, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newPath, nw, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := seccompDiff(&out, []string{oldPath, oldPath}); err != nil || out.Len() != 0 {
		t.Fatalf("identical profiles: %v %q", err, out.String())
	}
	err = seccompDiff(&out, []string{oldPath, newPath})
	if err == nil || !strings.Contains(err.Error(), "2 change(s)") {
		t.Fatalf("want a 2-change failure, got %v", err)
	}
	want := "+ aarch64  ptrace                 (default) -> ALLOW\n+ x86_64   ptrace                 (default) -> ALLOW\n"
	if out.String() != want {
		t.Errorf("diff output:\n%s\nwant:\n%s", out.String(), want)
	}
	if err := seccompDiff(&out, []string{oldPath}); err == nil {
		t.Error("one file accepted")
	}
	if err := seccompDiff(&out, []string{oldPath, filepath.Join(dir, "missing.json")}); err == nil {
		t.Error("missing file accepted")
	}
	// The committed profile must be what the binary prints.
	committed, err := os.ReadFile("../../seccomp/profile.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, old) {
		t.Error("seccomp/profile.json differs from the binary's profile: run make seccomp")
	}
}
