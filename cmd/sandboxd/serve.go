package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/rootfs"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/mcp"
)

func init() {
	commands["serve"] = command{
		summary: "serve [--config FILE]: the execution HTTP API (default 127.0.0.1:3100)",
		run:     cmdServe,
	}
}

// serveConfig parses serve's arguments and loads the config they name,
// with the environment on top, validated: serve's, and supervise's for
// the serve it runs.
func serveConfig(args []string) (config.Config, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", "", "TOML config file (EXECUTION_* variables override it)")
	if err := fs.Parse(args); err != nil {
		return config.Config{}, usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return config.Config{}, usagef("unexpected arguments: %v", fs.Args())
	}
	cfg, _, err := config.Load(*path, os.Environ())
	if err != nil {
		return config.Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("invalid config: %w", err)
	}
	return cfg, nil
}

func cmdServe(args []string) error {
	cfg, err := serveConfig(args)
	if err != nil {
		return err
	}
	// On a terminal the first unpack draws a status line; log records go
	// through the meter so that they never land in the middle of it.
	meter := progress.NewMeter(os.Stderr, progress.IsTerminal(os.Stderr))
	log := slog.New(slog.NewJSONHandler(meter, nil))
	if unknown := config.UnknownEnv(os.Environ()); len(unknown) > 0 {
		log.Warn("ignoring unknown EXECUTION_* variables", "names", unknown)
	}

	runner, err := nsjail.NewRunner(nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: cfg.CgroupParent, Logger: log})
	if err != nil {
		return err
	}
	// The sweep treats every sandbox under the state root and cgroup
	// parent as an orphan: refuse to start beside a live worker using them.
	// A previous worker killed with SIGKILL left sandboxes and workspaces
	// behind (SECURITY.md case 22): clear them before serving.
	release, err := server.ClaimAndSweep(runner, cfg.WorkRoot, log)
	if err != nil {
		return err
	}
	defer release()

	resolve, releaseImage := resolveRootfs(cfg, log, meter)
	defer releaseImage()
	srv, err := server.New(server.Deps{
		Config:        cfg,
		Sandbox:       runner,
		ResolveRootfs: resolve,
		Logger:        log,
		// /mcp: the MCP tools call the API's routes in-process.
		MCP: func(api http.Handler, maxBody int64) http.Handler {
			return mcp.Handler(mcp.InProcess(api), maxBody, log)
		},
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.WorkerHost, strconv.Itoa(cfg.WorkerPort)))
	if err != nil {
		return err
	}
	listeners := []net.Listener{ln}
	if cfg.WorkerSocket != "" {
		// The same API for clients on this host, access by the socket's
		// group and mode; closed (and removed) by Shutdown below.
		uln, err := server.ListenUnix(cfg.WorkerSocket, cfg.WorkerSocketGroup, os.FileMode(cfg.WorkerSocketMode))
		if err != nil {
			ln.Close()
			return err
		}
		defer uln.Close()
		listeners = append(listeners, uln)
	}
	// Timeouts and header limits: SECURITY.md case 32.
	hs := srv.HTTPServer(slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	served := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { served <- hs.Serve(l) }()
		log.Info("serving", "addr", l.Addr().String())
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Prepare unpacks the image (if needed) and fills the warm pool;
	// /readyz turns ready when it succeeds.
	prepared := make(chan error, 1)
	prepDone := make(chan struct{})
	go func() { prepared <- srv.Prepare(ctx); close(prepDone) }()

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("signal received, draining", "grace_ms", cfg.ShutdownGraceMS)
	case err := <-prepared:
		if err != nil {
			runErr = err
			break
		}
		select {
		case <-ctx.Done():
			log.Info("signal received, draining", "grace_ms", cfg.ShutdownGraceMS)
		case err := <-served:
			runErr = err
		}
	case err := <-served:
		runErr = err
	}

	// Drain: stop accepting (Shutdown closes the listener at once), let live
	// executions finish within the grace period, cancel the rest, and wait
	// for their cleanup before the handlers answer and the process exits.
	grace := time.Duration(cfg.ShutdownGraceMS) * time.Millisecond
	graceCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	drained := make(chan struct{})
	go func() { srv.Drain(graceCtx); close(drained) }()
	shutCtx, cancelShut := context.WithTimeout(context.Background(), grace+15*time.Second)
	defer cancelShut()
	if err := hs.Shutdown(shutCtx); err != nil {
		hs.Close()
	}
	<-drained
	// The HTTP server has stopped: the stored results are synced and kept
	// for the next worker.
	if err := srv.Close(); err != nil {
		log.Error("closing the result store", "err", err)
	}
	// A Prepare still unpacking sees ctx cancelled; one that built a pool
	// after Drain closes it itself. Wait for either, so nothing is left.
	select {
	case <-prepDone:
	case <-time.After(30 * time.Second):
		log.Error("start-up preparation did not stop within 30s")
	}
	log.Info("stopped")
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	return runErr
}

// resolveRootfs returns how the server finds each runtime's rootfs: its
// reference (runtimes, or python_image for the default) is an image
// reference (oci-layout:PATH[:TAG], docker-archive:PATH or a registry
// reference) unpacked into rootfs_cache by package rootfs when its digest
// is not there yet, or dir:PATH, an already-unpacked rootfs used as is
// (development and tests; nothing verifies it, and it has no labels). Each
// image is held in use from before its unpack until release, which the
// worker calls at exit. A first unpack logs one record per stage and, on a
// terminal, draws its progress on meter.
func resolveRootfs(cfg config.Config, log *slog.Logger, meter *progress.Meter) (resolve func(ctx context.Context, name, ref string) (rootfs.Image, error), release func()) {
	var mu sync.Mutex
	var holds []func()
	release = func() {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range holds {
			h()
		}
		holds = nil
	}
	resolve = func(ctx context.Context, name, ref string) (rootfs.Image, error) {
		if dir, ok := strings.CutPrefix(ref, "dir:"); ok {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return rootfs.Image{}, err
			}
			log.Warn("using an unpacked rootfs as is (dir:), not a verified image", "runtime", name, "rootfs", abs)
			return rootfs.Image{RootfsPath: abs, Ref: ref, Labels: map[string]string{}}, nil
		}
		cache, err := rootfs.Open(cfg.RootfsCache)
		if err != nil {
			return rootfs.Image{}, err
		}
		if err := cache.CheckReachable(); err != nil {
			return rootfs.Image{}, err
		}
		cache.Progress = unpackProgress(meter, logUnpack(log.With("runtime", name)))
		start := time.Now()
		// Held from before the unpack for the worker's lifetime, so the
		// cache's GC never removes the rootfs sandboxes run on (SECURITY.md
		// case 36). The hold is one open fd: it stays referenced in holds,
		// or a finalizer would close it and drop the hold.
		img, hold, err := cache.UnpackAndUse(ctx, ref)
		meter.Clear()
		if err != nil {
			return rootfs.Image{}, err
		}
		mu.Lock()
		holds = append(holds, hold)
		mu.Unlock()
		log.Info("runtime image ready", "runtime", name, "ref", ref, "digest", img.Digest, "cached", img.Cached,
			"rootfs", img.RootfsPath, "unpack_ms", time.Since(start).Milliseconds())
		return img, nil
	}
	return resolve, release
}
