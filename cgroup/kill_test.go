package cgroup

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// cgroupDirs returns the directories a started process should join: all of
// them, as libcontainer's init does.
func cgroupDirs(paths Paths) []string { return uniqueDirs(paths) }

// SECURITY.md case 6: a double-forked, setsid'ed daemon and a SIGTERM-ignoring
// process die with the rest. The direct child is deliberately not reaped
// before KillAll returns: zombies must not keep it waiting.
func TestKillAllTree(t *testing.T) {
	h := realHost(t)
	paths := sandboxCgroup(t, h, "tree")
	cmd := startIn(t, cgroupDirs(paths), `
		(setsid sh -c 'sleep 1000 & sleep 1000' &) 
		sh -c 'trap "" TERM; while :; do sleep 1; done' &
		exec sleep 1000`)
	waitProcs(t, paths, 5)
	if err := KillAll(paths); err != nil {
		t.Fatal(err)
	}
	if pids, err := procs(uniqueDirs(paths)); err != nil || len(pids) != 0 {
		t.Fatalf("after KillAll: %v, %v", pids, err)
	}
	// rmdir works before the zombie child is reaped (measured on 6.18 v1).
	for _, d := range uniqueDirs(paths) {
		if err := removeTree(d); err != nil {
			t.Errorf("rmdir with an unreaped zombie: %v", err)
		}
	}
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Errorf("child: %v, want killed by SIGKILL", err)
	}
}

// SECURITY.md case 1: a fork bomb under a pids limit cannot outrun the loop.
func TestKillAllForkBomb(t *testing.T) {
	h := realHost(t)
	paths := sandboxCgroup(t, h, "forkbomb")
	pidsDir := paths["pids"]
	if h.Mode.V2() {
		pidsDir = paths[""]
	}
	writeT(t, filepath.Join(pidsDir, "pids.max"), "64")
	// Restarted forever: a bomb whose forks all fail at the limit can
	// collapse (every b returns), and the test needs it alive. bash, not
	// dash: dash exits when a fork fails, and the whole bomb could die at
	// the limit before anyone counted it; bash reports and goes on. (The
	// v2 VM has busybox's sh only.)
	bomb := `b() { b & b & wait; }; while :; do b; done`
	startIn(t, cgroupDirs(paths), `command -v bash >/dev/null && exec bash -c '`+bomb+`' 2>/dev/null; `+bomb+` 2>/dev/null`)
	waitProcs(t, paths, 32)
	start := time.Now()
	if err := KillAll(paths); err != nil {
		t.Fatal(err)
	}
	t.Logf("fork bomb at pids.max 64 killed in %v", time.Since(start))
}

// waitProcs waits until paths hold at least n processes.
func waitProcs(t testing.TB, paths Paths, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		pids, err := procs(uniqueDirs(paths))
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d processes, want %d", len(pids), n)
		}
	}
}

