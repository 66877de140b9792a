package warmpool

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// ZygoteArgs is zygoteArgs, for the tests of package warmpool_test.
var ZygoteArgs = zygoteArgs

// ReadyPid is the host pid of the zygote of p's first ready sandbox.
func ReadyPid(p *Pool) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tp := range p.templates {
		if len(tp.ready) > 0 {
			r, ok := p.sandboxer.(*nsjail.Runner)
			if !ok {
				return 0, errors.New("the pool's sandboxer is not an *nsjail.Runner")
			}
			return nsjailtest.InitPid(r.StateRoot(), tp.ready[0].pending.ID())
		}
	}
	return 0, errors.New("no ready warm sandbox")
}

// ReadExitReport is readExitReport: F's report of G's wait status is the
// zygote's (template.py's G is zygote.py's code).
var ReadExitReport = readExitReport

// ZygoteSource is zygote.py.
var ZygoteSource = zygoteSource

// KernelPid is the host pid of the process k's pidfd refers to (from the
// pidfd's fdinfo), 0 once k has ended.
func KernelPid(k *Kernel) (int, error) {
	k.mu.Lock()
	fd := k.pidfd
	k.mu.Unlock()
	if fd < 0 {
		return 0, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Pid in the pidfd's fdinfo")
}

// KernelCPUNS is the CPU time k's sandbox has used so far (its cgroup's).
func KernelCPUNS(k *Kernel) (uint64, error) {
	st, err := k.sb.Stats()
	return st.CPUUsageNS, err
}

// SetBeforeSend sets the hook run between an execution's start and the
// sending of its request (nil: none).
func SetBeforeSend(f func(*Kernel)) { beforeSend = f }

// SetWhilePreparing sets the hook run as an execution begins, before the
// kernel is thawed and the reply awaited (nil: none).
func SetWhilePreparing(f func(*Kernel)) { whilePreparing = f }

// LateInterrupt sends k a SIGINT as await does, whether or not an
// execution runs: one that reaches the kernel after its reply.
func LateInterrupt(k *Kernel) error { return k.signal(unix.SIGINT) }

// SetKernelAckTimeout sets kernelAckTimeout until the returned restore.
func SetKernelAckTimeout(d time.Duration) (restore func()) {
	old := kernelAckTimeout
	kernelAckTimeout = d
	return func() { kernelAckTimeout = old }
}

// TemplateArgs is templateArgs: template.py's command line.
var TemplateArgs = templateArgs
