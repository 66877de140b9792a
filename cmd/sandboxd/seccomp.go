package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/seccomp"
	"github.com/sandboxd/sandboxd/seccomp/audit"
)

func init() {
	commands["seccomp"] = command{
		summary: "show the seccomp profile (print [--format table|json|pfc] [--arch ARCH] [--template]) or compare two JSON profiles (diff OLD.json NEW.json)",
		run:     runSeccomp,
	}
}

func runSeccomp(args []string) error {
	if len(args) == 0 {
		return usagef("usage: sandboxd seccomp print [--format table|json|pfc] [--arch ARCH] [--template] | diff OLD.json NEW.json")
	}
	switch args[0] {
	case "print":
		return seccompPrint(os.Stdout, args[1:])
	case "diff":
		return seccompDiff(os.Stdout, args[1:])
	}
	return usagef("unknown seccomp subcommand %q: want print or diff", args[0])
}

func seccompPrint(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("seccomp print", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	format := fs.String("format", "table", "table (SECCOMP.md), json (Docker/OCI profile) or pfc (libseccomp's export)")
	archFlag := fs.String("arch", "", "x86_64 or aarch64 (pfc defaults to this machine's; table and json to all)")
	template := fs.Bool("template", false, "json and pfc: the template profile (a template sandbox's process) instead of the execution profile; the table covers both")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *template && *format == "table" {
		return usagef("--template: the table (SECCOMP.md) covers both profiles; use --format json or pfc")
	}
	p := seccomp.Default()
	var arches []seccomp.Arch
	if *archFlag != "" {
		a, err := seccomp.ParseArch(*archFlag)
		if err != nil {
			return usagef("%v", err)
		}
		arches = []seccomp.Arch{a}
	}
	var out []byte
	var err error
	switch *format {
	case "table":
		out, err = audit.Markdown(p, arches...)
	case "json":
		if *template {
			out, err = audit.TemplateJSON(p, arches...)
		} else {
			out, err = audit.JSON(p, arches...)
		}
	case "pfc":
		a := seccomp.Arch("")
		if len(arches) == 1 {
			a = arches[0]
		} else if a, err = seccomp.NativeArch(); err != nil {
			return err
		}
		if *template {
			out, err = audit.TemplatePFC(p, a)
		} else {
			out, err = audit.PFC(p, a)
		}
	default:
		return usagef("unknown format %q: want table, json or pfc", *format)
	}
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// seccompDiff prints the changes by syscall and architecture and, like
// diff(1), fails when there are any, so scripts can gate on it.
func seccompDiff(w io.Writer, args []string) error {
	if len(args) != 2 {
		return usagef("usage: sandboxd seccomp diff OLD.json NEW.json")
	}
	oldData, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	newData, err := os.ReadFile(args[1])
	if err != nil {
		return err
	}
	header, changes, err := audit.Diff(oldData, newData)
	if err != nil {
		return err
	}
	for _, h := range header {
		fmt.Fprintln(w, h)
	}
	for _, c := range changes {
		fmt.Fprintln(w, c)
	}
	if n := len(header) + len(changes); n > 0 {
		return fmt.Errorf("profiles differ: %d change(s)", n)
	}
	return nil
}
