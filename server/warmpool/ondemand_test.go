package warmpool_test

import (
	"context"
	"fmt"
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
// Through Pool.Claim, the server's path: the code given, its workspace
// written only once a sandbox is claimed, or made for a cold run.
func TestExecutionForkedOnDemand(t *testing.T) {
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
	run := func(ctx context.Context, code string, timeout time.Duration) (*nsjail.Result, error) {
		lim := tpl.Limits
		if timeout > 0 {
			lim.Timeout = timeout
		}
		spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/" + inside.CodeFile},
			Env: tpl.Env, Cwd: inside.Workspace, Limits: lim}
		res, out, err := runPooled(ctx, pool, r, spec, code)
		if err != nil {
			return &nsjail.Result{}, err // the callers print its output
		}
		workspace.Remove(out)
		if res.Status != nsjail.StatusSucceeded {
			return res, fmt.Errorf("status %s, stderr %s", res.Status, res.Stderr)
		}
		return res, nil
	}
	// The pool's one ready fork is taken by an execution that sleeps until
	// the test cancels it: the refill is woken only when it ends, or by the
	// pool's ticker (every 30 s): a take it makes possible is tolerated
	// below, where it can only make one, and each take's end another.
	waitReady(t, pool, 1)
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := run(ctx, "import time\ntime.sleep(600)", 10*time.Minute)
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
	res, err := run(context.Background(), "import pandas as pd\nprint(pd.__name__)", 0)
	if err != nil || string(res.Stdout) != "pandas\n" {
		t.Fatalf("pandas: %v, stdout %q", err, res.Stdout)
	}
	if st := pool.Stats(); st.ExecForks+st.Taken != before.ExecForks+before.Taken+1 || st.FallbackFork != 0 {
		t.Fatalf("an execution that imports pandas was not forked on demand: stats before %+v, after %+v", before, st)
	}

	before = pool.Stats()
	if res, err := run(context.Background(), "print(1)", 0); err != nil || string(res.Stdout) != "1\n" {
		t.Fatalf("print: %v", err)
	}
	if st := pool.Stats(); st.ExecForks != before.ExecForks {
		t.Fatalf("an execution that imports none of the preload was forked: stats before %+v, after %+v", before, st)
	}

	before = pool.Stats()
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			res, err := run(context.Background(), fmt.Sprintf("import numpy as np\nprint(int(np.int64(%d)) * 2)", i), 0)
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
