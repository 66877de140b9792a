package warmpool

import (
	"cmp"
	"maps"
	"strings"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/runner"
)

// Template describes the sandboxes of one policy: a request whose Spec has
// the same rootfs, limits (timeout aside) and base environment can be served
// by one of them. The server builds it from the policy with the same
// functions it builds a request's Spec with (server.Policy.Template).
type Template struct {
	Name   string
	Rootfs string
	Env    []string
	Limits nsjail.Limits
	// Size is the number of ready sandboxes kept of this template; 0:
	// Config.Size. (The server keeps a policy's own runtime at pool_size
	// and another runtime at its runtime_pool_size.)
	Size int
}

// Matches reports whether a warm sandbox of t can run spec: shape when spec
// runs the runner's job (runner.Args, with at most its events fd as
// ExtraFiles) or `python[3] FILE` in a workspace, without stdin or a
// hostname, in t's rootfs with t's limits (the timeout aside); env when, besides, its
// environment is exactly t's. Python reads most variables a request may set
// (PYTHONHASHSEED, PYTHONIOENCODING, PYTHONWARNINGS, the locale, TZ) only at
// start-up, and a preload may read any at import, long before a hand-off: a
// request that sets one has the shape but runs cold, counted.
func (t Template) Matches(spec *nsjail.Spec) (shape, env bool) {
	if spec.Workspace == "" {
		return false, false
	}
	return t.matches(spec)
}

// matches is Matches for a spec whose workspace is the warm sandbox's own
// (Pool.Claim: spec.Workspace is not looked at).
func (t Template) matches(spec *nsjail.Spec) (shape, env bool) {
	if _, ok := handoffOf(spec); !ok || spec.Stdin != nil {
		return false, false
	}
	if !t.sandboxMatches(spec) {
		return false, false
	}
	return true, maps.Equal(envMap(t.Env), envMap(spec.Env))
}

// MatchesKernel reports whether a warm sandbox of t can become a session's
// kernel for spec (see Pool.StartKernel): as Matches, but spec.Args do not
// matter (a kernel runs no file), and the environment must be exactly t's
// (Python reads it at start-up, long before the hand-off).
func (t Template) MatchesKernel(spec *nsjail.Spec) bool {
	return spec.Workspace != "" && spec.Stdin == nil && t.sandboxMatches(spec) &&
		maps.Equal(envMap(t.Env), envMap(spec.Env))
}

// sandboxMatches: t's rootfs, t's limits (the timeout aside: it is the
// execution's), no hostname of spec's own.
func (t Template) sandboxMatches(spec *nsjail.Spec) bool {
	a, b := t.Limits, spec.Limits
	a.Timeout, b.Timeout = 0, 0
	return t.Rootfs == spec.Rootfs && a == b && spec.Hostname == ""
}

// handoffOf is the hand-off that runs spec's command in a warm sandbox:
// the runner's job (runner.Args), its events fd the only extra file, or a
// plain `python[3] FILE`.
func handoffOf(spec *nsjail.Spec) (Handoff, bool) {
	if j, ok := runner.JobOf(spec.Args); ok {
		events := len(spec.ExtraFiles) == 1 && j.EventsFD == runner.EventsFD
		if !events && (len(spec.ExtraFiles) > 0 || j.EventsFD != 0) {
			return Handoff{}, false
		}
		argv := j.Argv
		if len(argv) == 0 {
			argv = []string{j.Path}
		}
		return Handoff{Path: j.Path, Argv: argv, Cwd: cmp.Or(j.Cwd, "/"), Display: j.Display, Figures: j.Figures, Events: events,
			Done: j.Done && events}, true
	}
	if len(spec.Args) != 2 || (spec.Args[0] != "python3" && spec.Args[0] != "python") || len(spec.ExtraFiles) > 0 {
		return Handoff{}, false
	}
	return Handoff{Path: spec.Args[1], Argv: []string{spec.Args[1]}, Cwd: cmp.Or(spec.Cwd, "/")}, true
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}
