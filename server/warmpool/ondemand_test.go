package warmpool_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/warmpool"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// TestExecutionForkedOnDemand: with template forks, an execution that finds
// its pool empty and imports part of the preload runs in a fork made for
// it (counted in ExecForks, not in Taken, never cold); one that imports
// none of it runs cold, as it always did; three at once are each a fork
// (made side by side past the template's part of each: fork.go makeFork),
// and each gets its own answer.
//
// Through Pool.Run (the request's workspace written first) and through
// Pool.Claim (the server's path: the code given, its workspace written
// only once a sandbox is claimed, or made for a cold run).
func TestExecutionForkedOnDemand(t *testing.T) {
	t.Run("Run", func(t *testing.T) { testExecutionForkedOnDemand(t, false) })
	t.Run("Claim", func(t *testing.T) { testExecutionForkedOnDemand(t, true) })
}

func testExecutionForkedOnDemand(t *testing.T, claim bool) {
	requireTemplates(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	cfg := poolConfig(t, 1, t.TempDir(), 0)
	cfg.Forks = true
	cfg.ExecForkWait = time.Minute // the test's own bound: never cold for a busy lock
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// A job is a workspace for Pool.Run, made on the test's goroutine
	// (poolWorkspace fails the test with t.Fatal), or the code for a
	// Claim.
	type job struct{ ws, code string }
	prepare := func(code string) job {
		if claim {
			return job{code: code}
		}
		return job{ws: poolWorkspace(t, r, code)}
	}
	base := t.TempDir()
	o := workspace.Options{UID: r.HostUID(), GID: r.HostGID()}
	run := func(ctx context.Context, j job, timeout time.Duration) (*nsjail.Result, error) {
		lim := tpl.Limits
		if timeout > 0 {
			lim.Timeout = timeout
		}
		spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/" + inside.CodeFile},
			Env: tpl.Env, Cwd: inside.Workspace, Workspace: j.ws, Limits: lim}
		var res *nsjail.Result
		var err error
		if claim {
			delivered := false
			if c := pool.Claim(ctx, spec, j.code); c != nil {
				if err := workspace.Write(c.Workspace(), o, workspace.Request{Code: j.code}); err != nil {
					c.Release()
					return nil, err
				}
				res, delivered, err = c.Run(ctx, spec)
				defer workspace.Remove(c.Workspace())
			}
			if !delivered && err == nil { // cold, as the server runs it
				dir, derr := os.MkdirTemp(base, "cold-")
				if derr == nil {
					derr = workspace.Write(dir, o, workspace.Request{Code: j.code})
				}
				if derr != nil {
					return nil, derr
				}
				spec.Workspace = dir
				res, err = r.Run(ctx, spec)
			}
		} else {
			var out string
			res, out, err = pool.Run(ctx, spec)
			if err == nil && out != j.ws {
				defer workspace.Remove(out)
			}
		}
		if err == nil && res.Status != nsjail.StatusSucceeded {
			err = fmt.Errorf("status %s, stderr %s", res.Status, res.Stderr)
		}
		return res, err
	}
	// The pool's one ready fork is taken by an execution that sleeps until
	// the test cancels it: the refill is woken only when it ends, or by the
	// pool's ticker (every 30 s): a take it makes possible is tolerated
	// below, where it can only make one, and each take's end another.
	waitReady(t, pool, 1)
	heldJob := prepare("import time\ntime.sleep(600)")
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := run(ctx, heldJob, 10*time.Minute)
		held <- err
	}()
	defer func() {
		cancel()
		<-held
	}()
	for pool.Ready() > 0 { // taken (Taken counts it only once it ends)
		time.Sleep(10 * time.Millisecond)
	}

	first := pool.Stats()
	before := first
	res, err := run(context.Background(), prepare("import pandas as pd\nprint(pd.__name__)"), 0)
	if err != nil || string(res.Stdout) != "pandas\n" {
		t.Fatalf("pandas: %v, stdout %q", err, res.Stdout)
	}
	if st := pool.Stats(); st.ExecForks+st.Taken != before.ExecForks+before.Taken+1 || st.FallbackFork != 0 {
		t.Fatalf("an execution that imports pandas was not forked on demand: stats before %+v, after %+v", before, st)
	}

	before = pool.Stats()
	if res, err := run(context.Background(), prepare("print(1)"), 0); err != nil || string(res.Stdout) != "1\n" {
		t.Fatalf("print: %v", err)
	}
	if st := pool.Stats(); st.ExecForks != before.ExecForks {
		t.Fatalf("an execution that imports none of the preload was forked: stats before %+v, after %+v", before, st)
	}

	before = pool.Stats()
	var jobs []job
	for i := range 3 {
		jobs = append(jobs, prepare(fmt.Sprintf("import numpy as np\nprint(int(np.int64(%d)) * 2)", i)))
	}
	errs := make(chan error, 3)
	for i, j := range jobs {
		go func() {
			res, err := run(context.Background(), j, 0)
			if err == nil && string(res.Stdout) != fmt.Sprintf("%d\n", i*2) {
				err = fmt.Errorf("execution %d: stdout %q", i, res.Stdout)
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	st := pool.Stats()
	if st.ExecForks+st.Taken != before.ExecForks+before.Taken+3 || st.FallbackFork != 0 || st.FallbackDead != 0 {
		t.Fatalf("3 executions at once: stats before %+v, after %+v", before, st)
	}
	// At most one take in each of the three steps, and none in the first
	// unless the ticker fired: four executions of the preload, at least
	// two of them forked on demand.
	if st.ExecForks < first.ExecForks+2 {
		t.Fatalf("forked on demand: %d of 4; stats before %+v, after %+v", st.ExecForks-first.ExecForks, first, st)
	}
	select {
	case err := <-held:
		t.Fatalf("the execution holding the pool's sandbox ended early: %v", err)
	default:
	}
}
