package seccomp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// OCIProfile is the Docker/moby seccomp profile format (a superset of the
// OCI runtime spec's linux.seccomp), so the profile can be diffed against
// Docker's default.json with `sandboxd seccomp diff`.
type OCIProfile struct {
	Comment         string       `json:"comment,omitempty"`
	DefaultAction   string       `json:"defaultAction"`
	DefaultErrnoRet *uint        `json:"defaultErrnoRet,omitempty"`
	Architectures   []string     `json:"architectures,omitempty"`
	ArchMap         []OCIArchMap `json:"archMap,omitempty"`
	Syscalls        []OCISyscall `json:"syscalls"`
	// Accepted so Docker/OCI profiles parse; not produced by sandboxd.
	Flags            []string `json:"flags,omitempty"`
	ListenerPath     string   `json:"listenerPath,omitempty"`
	ListenerMetadata string   `json:"listenerMetadata,omitempty"`
}

// OCIArchMap is one main architecture and the compat ABIs added with it.
type OCIArchMap struct {
	Architecture     string   `json:"architecture"`
	SubArchitectures []string `json:"subArchitectures"`
}

// OCISyscall is one rule.
type OCISyscall struct {
	Names    []string  `json:"names"`
	Action   string    `json:"action"`
	ErrnoRet *uint     `json:"errnoRet,omitempty"`
	Args     []OCIArg  `json:"args,omitempty"`
	Comment  string    `json:"comment,omitempty"`
	Includes *OCIMatch `json:"includes,omitempty"`
	Excludes *OCIMatch `json:"excludes,omitempty"`
}

// OCIArg is one argument condition. For SCMP_CMP_MASKED_EQ, Value is the
// mask and ValueTwo the datum.
type OCIArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

// OCIMatch restricts a rule (Docker extension): by GOARCH names, by
// capabilities, or by minimum kernel.
type OCIMatch struct {
	Arches    []string `json:"arches,omitempty"`
	Caps      []string `json:"caps,omitempty"`
	MinKernel string   `json:"minKernel,omitempty"`
}

func (a Action) oci() (string, *uint) {
	switch a.Kind {
	case Allow:
		return "SCMP_ACT_ALLOW", nil
	case Errno:
		e := a.Errno
		return "SCMP_ACT_ERRNO", &e
	default:
		return "SCMP_ACT_KILL_PROCESS", nil
	}
}

func (c Cond) oci() OCIArg {
	switch c.Op {
	case Equal:
		return OCIArg{Index: c.Index, Value: c.Value, Op: "SCMP_CMP_EQ"}
	case NotEqual:
		return OCIArg{Index: c.Index, Value: c.Value, Op: "SCMP_CMP_NE"}
	case Greater:
		return OCIArg{Index: c.Index, Value: c.Value, Op: "SCMP_CMP_GT"}
	default:
		return OCIArg{Index: c.Index, Value: c.Mask, ValueTwo: c.Value, Op: "SCMP_CMP_MASKED_EQ"}
	}
}

// OCI returns the profile in Docker's seccomp JSON format, restricted to
// the given architectures (all of the profile's when none are given).
func (p *Profile) OCI(arches ...Arch) (*OCIProfile, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("invalid seccomp profile: %w", err)
	}
	if len(arches) == 0 {
		arches = p.Arches
	}
	for _, a := range arches {
		if !containsArch(p.Arches, a) {
			return nil, fmt.Errorf("seccomp profile does not support architecture %s (it covers %v)", a, p.Arches)
		}
	}
	act, errno := p.Default.oci()
	out := &OCIProfile{
		Comment:         "sandboxd seccomp profile, generated from seccomp/rules.go by `make seccomp`; do not edit",
		DefaultAction:   act,
		DefaultErrnoRet: errno,
		Syscalls:        []OCISyscall{},
	}
	for _, a := range arches {
		// No subArchitectures: compat ABIs (x86, x32, arm) are never added.
		out.ArchMap = append(out.ArchMap, OCIArchMap{Architecture: a.ociName(), SubArchitectures: []string{}})
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		ra := p.ruleArchesIn(r, arches)
		if len(ra) == 0 {
			continue
		}
		s := OCISyscall{Names: append([]string(nil), r.Names...), Comment: r.Group + ": " + r.Reason}
		if r.Ref != "" {
			s.Comment += " (" + r.Ref + ")"
		}
		s.Action, s.ErrnoRet = r.Action.oci()
		for _, c := range r.Args {
			s.Args = append(s.Args, c.oci())
		}
		if len(ra) < len(arches) {
			s.Includes = &OCIMatch{}
			for _, a := range ra {
				s.Includes.Arches = append(s.Includes.Arches, a.goarch())
			}
		}
		out.Syscalls = append(out.Syscalls, s)
	}
	return out, nil
}

// JSON is OCI() rendered with two-space indentation and a final newline.
func (p *Profile) JSON(arches ...Arch) ([]byte, error) {
	o, err := p.OCI(arches...)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(o, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

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
