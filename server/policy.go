package server

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Execution types: each names a Policy.
const (
	TypeDynamic = "dynamic"
	TypeSkill   = "skill"
)

// Policy is what one execution type may use. TimeoutMS is both the default
// and the maximum a request may ask for.
type Policy struct {
	Name      string  `json:"-"`
	TimeoutMS int64   `json:"timeout_ms"`
	MemoryMB  int64   `json:"memory_mb"`
	CPUs      float64 `json:"cpus"`
	Pids      int64   `json:"pids"`
	// Runtime is the runtime the policy's executions and sessions run on
	// when they name none (dynamic_runtime, skill_runtime). Not part of
	// the policy an answer or a session embeds, whose runtime may be
	// another (the request's): its top-level runtime says which; GET
	// /v1/policies shows it (policyView).
	Runtime string `json:"-"`
}

// policyView is a policy as GET /v1/policies shows it: its limits and the
// runtime it runs on by default.
type policyView struct {
	Policy
	Runtime string `json:"runtime"`
}

// Policies maps an execution type to its policy.
type Policies map[string]Policy

// PoliciesFromConfig builds the dynamic and skill policies.
func PoliciesFromConfig(c config.Config) Policies {
	return Policies{
		TypeDynamic: {Name: TypeDynamic, TimeoutMS: c.DynamicTimeoutMS, MemoryMB: c.DynamicMemoryMB, CPUs: c.DynamicCPUs, Pids: c.PidsLimit, Runtime: c.DynamicRuntime},
		TypeSkill:   {Name: TypeSkill, TimeoutMS: c.SkillTimeoutMS, MemoryMB: c.SkillMemoryMB, CPUs: c.SkillCPUs, Pids: c.PidsLimit, Runtime: c.SkillRuntime},
	}
}

// Names returns the policy names, sorted.
func (p Policies) Names() []string {
	out := make([]string, 0, len(p))
	for n := range p {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Apply returns the policy for typ with the request's timeout applied. A
// timeout above the policy's maximum is an error, not silently capped: the
// caller asked for something it will not get (SECURITY.md case 20).
func (p Policies) Apply(typ string, timeoutMS int64) (Policy, error) {
	if typ == "" {
		typ = TypeDynamic
	}
	pol, ok := p[typ]
	if !ok {
		return Policy{}, fmt.Errorf("unknown type %q: want one of %v", clip(typ), p.Names())
	}
	switch {
	case timeoutMS < 0:
		return Policy{}, fmt.Errorf("timeout_ms must be > 0, got: %d", timeoutMS)
	case timeoutMS > pol.TimeoutMS:
		return Policy{}, fmt.Errorf("timeout_ms must be <= %d for type %q, got: %d", pol.TimeoutMS, typ, timeoutMS)
	case timeoutMS > 0:
		pol.TimeoutMS = timeoutMS
	}
	return pol, nil
}

// Limits converts the policy to sandbox limits. It is the only mapping from
// a policy to nsjail.Limits: the warm pool's templates and the requests are
// both built with it, so a request matches its template exactly (timeout
// aside).
func (p Policy) Limits(c config.Config) nsjail.Limits {
	return nsjail.Limits{
		Timeout:     time.Duration(p.TimeoutMS) * time.Millisecond,
		MemoryBytes: p.MemoryMB << 20,
		Pids:        p.Pids,
		CPUs:        p.CPUs,
		StdoutBytes: c.MaxStdoutBytes,
		StderrBytes: c.MaxStderrBytes,
	}
}

// BaseEnv is the environment every run of the policy gets (its names, LANG
// aside, are config.ReservedEnv: a request cannot override them): fixed values and
// thread counts from the CPU limit (BLAS would otherwise start one thread per
// host CPU and hit the pids limit). Nothing of the worker's own environment
// is passed in (SECURITY.md case 13). The warm pool's templates use exactly
// this, so it must not depend on the request.
func (p Policy) BaseEnv() []string {
	threads := strconv.Itoa(max(1, int(math.Ceil(p.CPUs))))
	return []string{
		"PATH=" + inside.DefaultPath,
		"HOME=/tmp",
		"MPLCONFIGDIR=/tmp/matplotlib",
		"MPLBACKEND=Agg",
		"PYTHONDONTWRITEBYTECODE=1",
		"PYTHONUNBUFFERED=1",
		"OMP_NUM_THREADS=" + threads,
		"OPENBLAS_NUM_THREADS=" + threads,
		"MKL_NUM_THREADS=" + threads,
		"LANG=C.UTF-8",
	}
}

// Env is the complete environment of one run: BaseEnv, then the request's
// allowlisted extras in name order (an extra named like a base variable,
// only LANG can be, replaces it; such a run cannot be served warm).
func (p Policy) Env(extra map[string]string) []string {
	var env []string
	for _, kv := range p.BaseEnv() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := extra[k]; !ok {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// Template is the warm-pool template of the policy on rootfs: the same
// BaseEnv and Limits a request of this policy gets.
func (p Policy) Template(c config.Config, rootfs string) warmpool.Template {
	return warmpool.Template{Name: p.Name, Rootfs: rootfs, Env: p.BaseEnv(), Limits: p.Limits(c)}
}
