package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

func init() {
	commands["run"] = command{
		summary: "run one command in one fresh sandbox: run --rootfs DIR [flags] -- CMD [ARG...]",
		run:     cmdRun,
	}
}

func cmdRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rootfs := fs.String("rootfs", "", "host directory used read-only as the sandbox's root (required)")
	workspace := fs.String("workspace", "", "host directory bound read-write at /workspace")
	timeout := fs.Duration("timeout", nsjail.DefaultLimits.Timeout, "wall-clock deadline (Go duration: 1500ms, 2s)")
	memory := fs.String("memory", "", "memory limit: bytes or KiB/MiB/GiB (default 1GiB)")
	pids := fs.Int64("pids", nsjail.DefaultLimits.Pids, "maximum number of tasks")
	cpus := fs.Float64("cpus", nsjail.DefaultLimits.CPUs, "CPU bandwidth in cores")
	asJSON := fs.Bool("json", false, "print exactly one JSON object with the result")
	var env multiFlag
	fs.Var(&env, "env", "KEY=VALUE for the sandbox's environment (repeatable)")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	cmd := fs.Args()
	if len(cmd) == 0 {
		return usagef("no command given (usage: sandboxd run --rootfs DIR [flags] -- CMD [ARG...])")
	}
	if *rootfs == "" {
		return usagef("--rootfs is required")
	}
	lim := nsjail.Limits{Timeout: *timeout, Pids: *pids, CPUs: *cpus}
	if *timeout <= 0 {
		return usagef("--timeout must be > 0, got: %s", *timeout)
	}
	if *memory != "" {
		n, err := ParseSize(*memory)
		if err != nil {
			return usagef("--memory: %v", err)
		}
		lim.MemoryBytes = n
	}
	if *pids <= 0 {
		return usagef("--pids must be > 0, got: %d", *pids)
	}
	if *cpus <= 0 {
		return usagef("--cpus must be > 0, got: %g", *cpus)
	}
	abs := func(p string) string {
		if p == "" {
			return ""
		}
		a, err := filepath.Abs(p)
		if err != nil {
			return p
		}
		return a
	}
	spec := nsjail.Spec{
		Rootfs:    abs(*rootfs),
		Workspace: abs(*workspace),
		Args:      cmd,
		Env:       append([]string{"HOME=/tmp"}, env...),
		Limits:    lim,
	}
	if spec.Workspace != "" {
		spec.Cwd = inside.Workspace
	}
	if err := spec.Validate(); err != nil {
		return usagef("%v", err)
	}
	// One command's own events are its result; only problems are logged.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// A state root and cgroup parent of its own: a `sandboxd serve` on the
	// same host sweeps everything under its own as orphans on start.
	r, err := nsjail.NewRunner(nsjail.Options{StateRoot: runStateRoot, CgroupParent: runCgroupParent, Logger: log})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := r.Run(ctx, spec)
	if err != nil {
		return usagef("%v", err)
	}
	// The sandbox is removed in the background once the result is known;
	// let that finish before the process exits.
	defer r.WaitForCleanup()
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(struct {
			*nsjail.Result
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		}{res, strings.ToValidUTF8(string(res.Stdout), "\uFFFD"), strings.ToValidUTF8(string(res.Stderr), "\uFFFD")})
	}
	os.Stdout.Write(res.Stdout)
	os.Stderr.Write(res.Stderr)
	fmt.Fprintf(os.Stderr, "sandboxd: %s exit_code=%d", res.Status, res.ExitCode)
	if res.Signal != "" {
		fmt.Fprintf(os.Stderr, " signal=%s", res.Signal)
	}
	if len(res.LimitsHit) > 0 {
		fmt.Fprintf(os.Stderr, " limits_hit=%s", strings.Join(res.LimitsHit, ","))
	}
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintf(os.Stderr, " truncated(stdout=%v,stderr=%v)", res.StdoutTruncated, res.StderrTruncated)
	}
	fmt.Fprintf(os.Stderr, " wall=%s cpu=%s peak_memory=%d", time.Duration(res.Usage.WallMS)*time.Millisecond,
		time.Duration(res.Usage.CPUMS)*time.Millisecond, res.Usage.PeakMemoryBytes)
	if res.Error != "" {
		fmt.Fprintf(os.Stderr, " error=%q", res.Error)
	}
	fmt.Fprintln(os.Stderr)
	return nil
}

const (
	runStateRoot    = "/run/sandboxd/run"
	runCgroupParent = "sandboxd-run"
)

type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error {
	if !strings.Contains(v, "=") || strings.HasPrefix(v, "=") {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*m = append(*m, v)
	return nil
}
