//go:build cgo && seccomp

package audit

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"github.com/sandboxd/sandboxd/seccomp"
)

// Markdown renders SECCOMP.md from p: the policy stated up front, then one
// row per syscall and rule, then the documented denials with their effect
// per architecture (all of p's architectures when none are given).
func Markdown(p *seccomp.Profile, arches ...seccomp.Arch) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("invalid seccomp profile: %w", err)
	}
	if len(arches) == 0 {
		arches = p.Arches
	}
	above := map[seccomp.Arch]int{}
	for _, a := range arches {
		n, err := p.ENOSYSAbove(a)
		if err != nil {
			return nil, err
		}
		above[a] = n
	}
	nums := map[seccomp.Arch]map[string]int{}
	for _, a := range arches {
		nums[a] = numbered(p, a)
	}
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# sandboxd seccomp profile\n\n")
	w("Generated from `seccomp/rules.go` by `make seccomp` (libseccomp %s); do not edit by hand.\n", seccomp.LibseccompVersion())
	w("`make seccomp-check` fails when this file, `profile.json`, `template.json` or `pfc/*.pfc` differ from the source.\n")
	w("See [README.md](README.md) for how to review, change and verify the profile.\n\n")
	w("- **Default action:** %s: every syscall that no rule below allows fails with `%s` without running.\n", p.Default, errnoName(p.Default.Errno))
	var an []string
	for _, a := range arches {
		an = append(an, fmt.Sprintf("%s (ENOSYS above %d)", a, above[a]))
	}
	w("- **Architectures:** %s. Native 64-bit ABIs only: the filter loaded on a host lists only that host's architecture.\n", strings.Join(an, ", "))
	w("- **Foreign ABIs:** i386 system calls (`int 0x80` on x86_64) and x32 calls (numbers with bit 30 set) hit libseccomp's bad-architecture action and the calling thread is killed with SIGSYS.\n")
	w("- **Unknown and newer syscalls:** runc's patchbpf stub returns `ENOSYS` for every syscall number above the highest one the profile names on that architecture, so a libc that meets a newer syscall falls back to an older one; known syscalls at or below it that no rule allows get `%s`.\n", errnoName(p.Default.Errno))
	w("- **Kill:** rules with action `kill` use SECCOMP_RET_KILL_PROCESS (the whole process dies with SIGSYS).\n")
	w("- **Conditions:** a rule's conditions are ANDed; several rules for one syscall are ORed. Flag arguments are always tested with a masked compare.\n\n")

	w("## Rules compiled into the filter\n\n")
	b.WriteString(rulesTable(p, 0, arches, nums))

	w("\n## Denied: not in the allowlist\n\n")
	w("These are absent from the rules above, so the default action (or the ENOSYS stub) refuses them; they are listed for review and are each probed on a real kernel by `TestProbeDenied`.\n\n")
	w("| syscall |")
	for _, a := range arches {
		w(" %s |", a)
	}
	w(" group | reason | reference |\n|---|")
	for range arches {
		w("---|")
	}
	w("---|---|---|\n")
	type row struct {
		group, name string
		line        string
	}
	var drows []row
	for _, d := range p.Denied {
		for _, n := range d.Names {
			var line strings.Builder
			fmt.Fprintf(&line, "| `%s` |", n)
			for _, a := range arches {
				fmt.Fprintf(&line, " %s |", deniedErrno(nums[a], above[a], n, p.Default))
			}
			fmt.Fprintf(&line, " %s | %s | %s |\n", d.Group, cell(d.Reason), ref(d.Ref))
			drows = append(drows, row{d.Group, n, line.String()})
		}
	}
	sort.SliceStable(drows, func(i, j int) bool {
		if drows[i].group != drows[j].group {
			return drows[i].group < drows[j].group
		}
		return drows[i].name < drows[j].name
	})
	for _, r := range drows {
		b.WriteString(r.line)
	}
	if err := templateSection(&b, p, arches); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// templateSection renders the template profile over p
