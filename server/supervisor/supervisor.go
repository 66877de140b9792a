// Package supervisor runs the worker as the child of a small parent that
// is pid 1 of a container's pid namespace (the worker image's entrypoint,
// `sandboxd supervise serve`), so that a worker killed by a signal cannot
// hang its container.
//
// Why: an idle session kernel is frozen (SECURITY.md case 47), and on
// cgroup v1 a frozen task cannot die, its SIGKILL pending until it is
// thawed. When pid 1 of a pid namespace dies, the kernel kills the rest of
// the namespace and waits for every task to exit; a frozen kernel never
// does, so a worker that is pid 1 and is SIGKILLed (the OOM killer, a
// crash) leaves a container that never stops and cannot be restarted
// (SECURITY.md case 60). Run keeps pid 1 alive while the worker's leftovers
// are thawed and killed (Options.Cleanup), then returns, so that pid 1's
// own exit finds nothing frozen.
//
// A SIGKILL of the supervisor itself cannot be handled: nothing runs in a
// process after its SIGKILL, and the frozen kernels then hang the
// container as before. The kubelet sends one after the pod's grace period,
// but only after a SIGTERM, which serve answers by closing every session
// kernel (thawed and killed) within that period. The OOM killer is kept
// off it: once the child has started (which inherits the container's
// setting), the supervisor sets its own oom_score_adj to -1000, so a
// memory-starved container loses the worker (or a sandbox), never pid 1.
// That needs CAP_SYS_RESOURCE (a privileged container has it); without it
// the supervisor says so and relies on being the smallest process there.
//
// This package imports nothing of the server: what the cleanup is (the
// start-up sweep, server.ClaimAndSweep) is the caller's.
package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// Options say what to run and how to clean up after it. All fields are
// required except Logger.
type Options struct {
	// Path is the program (the worker: /proc/self/exe), Args its argv
	// (Args[0] included), Env its environment. Its stdio is the
	// supervisor's.
	Path string
	Args []string
	Env  []string
	// Cleanup runs once the child has ended other than by a clean exit
	// (status 0, after its drain): killed by a signal, or exited with an
	// error, which may have been before or without its drain. It must be
	// safe to run whatever the child left, and must itself refuse to touch
	// what another live worker owns (server.ClaimAndSweep claims first).
	// Its error is logged; Run's status stays the child's.
	// Run reaps every child that exits while it runs (wait4(-1)), so it
	// must not start and wait for processes of its own.
	Cleanup func(Status) error
	// Logger receives one line per event; nil means slog.Default().
	Logger *slog.Logger
}

// Status is how the child ended: Signal when a signal killed it, else Code.
type Status struct {
	Code   int
	Signal syscall.Signal
}

// Clean reports an exit with status 0.
func (s Status) Clean() bool { return s.Signal == 0 && s.Code == 0 }

// ExitCode is the status the supervisor exits with: the child's exit
// code, or 128 + the signal that killed it (137 for SIGKILL), as a shell
// reports it; the kubelet and systemd read it as the container's.
func (s Status) ExitCode() int {
	if s.Signal != 0 {
		return 128 + int(s.Signal)
	}
	return s.Code
}

func (s Status) String() string {
	if s.Signal != 0 {
		return "killed by " + unix.SignalName(s.Signal)
	}
	return fmt.Sprintf("exit status %d", s.Code)
}

// forwarded are the signals passed on to the child: how a container is
// stopped (SIGTERM) or a terminal's Ctrl-C (SIGINT), both of which serve
// drains on. Others (SIGHUP included, which serve does not use) are not
// caught: as pid 1 of a pid namespace the kernel drops them, as any other
// process they take their default action.
var forwarded = []os.Signal{unix.SIGTERM, unix.SIGINT}

