package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sandboxd/sandboxd/server/mcp"
)

func init() {
	commands["mcp"] = command{
		summary: "mcp [--url URL]: MCP over stdio, forwarded to a running worker (for desktop MCP clients); the token from $EXECUTION_WORKER_TOKEN",
		run:     cmdMCP,
	}
}

// mcpMaxLine bounds one stdio message: an upload_file or run_python whose
// files, in base64, reach the worker's default request limit.
const mcpMaxLine = 96 << 20

func cmdMCP(args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("url", "http://127.0.0.1:3100", "the worker: http://HOST:PORT or unix:SOCKET_PATH")
	// The token belongs in $EXECUTION_WORKER_TOKEN: a command line is
	// readable by every user of the host (ps, /proc/PID/cmdline).
	token := fs.String("token", "", "the worker's bearer token; prefer $EXECUTION_WORKER_TOKEN (the default): a command-line argument is visible to every user in ps")
	printSchema := fs.Bool("print-tool-schema", false, "print run_python's definition (name, description, inputSchema) as JSON and exit")
	printTools := fs.Bool("print-tools", false, "print every tool's definition (server/mcp/tools.json) and exit")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	switch {
	case *printSchema:
		def, _ := mcp.Tool("run_python")
		return printJSON(def)
	case *printTools:
		return printJSON(mcp.Tools())
	}
	if *token == "" {
		*token = os.Getenv("EXECUTION_WORKER_TOKEN")
	}
	backend, err := mcp.Remote(*url, *token)
	if err != nil {
		return usagef("%v", err)
	}
	// stdout is the protocol's: logs go to stderr, which MCP clients keep.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = mcp.ServeStdio(ctx, backend, mcpMaxLine, log)
	if ctx.Err() != nil {
		return nil // asked to stop
	}
	return err
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
