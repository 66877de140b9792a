// Command sandboxd is the self-hosted execution worker: it runs untrusted
// Python in fresh, single-use Linux sandboxes. This file is wiring only; each
// subcommand lives in its own file and registers itself in commands.
//
// The same binary is also libcontainer's init: a sandbox starts as
// "/proc/self/exe init", which the nsjail package's init() intercepts before
// main runs.
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/sandboxd/sandboxd/nsjail" // also libcontainer's init re-exec
)

// command is one subcommand: run gets the arguments after its name.
type command struct {
	summary string
	run     func(args []string) error
}

var commands = map[string]command{}

// usageError is a bad invocation: printed with a hint, exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// exitStatus is a command's own exit status (supervise exits with its
// child's): main exits with it and prints nothing; 0 is success.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	if err := nsjail.SetInitGOMAXPROCS(); err != nil {
		fmt.Fprintf(os.Stderr, "sandboxd: %v\n", err)
		os.Exit(1)
	}
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		printUsage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "sandboxd: unknown command %q (see sandboxd --help)\n", os.Args[1])
		os.Exit(2)
	}
	err := cmd.run(os.Args[2:])
	var status exitStatus
	if errors.As(err, &status) {
		os.Exit(int(status))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxd %s: %s\n", os.Args[1], oneLine(err))
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

func printUsage() {
	fmt.Fprintln(os.Stderr, "usage: sandboxd COMMAND [ARGS]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, commands[n].summary)
	}
}