// Run starts the child, passes it the forwarded signals, reaps every
// process that ends up as its child (it is pid 1, or else a child
// subreaper: the child's orphans are reparented to it), and once the
// child has ended runs Cleanup unless the exit was clean. It returns the
// child's status; an error only when the child could not be started.
func Run(opts Options) (Status, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.Path == "" || len(opts.Args) == 0 || opts.Cleanup == nil {
		return Status{}, errors.New("supervisor: Path, Args and Cleanup are required")
	}
	// Orphans of the child (a killed sandbox's init, whose parent was the
	// worker) are reparented to us, to be reaped below, also when we are
	// not pid 1 (tests, or supervise run by hand).
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return Status{}, fmt.Errorf("supervisor: set child subreaper: %w", err)
	}
	// Registered before the start, so that no SIGCHLD and no SIGTERM is
	// lost in between (a SIGTERM then is forwarded once the child runs).
	// Two channels: the signal package drops what a full channel cannot
	// take, and a burst of orphans' SIGCHLDs must never crowd out the
	// kubelet's SIGTERM (its loss would leave the worker undrained until
	// the SIGKILL of pid 1, SECURITY.md case 60). SIGCHLDs coalesce: one
	// pending is enough, as every reap collects all that exited.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	defer signal.Stop(chld)
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	child, err := os.StartProcess(opts.Path, opts.Args, &os.ProcAttr{
		Env:   opts.Env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		return Status{}, fmt.Errorf("supervisor: start %s: %w", opts.Args[0], err)
	}
	log.Info("supervising", "pid", child.Pid, "args", opts.Args[1:])
	// After the start, so the child keeps the container's own score. Best
	// effort: lowering it needs CAP_SYS_RESOURCE (a privileged container's
	// root has it).
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		log.Warn("unable to exempt the supervisor from the OOM killer", "error", err)
	}
	var st Status
	for done := false; !done; {
		// wait4(-1) reaps the child itself too, so never child.Wait:
		// os.Process would lose the race for its status.
		if st, done = reap(child.Pid, log); done {
			break
		}
		select {
		case <-chld:
		case sig := <-sigs:
			log.Info("forwarding signal", "signal", sig.String(), "pid", child.Pid)
			if err := child.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
				log.Warn("unable to forward signal", "signal", sig.String(), "error", err)
			}
		}
	}
	// The pid is reaped: os.Process must not signal or wait for it again.
	child.Release()
	if st.Clean() {
		log.Info("worker exited", "status", st.String())
		return st, nil
	}
	log.Error("worker ended without its drain: cleaning up what it left", "status", st.String())
	// Reap while the cleanup runs, not only after it: what it kills was
	// the child's and is now ours, and a zombie still holds its pid in
	// its own pid namespace and every one above it. A template's init
	// (server/warmpool TEMPLATE.md), killed by the cleanup, does not end
	// before every pid of its namespace is freed, and its forks' shells
	// have pids there whose parent was the worker; reaped only after the
	// cleanup, they kept the template "still running" for as long as the
	// cleanup waited for it, and the sweep failed (CI,
	// TestSuperviseCleansUpAfterServeIsKilled). The sweep loads each
	// container afresh before every try (nsjail Runner.Sweep), so a pid
	// freed here and reused is never signalled.
	cleaned := make(chan error, 1)
	go func() { cleaned <- opts.Cleanup(st) }()
	for done := false; !done; {
		reap(0, log)
		select {
		case <-chld:
		case sig := <-sigs:
			log.Warn("signal during the cleanup: not forwarded (the worker has ended); the cleanup goes on", "signal", sig.String())
		case err := <-cleaned:
			if err != nil {
				log.Error("cleanup after the worker failed", "error", err)
			}
			done = true
		}
	}
	// And whatever ended last, so that nothing is left for the kernel to
	// wait for at our exit.
	reap(0, log)
	return st, nil
}

// reap collects every child that has exited, without blocking, and reports
// whether pid (when not 0) was among them and how it ended.
func reap(pid int, log *slog.Logger) (st Status, found bool) {
	for {
		var ws unix.WaitStatus
		p, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || p <= 0 {
			return st, found // ECHILD: none left; 0: none exited yet
		}
		if p != pid || pid == 0 {
			log.Debug("reaped", "pid", p)
			continue
		}
		found = true
		if ws.Signaled() {
			st = Status{Signal: ws.Signal()}
		} else {
			st = Status{Code: ws.ExitStatus()}
		}
	}
}
