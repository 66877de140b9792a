package main

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// initTraceLine is a line of GODEBUG=inittrace=1: one package initialised.
var initTraceLine = regexp.MustCompile(`^init (\S+) @\S+ ms, \S+ ms clock, (\d+) bytes, (\d+) allocs$`)

// Every sandbox start runs this binary again as libcontainer's init, and Go
// initialises every package it can before the nsjail package's init hands
// over (in import-path order, so most of the binary's), in every sandbox:
// cold runs, pool refills, session kernels. Our own packages among them
// must not build anything there, such as a compiled regexp (worker_id's
// pattern alone was ~190 KiB in ~1,200 allocations); build it on first use.
// Measured with the test binary, which initialises what sandboxd does before
// the hand-over, and more.
func TestInitBuildsNothingOfOurs(t *testing.T) {
	cmd := exec.Command(os.Args[0], "init")
	// libcontainer's init fails at once without its pipes: what it does
	// before that is what every sandbox start pays.
	cmd.Env = []string{"GODEBUG=inittrace=1"}
	out, _ := cmd.CombinedOutput()
	const maxBytes = 4 << 10
	var n int
	for _, line := range strings.Split(string(out), "\n") {
		m := initTraceLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n++
		if !strings.HasPrefix(m[1], "github.com/sandboxd/sandboxd/") {
			continue
		}
		if b, _ := strconv.Atoi(m[2]); b > maxBytes {
			t.Errorf("sandbox init: package %s allocates %d bytes (%s allocations) when initialised, want <= %d: build it on first use (sync.OnceValue)",
				m[1], b, m[3], maxBytes)
		}
	}
	if n == 0 {
		t.Fatalf("%s init with GODEBUG=inittrace=1 printed no package initialisation:\n%s", os.Args[0], out)
	}
}
