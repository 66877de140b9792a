package nsjailtest

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
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
// (strconv.ParseBool, as the worker's config reads it); unset or empty, it
// is def, which the caller takes from the worker's config default
// (server/config: this package cannot import it), so that the suites run
// what the worker runs unless told otherwise. A value that is not a
// boolean fails t.
func TemplateForks(t testing.TB, def bool) bool {
	t.Helper()
	v, ok := os.LookupEnv(TemplateForksEnv)
	if !ok || v == "" {
		return def
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		t.Fatalf("%s=%q: not a boolean (true or false)", TemplateForksEnv, v)
	}
	return on
}

// TestPoolSizeEnv, set to N in the environment of `go test`, gives the
// servers and workers of package server's and cmd/sandboxd's tests a warm
// pool of N per policy when their test does not choose a size
// (PoolSize). It is a test-only knob: most of those suites (isolation,
// sessions, limits, results) are written against cold runs and otherwise
// never reach the pool, forks or not.
const TestPoolSizeEnv = "SANDBOXD_TEST_POOL_SIZE"

// PoolSize is the pool_size of a server or worker on rootfs whose test
// does not choose one: 0, unless TestPoolSizeEnv=N is set and rootfs has a
// usr/bin/python3 (a shell rootfs's shim cannot run a warm sandbox): then
// N, so that those suites also run on warm sandboxes, template forks with
// TemplateForksEnv. An execution takes a warm sandbox only when one is
// ready (a test does not wait for the pool), and tests that count cold
// starts or the pool's takes fail with it either way: compare a run with
// forks to one without.
func PoolSize(t testing.TB, rootfs string) int {
	t.Helper()
	v := os.Getenv(TestPoolSizeEnv)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a size >= 0", TestPoolSizeEnv, v)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "usr/bin/python3")); err != nil {
		return 0
	}
	return n
}
