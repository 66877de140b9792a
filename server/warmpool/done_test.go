package warmpool_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/runner"
	"github.com/sandboxd/sandboxd/server/warmpool"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// The runner's done word (runner.Job.Done, nsjail.Spec.Done; SECURITY.md
// case 72) on each path a single-shot execution takes: a zygote's code
// process, a template fork's G, and a cold run answer on it
// (Result.Ended set), with the code's exit code and output; code that
// closed the events fd gives no word, and its exit decides.
func TestDoneWordOnEveryPath(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	for _, forks := range []bool{false, true} {
		t.Run(map[bool]string{false: "zygote", true: "fork"}[forks], func(t *testing.T) {
			r := newPoolRunner(t)
			tpl := poolTemplate(rootfs)
			cfg := poolConfig(t, 1, t.TempDir(), 0)
			cfg.Preload = []string{"numpy"}
			cfg.Forks = forks
			pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			for _, tc := range []struct {
				name, code, stdout string
				exit               int
				word               bool
			}{
				{"exit code", "import sys\nprint('x')\nsys.exit(3)", "x\n", 3, true},
				{"events fd closed", "import os\nos.close(3)\nprint('y')", "y\n", 0, false},
			} {
				for _, warm := range []bool{true, false} {
					if warm {
						waitReady(t, pool, 1)
					}
					evR, evW, err := runner.Pipe()
					if err != nil {
						t.Fatal(err)
					}
					rd := runner.NewReader(evR, runner.Want{Done: true}, nil)
					job := runner.Job{Path: inside.Workspace + "/code/main.py", Cwd: inside.Workspace, EventsFD: runner.EventsFD, Done: true}
					spec := nsjail.Spec{Rootfs: rootfs, Args: runner.Args("python3", job), Env: tpl.Env, Cwd: inside.Workspace,
						Limits: tpl.Limits, ExtraFiles: []*os.File{evW}, Done: rd.Done()}
					spec.Limits.Timeout = 20 * time.Second
					taken := pool.Stats().Taken + pool.Stats().ExecForks
					var res *nsjail.Result
					if warm {
						var out string
						if res, out, err = runPooled(context.Background(), pool, r, spec, tc.code); err == nil {
							defer workspace.Remove(out)
						}
					} else {
						spec.Workspace = poolWorkspace(t, r, tc.code)
						res, err = r.Run(context.Background(), spec)
					}
					evW.Close()
					rd.Stop()
					if err != nil {
						t.Fatal(err)
					}
					if warm && pool.Stats().Taken+pool.Stats().ExecForks != taken+1 {
						t.Fatalf("%s: the pool did not serve it: %+v", tc.name, pool.Stats())
					}
					if res.ExitCode != tc.exit || string(res.Stdout) != tc.stdout || (res.Ended != nil) != tc.word {
						t.Fatalf("%s (warm %v): exit %d stdout %q stderr %.300q answered on the word %v, want exit %d stdout %q word %v",
							tc.name, warm, res.ExitCode, res.Stdout, res.Stderr, res.Ended != nil, tc.exit, tc.stdout, tc.word)
					}
				}
			}
		})
	}
}
