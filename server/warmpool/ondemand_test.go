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
// (the template's fork lock is held only for its part of each: fork.go
// makeFork) or a take of what the refill made meanwhile, and each gets its
// own answer.
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
	run := func(ctx context.Context, code string) (*nsjail.Result, error) {
		ws := poolWorkspace(t, r, code)
		res, out, err := pool.Run(ctx, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/" + inside.CodeFile},
			Env: tpl.Env, Cwd: inside.Workspace, Workspace: ws, Limits: tpl.Limits})
		if err == nil && out != ws {
			defer workspace.Remove(out)
		}
		if err == nil && res.Status != nsjail.StatusSucceeded {
			err = fmt.Errorf("status %s, stderr %s", res.Status, res.Stderr)
		}
		return res, err
	}
	// The pool's one ready fork is taken by an execution that sleeps until
	// the test cancels it: the refill is woken only when it ends (the
	// pool's ticker may refill all the same: takes are tolerated below,
	// cold runs are not).
	waitReady(t, pool, 1)
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := run(ctx, "import time\ntime.sleep(600)")
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
	before := pool.Stats()
	res, err := run(context.Background(), "import pandas as pd\nprint(pd.__name__)")
	if err != nil || string(res.Stdout) != "pandas\n" {
		t.Fatalf("pandas: %v, stdout %q", err, res.Stdout)
	}
	st := pool.Stats()
	if got := (st.ExecForks - before.ExecForks) + (st.Taken - before.Taken); got != 1 || st.FallbackFork != 0 {
		t.Fatalf("an execution that imports pandas was neither forked nor taken: stats before %+v, after %+v", before, st)
	}
	t.Logf("pandas: forked %d, taken %d", st.ExecForks-before.ExecForks, st.Taken-before.Taken)

	before = pool.Stats()
	if res, err := run(context.Background(), "print(1)"); err != nil || string(res.Stdout) != "1\n" {
		t.Fatalf("print: %v", err)
	}
	if st := pool.Stats(); st.ExecForks != before.ExecForks {
		t.Fatalf("an execution that imports none of the preload was forked: stats before %+v, after %+v", before, st)
	}

	before = pool.Stats()
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			res, err := run(context.Background(), fmt.Sprintf("import numpy as np\nprint(int(np.int64(%d)) * 2)", i))
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
	st = pool.Stats()
	if got := (st.ExecForks - before.ExecForks) + (st.Taken - before.Taken); got != 3 || st.FallbackFork != 0 || st.FallbackDead != 0 {
		t.Fatalf("3 executions at once: stats before %+v, after %+v", before, st)
	}
	if st.ExecForks == first.ExecForks {
		t.Fatalf("no execution was forked on demand: stats before %+v, after %+v", first, st)
	}
	select {
	case err := <-held:
		t.Fatalf("the execution holding the pool's sandbox ended early: %v", err)
	default:
	}
}
