package main

import (
	"log/slog"
	"os"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/server/supervisor"
)

func init() {
	commands["supervise"] = command{
		summary: "supervise [--] serve [--config FILE]: serve as the child of pid 1 (the worker image); cleans up after a serve killed by a signal",
		run:     cmdSupervise,
	}
}

// cmdSupervise runs `serve ARGS` (this binary) as its child, for pid 1 of
// a container (server/supervisor), and exits with serve's status (128 + a
// signal's number when one killed it). When serve ends without its drain
// it runs serve's start-up sweep on serve's config first (SECURITY.md
// case 60).
func cmdSupervise(args []string) error {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 || args[0] != "serve" {
		return usagef("supervise runs serve: sandboxd supervise [--] serve [--config FILE]")
	}
	// Serve's own checks, before it starts: a bad config is this
	// command's error, and the sweep needs the config.
	cfg, err := serveConfig(args[1:])
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "supervise")
	// The same state root and cgroup parent as serve's. On cgroup v2 this
	// moves the supervisor into its cgroup's leaf (cgroup.PrepareParent)
	// before serve starts there, so that serve finds its cgroup empty of
	// other processes, as it requires.
	runner, err := nsjail.NewRunner(nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: cfg.CgroupParent, Logger: log})
	if err != nil {
		return err
	}
	st, err := supervisor.Run(supervisor.Options{
		Path: "/proc/self/exe",
		Args: append([]string{os.Args[0]}, args...),
		Env:  os.Environ(),
		// What the next serve would do on start: claim (so a live
		// worker's sandboxes are never touched), thaw and kill every
		// sandbox of ours left behind, remove the workspaces.
		Cleanup: func(supervisor.Status) error {
			release, err := server.ClaimAndSweep(runner, cfg.WorkRoot, log)
			if err != nil {
				return err
			}
			release()
			return nil
		},
		Logger: log,
	})
	if err != nil {
		return err
	}
	return exitStatus(st.ExitCode())
}
