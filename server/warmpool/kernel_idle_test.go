package warmpool_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// spinner is a cell that leaves a thread spinning (and counting into a
// file of the workspace, every 1,000,000 turns) after it returns, and a
// forked process spinning too: code the kernel runs while no execution
// does, unless it is frozen.
const spinner = `import os, threading
spins = 0
def spin():
    global spins
    while True:
        spins += 1
        if spins % 1000000 == 0:
            with open("/workspace/spins", "w") as f:
                f.write(str(spins))
threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:
    while True:
        pass
while spins == 0:
    pass
print("started")`

// SECURITY.md case 47: between executions the kernel's sandbox is frozen:
// what the code left running (a thread, a forked process) uses no CPU and
// changes no file while no execution runs, resumes at the next execution,
// and an Interrupt, MemoryBytes and Close work on the frozen kernel.
func TestKernelIdlesFrozen(t *testing.T) {
	for _, warm := range []bool{true, false} {
		t.Run(map[bool]string{true: "warm", false: "cold"}[warm], func(t *testing.T) {
			e := newKernelEnv(t, map[bool]int{true: 1, false: 0}[warm])
			ws := e.sessionDir(t)
			k := e.start(t, ws, warm, warmpool.KernelOptions{})
			kr := run(t, k, spinner)
			want(t, kr, nsjail.StatusSucceeded, 0, "started\n")
			wantAlive(t, kr)
			cpu, err := warmpool.KernelCPUNS(k)
			if err != nil {
				t.Fatal(err)
			}
			spins, _ := os.ReadFile(filepath.Join(ws, "spins"))
			if e.forks && warm {
				// Frozen, a fork's kernel lets its template's
				// foreground CPU weight go (nsjail.Template.HoldForeground):
				// refills of the template weigh as refills again.
				waitTemplatesInTheBackground(t, "while its fork's kernel idles frozen")
			}
			// Idle: unfrozen, the two spinners would use ~2 CPU-seconds
			// a second (measured 2.79 CPU-s in 3 s before the freeze).
			time.Sleep(500 * time.Millisecond)
			if err := k.Interrupt(); err != nil {
				t.Fatal(err)
			}
			if m := k.MemoryBytes(); m <= 0 {
				t.Errorf("MemoryBytes of the frozen kernel: %d", m)
			}
			idle, err := warmpool.KernelCPUNS(k)
			if err != nil {
				t.Fatal(err)
			}
			if idle != cpu {
				t.Errorf("the idle kernel used %v of CPU", time.Duration(idle-cpu))
			}
			if again, _ := os.ReadFile(filepath.Join(ws, "spins")); string(again) != string(spins) {
				t.Errorf("the idle kernel's thread wrote %q after %q", again, spins)
			}
			// Thawed for the next execution: the thread runs again.
			kr = run(t, k, "import time\nbefore = spins\ntime.sleep(0.2)\nprint(spins > before)")
			want(t, kr, nsjail.StatusSucceeded, 0, "True\n")
			wantAlive(t, kr)
			closed := make(chan struct{})
			go func() {
				k.Close()
				close(closed)
			}()
			select {
			case <-closed:
			case <-time.After(time.Minute):
				t.Fatal("Close of a frozen kernel did not return")
			}
			if k.EndReason() != warmpool.EndClosed {
				t.Fatalf("end reason %q", k.EndReason())
			}
		})
	}
}
