package server

// The warm pool's trust boundary: what the code handed to a warm sandbox can
// reach, and what the worker believes about it. A warm run must be as safe
// and as exact as a cold one.

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

func cleanupWarm(t *testing.T, res *nsjail.Result, ws string) {
	t.Helper()
	if res.Workspace != "" && res.Workspace != ws {
		if err := removeWorkspace(res.Workspace); err != nil {
			t.Error(err)
		}
	}
}

// startupEnvScript prints what Python makes of the variables it reads only at
// start-up (hash seed, stdio encoding, warning filters, locale and UTF-8 mode)
// and of TZ, without printing the variables themselves.
const startupEnvScript = `import locale, os, sys, time, warnings
print(hash("abc") if "PYTHONHASHSEED" in os.environ else "random hash")
print(sys.stdout.encoding, sys.stdout.errors, sys.flags.utf8_mode, sys.getfilesystemencoding(), sys.warnoptions)
print(locale.setlocale(locale.LC_CTYPE), locale.getpreferredencoding(False), os.environ.get("LC_CTYPE"))
print(time.tzname, time.timezone, time.localtime(0).tm_hour)
print("caf\u00e9 \u4e2d")
warnings.warn("a user warning")
print("after the warning")
`

// startupEnvValues has a telling value for every variable the default
// allowed_env admits.
var startupEnvValues = map[string]string{
	"LANG":             "C",
	"LC_ALL":           "C",
	"TZ":               "XYZ-3",
	"PYTHONHASHSEED":   "1",
	"PYTHONWARNINGS":   "error::UserWarning",
	"PYTHONIOENCODING": "latin-1:backslashreplace",
}

// Every variable a request may set gives the same answer warm and cold. Most
// are read by Python only at start-up, which a warm sandbox is long past: such
// a request runs cold, counted as sandboxd_pool_fallback_total{reason="env"}.
func TestWarmHonoursStartupEnv(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	tpl.Env = append(tpl.Env, "LANG=C.UTF-8") // as Policy.BaseEnv
	pool, err := NewPool(r, PoolConfig{Size: 1, WorkRoot: t.TempDir(), Preload: []string{"numpy"}}, []Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	run := func(sb interface {
		Run(context.Context, nsjail.Spec) (*nsjail.Result, error)
	}, extra map[string]string) *nsjail.Result {
		t.Helper()
		ws := poolWorkspace(t, r, startupEnvScript)
		res, err := sb.Run(context.Background(), nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: withEnv(tpl.Env, extra), Cwd: nsjail.WorkspaceDir, Workspace: ws, Limits: tpl.Limits})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cleanupWarm(t, res, ws) })
		return res
	}
	baseline := run(r, nil)
	waitReady(t, pool, 1)
	if warm := run(pool, nil); pool.Stats().Taken != 1 {
		t.Fatal("a request without variables was not served warm")
	} else {
		compareResults(t, baseline, warm)
	}
	for _, name := range DefaultConfig().AllowedEnv {
		t.Run(name, func(t *testing.T) {
			value, ok := startupEnvValues[name]
			if !ok {
				t.Fatalf("allowed variable %s has no test value", name)
			}
			extra := map[string]string{name: value}
			cold := run(r, extra)
			if bytes.Equal(cold.Stdout, baseline.Stdout) && bytes.Equal(cold.Stderr, baseline.Stderr) {
				t.Fatalf("%s=%s changes nothing the script prints: the test proves nothing", name, value)
			}
			waitReady(t, pool, 1)
			before := pool.Stats()
			warm := run(pool, extra)
			compareResults(t, cold, warm)
			after := pool.Stats()
			if after.Taken != before.Taken || after.FallbackEnv != before.FallbackEnv+1 {
				t.Errorf("%s: taken %d→%d, env fallbacks %d→%d; want a counted cold run", name,
					before.Taken, after.Taken, before.FallbackEnv, after.FallbackEnv)
			}
		})
	}
}

// withEnv is env with extra's variables set (replaced or appended), as
// Policy.Env builds a request's environment.
func withEnv(env []string, extra map[string]string) []string {
	var out []string
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); extra[k] == "" {
			out = append(out, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		out = append(out, k+"="+extra[k])
	}
	return out
}
