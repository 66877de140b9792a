package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/server/config"
)

func init() {
	commands["config"] = command{
		summary: "config print [--config FILE]: the effective serve config, each value with its source",
		run:     cmdConfig,
	}
}

func cmdConfig(args []string) error {
	if len(args) == 0 || args[0] != "print" {
		return usagef("usage: sandboxd config print [--config FILE]")
	}
	fs := flag.NewFlagSet("config print", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", "", "TOML config file")
	if err := fs.Parse(args[1:]); err != nil {
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	cfg, src, err := config.Load(*path, os.Environ())
	if err != nil {
		return err
	}
	cfg.Print(os.Stdout, src)
	for _, n := range config.UnknownEnv(os.Environ()) {
		fmt.Fprintf(os.Stderr, "warning: %s is not a sandboxd setting; ignored\n", n)
	}
	// Printed first so the operator sees the values that are wrong.
	return cfg.Validate()
}
