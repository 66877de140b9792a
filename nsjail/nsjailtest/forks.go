package nsjailtest

import (
	"os"
	"strconv"
	"testing"

	"github.com/sandboxd/sandboxd/cgroup"
)

// TemplateForksEnv is the worker's own variable for pool_template_forks
// (server/config: EXECUTION_ + the key). Set in the environment of `go
// test`, it is the one switch that runs the warm pool's suites on template
// forks (server/warmpool/TEMPLATE.md plan step 8): the helpers that build a
// pool or a server config (package server's newEnv, warmpool's poolConfig,
// session's pool starter) read it through TemplateForks, and the workers
// cmd/sandboxd's tests start inherit it with the rest of the environment.
const TemplateForksEnv = "EXECUTION_POOL_TEMPLATE_FORKS"

// TemplateForks reports whether TemplateForksEnv asks for template forks
// (strconv.ParseBool, as the worker's config reads it; unset: false). On
// cgroup v2, where forks are not built yet (plan step 6), it is false and
// says so in t's log; a value that is not a boolean fails t.
func TemplateForks(t testing.TB) bool {
	t.Helper()
	v, ok := os.LookupEnv(TemplateForksEnv)
	if !ok || v == "" {
		return false
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		t.Fatalf("%s=%q: not a boolean (true or false)", TemplateForksEnv, v)
	}
	if on && cgroup.DetectMode().V2() {
		t.Logf("%s ignored: template forks are cgroup v1 only for now", TemplateForksEnv)
		return false
	}
	return on
}
