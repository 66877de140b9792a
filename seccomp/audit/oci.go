package audit

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/sandboxd/sandboxd/seccomp"
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

func ociAction(a seccomp.Action) (string, *uint) {
	switch a.Kind {
	case seccomp.Allow:
		return "SCMP_ACT_ALLOW", nil
	case seccomp.Errno:
		e := a.Errno
		return "SCMP_ACT_ERRNO", &e
	default:
		return "SCMP_ACT_KILL_PROCESS", nil
	}
}

func ociArg(c seccomp.Cond) OCIArg {
	switch c.Op {
	case seccomp.Equal:
		return OCIArg{Index: c.Index, Value: c.Value, Op: "SCMP_CMP_EQ"}
	case seccomp.NotEqual:
		return OCIArg{Index: c.Index, Value: c.Value, Op: "SCMP_CMP_NE"}
	case seccomp.Greater:
		return OCIArg{Index: c.Index, Value: c.Value, Op: "SCMP_CMP_GT"}
	default:
		return OCIArg{Index: c.Index, Value: c.Mask, ValueTwo: c.Value, Op: "SCMP_CMP_MASKED_EQ"}
	}
}

// ociName is the SCMP_ARCH_* name of the OCI runtime spec.
func ociName(a seccomp.Arch) string {
	switch a {
	case seccomp.ArchX86_64:
		return "SCMP_ARCH_X86_64"
	case seccomp.ArchAArch64:
		return "SCMP_ARCH_AARCH64"
	}
	return ""
}

// archesIn is p.RuleArches(r) limited to arches (the ones an export covers).
func archesIn(p *seccomp.Profile, r *seccomp.Rule, arches []seccomp.Arch) []seccomp.Arch {
	var in []seccomp.Arch
	for _, a := range p.RuleArches(r) {
		if slices.Contains(arches, a) {
			in = append(in, a)
		}
	}
	return in
}

// OCI returns p in Docker's seccomp JSON format, restricted to the given
// architectures (all of the profile's when none are given).
func OCI(p *seccomp.Profile, arches ...seccomp.Arch) (*OCIProfile, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("invalid seccomp profile: %w", err)
	}
	if len(arches) == 0 {
		arches = p.Arches
	}
	for _, a := range arches {
		if !slices.Contains(p.Arches, a) {
			return nil, fmt.Errorf("seccomp profile does not support architecture %s (it covers %v)", a, p.Arches)
		}
	}
	act, errno := ociAction(p.Default)
	out := &OCIProfile{
		Comment:         "sandboxd seccomp profile, generated from seccomp/rules.go by `make seccomp`; do not edit",
		DefaultAction:   act,
		DefaultErrnoRet: errno,
		Syscalls:        []OCISyscall{},
	}
	for _, a := range arches {
		// No subArchitectures: compat ABIs (x86, x32, arm) are never added.
		out.ArchMap = append(out.ArchMap, OCIArchMap{Architecture: ociName(a), SubArchitectures: []string{}})
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		ra := archesIn(p, r, arches)
		if len(ra) == 0 {
			continue
		}
		s := OCISyscall{Names: append([]string(nil), r.Names...), Comment: r.Group + ": " + r.Reason}
		if r.Ref != "" {
			s.Comment += " (" + r.Ref + ")"
		}
		s.Action, s.ErrnoRet = ociAction(r.Action)
		for _, c := range r.Args {
			s.Args = append(s.Args, ociArg(c))
		}
		if len(ra) < len(arches) {
			s.Includes = &OCIMatch{}
			for _, a := range ra {
				s.Includes.Arches = append(s.Includes.Arches, a.GOARCH())
			}
		}
		out.Syscalls = append(out.Syscalls, s)
	}
	return out, nil
}

// JSON is OCI(p, arches...) rendered with two-space indentation and a final
// newline: profile.json.
func JSON(p *seccomp.Profile, arches ...seccomp.Arch) ([]byte, error) {
	o, err := OCI(p, arches...)
	if err != nil {
		return nil, err
	}
	return render(o)
}

// TemplateJSON is JSON of the template profile over p (seccomp.TemplateOf,
// the filter of a template's process): template.json. `sandboxd seccomp
// diff profile.json template.json` lists exactly what it adds.
func TemplateJSON(p *seccomp.Profile, arches ...seccomp.Arch) ([]byte, error) {
	o, err := OCI(seccomp.TemplateOf(p), arches...)
	if err != nil {
		return nil, err
	}
	o.Comment = "sandboxd template seccomp profile (a template's process: the execution profile plus SECCOMP.md's \"Template profile\" rules), " +
		"generated from seccomp/rules.go by `make seccomp`; do not edit"
	return render(o)
}

func render(o *OCIProfile) ([]byte, error) {
	b, err := json.MarshalIndent(o, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