// cgroup.kill (Linux 5.14+) is preferred on v2; without it the loop runs.
func TestKillAllV2UsesCgroupKill(t *testing.T) {
	dir := copyTree(t, filepath.Join("..", "testdata", "cgroup", "v2", "sandbox"))
	if err := KillAll(Paths{"": dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err == nil {
		t.Fatal("cgroup.kill created on a kernel that lacks it")
	}
	writeT(t, filepath.Join(dir, "cgroup.kill"), "")
	if err := KillAll(Paths{"": dir}); err != nil {
		t.Fatal(err)
	}
	if got := readT(t, filepath.Join(dir, "cgroup.kill")); got != "1" {
		t.Errorf("cgroup.kill = %q, want 1", got)
	}
	// v1 (and hybrid) never write cgroup.kill, even where the cgroup2 dir has one.
	writeT(t, filepath.Join(dir, "cgroup.kill"), "")
	if err := KillAll(Paths{"": dir, "memory": t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if got := readT(t, filepath.Join(dir, "cgroup.kill")); got != "" {
		t.Errorf("hybrid wrote cgroup.kill: %q", got)
	}
	if err := KillAll(nil); err == nil {
		t.Error("no paths: no error")
	}
}

// KillAll of a sandbox holding 20 processes, until its cgroups are empty.
func BenchmarkKillAll(b *testing.B) {
	h := realHost(b)
	for b.Loop() {
		b.StopTimer()
		paths := sandboxCgroup(b, h, "bench")
		startIn(b, uniqueDirs(paths), `i=0; while [ $i -lt 19 ]; do sleep 1000 & i=$((i+1)); done; exec sleep 1000`)
		waitProcs(b, paths, 20)
		b.StartTimer()
		if err := KillAll(paths); err != nil {
			b.Fatal(err)
		}
	}
}

// SECURITY.md case 47: a session kernel idles frozen; KillAll still empties
// its cgroup (on v1 a SIGKILL reaches a frozen task only once thawed).
func TestKillAllFrozen(t *testing.T) {
	h := realHost(t)
	paths := sandboxCgroup(t, h, "frozen")
	startIn(t, cgroupDirs(paths), `sleep 1000 & exec sleep 1000`)
	waitProcs(t, paths, 2)
	if d, ok := paths.V2(); ok {
		writeT(t, filepath.Join(d, "cgroup.freeze"), "1")
	} else {
		d, ok := paths["freezer"]
		if !ok {
			t.Skip("no freezer hierarchy")
		}
		writeT(t, filepath.Join(d, "freezer.state"), "FROZEN")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if state := readT(t, filepath.Join(d, "freezer.state")); state == "FROZEN\n" {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("freezer.state %q", state)
			}
		}
	}
	if err := KillAll(paths); err != nil {
		t.Fatal(err)
	}
	if pids, err := procs(uniqueDirs(paths)); err != nil || len(pids) != 0 {
		t.Fatalf("after KillAll: %v, %v", pids, err)
	}
}

// Freeze freezes a cgroup's tasks (they stop running) and Thaw lets them
// run again (SECURITY.md case 47).
func TestFreezeThaw(t *testing.T) {
	h := realHost(t)
	paths := sandboxCgroup(t, h, "freeze")
	dir := t.TempDir()
	startIn(t, cgroupDirs(paths), `i=0; while :; do i=$((i+1)); echo $i > `+dir+`/n; done`)
	waitProcs(t, paths, 1)
	count := func() string { b, _ := os.ReadFile(filepath.Join(dir, "n")); return string(b) }
	for deadline := time.Now().Add(10 * time.Second); count() == ""; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the loop does not run")
		}
	}
	if err := Freeze(paths, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	at := count()
	time.Sleep(100 * time.Millisecond)
	if now := count(); now != at {
		t.Fatalf("the frozen loop counted from %q to %q", at, now)
	}
	if err := Thaw(paths); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); count() == at; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the thawed loop does not run")
		}
	}
}

// SECURITY.md case 72: KillOnce on a frozen cgroup signals every task in
// one round, without waiting; thawed, they all die (a frozen v1 task takes
// the signal as it is thawed), and none ran between the kill and the end.
func TestKillOnceFrozen(t *testing.T) {
	h := realHost(t)
	paths := sandboxCgroup(t, h, "killonce")
	cmd := startIn(t, cgroupDirs(paths), `(setsid sh -c 'sleep 1000 & sleep 1000' &)
		sh -c 'trap "" TERM; while :; do :; done' &
		exec sleep 1000`)
	// Four at least: sh, the busy loop, and the setsid'ed sh and sleeps
	// (busybox's sh -c execs its last command, dash's does not).
	waitProcs(t, paths, 4)
	if err := Freeze(paths, 10*time.Second); err != nil {
		t.Skipf("no freezer: %v", err)
	}
	if err := KillOnce(paths); err != nil {
		t.Fatal(err)
	}
	if err := Thaw(paths); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		pids, err := procs(uniqueDirs(paths))
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still there 10 s after KillOnce and the thaw: %v", pids)
		}
	}
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Errorf("child: %v, want killed by SIGKILL", err)
	}
}