// (seccomp.TemplateOf): what it adds to p, from the same data.
func templateSection(b *bytes.Buffer, p *seccomp.Profile, arches []seccomp.Arch) error {
	tpl := seccomp.TemplateOf(p)
	if err := tpl.Validate(); err != nil {
		return fmt.Errorf("invalid template seccomp profile: %w", err)
	}
	nums := map[seccomp.Arch]map[string]int{}
	var an []string
	for _, a := range arches {
		nums[a] = numbered(tpl, a)
		n, err := tpl.ENOSYSAbove(a)
		if err != nil {
			return err
		}
		an = append(an, fmt.Sprintf("%s above %d", a, n))
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Template profile: what it adds\n\n")
	w("The process of a template sandbox, T (`nsjail.Runner.StartTemplate` running `server/warmpool/template.py`; issue 17, ")
	w("`server/warmpool/TEMPLATE.md` section 6), and each fork G it clones run under the **template profile**: every rule above ")
	w("plus the rules below, which are what T and G do for a fork before G loads the execution filter and the execution profile refuses ")
	w("(`seccomp.TemplateOf`). Everything else is the execution profile's: the default action, the architectures, the ENOSYS ")
	w("threshold (%s), and the denials above, which keep every call of the syscalls below that their conditions do not match.\n\n", strings.Join(an, ", "))
	w("A fork G holds both filters (`Seccomp_filters: 2` in `/proc/self/status`, where a cold sandbox's process has 1). ")
	w("The kernel runs both and takes the answer of higher precedence (kill > trap > errno > allow), on a tie the execution ")
	w("filter's (loaded last): the template profile only adds allow rules, so a fork's effective policy is exactly the execution ")
	w("profile's. `TestTemplateStacksToTheExecutionProfile` checks that on the compiled filters of both architectures ")
	w("(SECURITY.md case 63). The compiled template filter: `template.json`, `pfc/template-<arch>.pfc`.\n\n")
	w("One rule of the execution profile is replaced rather than added to: `clone3`'s ENOSYS, by the allow below (T's ")
	w("clone3 of each G into a new user and pid namespace, on cgroup v2 into the shell's cgroup; the execution filter G loads answers ENOSYS again).\n\n")
	b.WriteString(rulesTable(tpl, len(tpl.Rules)-len(seccomp.TemplateAdditions(p)), arches, nums))
	return nil
}

// rulesTable is the Markdown table of p.Rules[from:] on arches, sorted by
// group, then syscall, then rule order.
func rulesTable(p *seccomp.Profile, from int, arches []seccomp.Arch, nums map[seccomp.Arch]map[string]int) string {
	type row struct {
		group, name string
		idx         int
		line        string
	}
	var rows []row
	for i := from; i < len(p.Rules); i++ {
		r := &p.Rules[i]
		ra := archesIn(p, r, arches)
		if len(ra) == 0 {
			continue
		}
		var conds []string
		for _, c := range r.Args {
			conds = append(conds, "`"+c.String()+"`")
		}
		cond := "—"
		if len(conds) > 0 {
			cond = strings.Join(conds, " and ")
		}
		for _, n := range r.Names {
			rows = append(rows, row{r.Group, n, i, fmt.Sprintf("| `%s` | %s | %s | %s | %s | %s | %s | %s |\n",
				n, numbers(nums, arches, n), archList(ra, ", "), r.Action, cond, r.Group, cell(r.Reason), ref(r.Ref))})
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].group != rows[j].group {
			return rows[i].group < rows[j].group
		}
		if rows[i].name != rows[j].name {
			return rows[i].name < rows[j].name
		}
		return rows[i].idx < rows[j].idx
	})
	var b strings.Builder
	fmt.Fprintf(&b, "| syscall | number (%s) | architectures | action | argument conditions | group | reason | reference |\n", archList(arches, "/"))
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r.line)
	}
	return b.String()
}

// deniedErrno is the documented outcome of a syscall no rule allows: the
// default errno, ENOSYS above the stub's threshold, or "—" when the
// syscall does not exist on the architecture.
func deniedErrno(nums map[string]int, above int, name string, def seccomp.Action) string {
	nr, ok := nums[name]
	switch {
	case !ok:
		return "—"
	case nr > above:
		return "ENOSYS"
	case def.Kind == seccomp.Errno:
		return errnoName(def.Errno)
	}
	return def.String()
}

func numbers(nums map[seccomp.Arch]map[string]int, arches []seccomp.Arch, name string) string {
	var s []string
	for _, a := range arches {
		if n, ok := nums[a][name]; ok {
			s = append(s, fmt.Sprint(n))
		} else {
			s = append(s, "—")
		}
	}
	return strings.Join(s, " / ")
}

func archList(as []seccomp.Arch, sep string) string {
	var s []string
	for _, a := range as {
		s = append(s, string(a))
	}
	return strings.Join(s, sep)
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func ref(r string) string {
	switch {
	case r == "":
		return ""
	case strings.HasPrefix(r, "CVE-"):
		return fmt.Sprintf("[%s](https://www.cve.org/CVERecord?id=%s)", r, r)
	case strings.HasPrefix(r, "http"):
		return "<" + r + ">"
	}
	return r
}

// numbered returns name→number on a for every name p mentions (rules and
// denials), skipping names that do not exist there.
func numbered(p *seccomp.Profile, a seccomp.Arch) map[string]int {
	m := map[string]int{}
	add := func(n string) {
		if nr, ok := seccomp.SyscallNumber(n, a); ok {
			m[n] = nr
		}
	}
	for _, r := range p.Rules {
		for _, n := range r.Names {
			add(n)
		}
	}
	for _, d := range p.Denied {
		for _, n := range d.Names {
			add(n)
		}
	}
	return m
}
