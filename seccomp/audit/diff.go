package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ParseOCI decodes a Docker/OCI seccomp JSON profile strictly: an unknown
// field is an error, not a silently ignored key.
func ParseOCI(data []byte) (*OCIProfile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var o OCIProfile
	if err := dec.Decode(&o); err != nil {
		return nil, fmt.Errorf("parsing seccomp JSON profile: %w", err)
	}
	if o.DefaultAction == "" {
		return nil, errors.New("parsing seccomp JSON profile: defaultAction is missing")
	}
	return &o, nil
}

// Change is one difference between two profiles for one syscall on one
// architecture. Old or New is empty when the syscall gained or lost all
// its rules (so it now falls to the default action, or no longer does).
type Change struct {
	Arch    string
	Syscall string
	Old     []string
	New     []string
}

func (c Change) String() string {
	show := func(s []string) string {
		if len(s) == 0 {
			return "(default)"
		}
		return strings.Join(s, "; ")
	}
	mark := "~"
	switch {
	case len(c.Old) == 0:
		mark = "+"
	case len(c.New) == 0:
		mark = "-"
	}
	return fmt.Sprintf("%s %-8s %-22s %s -> %s", mark, c.Arch, c.Syscall, show(c.Old), show(c.New))
}

// Diff compares two JSON profiles by syscall and architecture. The first
// result line(s) report a changed default action or architecture set.
func Diff(oldJSON, newJSON []byte) (header []string, changes []Change, err error) {
	o, err := ParseOCI(oldJSON)
	if err != nil {
		return nil, nil, fmt.Errorf("old profile: %w", err)
	}
	n, err := ParseOCI(newJSON)
	if err != nil {
		return nil, nil, fmt.Errorf("new profile: %w", err)
	}
	if od, nd := o.defaultString(), n.defaultString(); od != nd {
		header = append(header, fmt.Sprintf("default action: %s -> %s", od, nd))
	}
	oa, na := o.arches(), n.arches()
	if strings.Join(oa, ",") != strings.Join(na, ",") {
		header = append(header, fmt.Sprintf("architectures: %s -> %s", strings.Join(oa, ","), strings.Join(na, ",")))
	}
	om, nm := o.expand(), n.expand()
	archSet := map[string]bool{}
	for a := range om {
		archSet[a] = true
	}
	for a := range nm {
		archSet[a] = true
	}
	for _, a := range sortedKeys(archSet) {
		names := map[string]bool{}
		for s := range om[a] {
			names[s] = true
		}
		for s := range nm[a] {
			names[s] = true
		}
		for _, s := range sortedKeys(names) {
			ov, nv := om[a][s], nm[a][s]
			if strings.Join(ov, "\x00") != strings.Join(nv, "\x00") {
				changes = append(changes, Change{Arch: a, Syscall: s, Old: ov, New: nv})
			}
		}
	}
	return header, changes, nil
}

func (o *OCIProfile) defaultString() string {
	return actionString(o.DefaultAction, o.DefaultErrnoRet)
}

func actionString(act string, errno *uint) string {
	s := strings.TrimPrefix(act, "SCMP_ACT_")
	if errno != nil {
		s += "(" + errnoName(*errno) + ")"
	}
	return s
}

// arches returns the main architectures with their compat ABIs, in our
// naming (x86_64, aarch64, x86, x32, ...).
func (o *OCIProfile) arches() []string {
	var out []string
	for _, m := range o.ArchMap {
		s := archName(m.Architecture)
		if len(m.SubArchitectures) > 0 {
			var subs []string
			for _, sa := range m.SubArchitectures {
				subs = append(subs, archName(sa))
			}
			s += "+" + strings.Join(subs, "+")
		}
		out = append(out, s)
	}
	for _, a := range o.Architectures {
		out = append(out, archName(a))
	}
	sort.Strings(out)
	return out
}

func archName(scmp string) string {
	return strings.ToLower(strings.TrimPrefix(scmp, "SCMP_ARCH_"))
}

var goarchToArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "x86", "arm": "arm"}

// expand gives, per main architecture and syscall, the sorted list of
// rules that apply ("ALLOW if arg0 == 0x1", "ERRNO(ENOSYS)").
func (o *OCIProfile) expand() map[string]map[string][]string {
	var mains []string
	for _, m := range o.ArchMap {
		mains = append(mains, archName(m.Architecture))
	}
	if len(mains) == 0 {
		for _, a := range o.Architectures {
			mains = append(mains, archName(a))
		}
	}
	out := map[string]map[string][]string{}
	for _, a := range mains {
		out[a] = map[string][]string{}
	}
	applies := func(s *OCISyscall, arch string) bool {
		in := func(list []string) bool {
			for _, g := range list {
				if goarchToArch[g] == arch || g == arch {
					return true
				}
			}
			return false
		}
		if s.Includes != nil && len(s.Includes.Arches) > 0 && !in(s.Includes.Arches) {
			return false
		}
		if s.Excludes != nil && len(s.Excludes.Arches) > 0 && in(s.Excludes.Arches) {
			return false
		}
		return true
	}
	for i := range o.Syscalls {
		s := &o.Syscalls[i]
		desc := actionString(s.Action, s.ErrnoRet)
		var conds []string
		for _, a := range s.Args {
			conds = append(conds, ociArgString(a))
		}
		if len(conds) > 0 {
			desc += " if " + strings.Join(conds, " && ")
		}
		if s.Includes != nil {
			if len(s.Includes.Caps) > 0 {
				desc += " [with " + strings.Join(s.Includes.Caps, ",") + "]"
			}
			if s.Includes.MinKernel != "" {
				desc += " [kernel >= " + s.Includes.MinKernel + "]"
			}
		}
		if s.Excludes != nil && len(s.Excludes.Caps) > 0 {
			desc += " [without " + strings.Join(s.Excludes.Caps, ",") + "]"
		}
		for _, a := range mains {
			if !applies(s, a) {
				continue
			}
			for _, n := range s.Names {
				out[a][n] = append(out[a][n], desc)
			}
		}
	}
	for _, m := range out {
		for n := range m {
			sort.Strings(m[n])
		}
	}
	return out
}

func ociArgString(a OCIArg) string {
	op := strings.TrimPrefix(a.Op, "SCMP_CMP_")
	switch op {
	case "MASKED_EQ":
		return fmt.Sprintf("arg%d & %#x == %#x", a.Index, a.Value, a.ValueTwo)
	case "EQ":
		return fmt.Sprintf("arg%d == %#x", a.Index, a.Value)
	case "NE":
		return fmt.Sprintf("arg%d != %#x", a.Index, a.Value)
	case "GT":
		return fmt.Sprintf("arg%d > %#x", a.Index, a.Value)
	case "GE":
		return fmt.Sprintf("arg%d >= %#x", a.Index, a.Value)
	case "LT":
		return fmt.Sprintf("arg%d < %#x", a.Index, a.Value)
	case "LE":
		return fmt.Sprintf("arg%d <= %#x", a.Index, a.Value)
	}
	return fmt.Sprintf("arg%d %s %#x", a.Index, op, a.Value)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func errnoName(e uint) string {
	if n := unix.ErrnoName(syscall.Errno(e)); n != "" {
		return n
	}
	return fmt.Sprintf("%d", e)
}
