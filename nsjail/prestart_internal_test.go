package nsjail

import (
	"strings"
	"testing"
	"time"
)

// A Pending leaves its waiting state once: every later Handoff or Retire
// panics before touching the sandbox (here a bare one, which any use would
// crash on), and MemoryBytes no longer reads its cgroup.
func TestPendingLeavesOnce(t *testing.T) {
	for _, state := range []int32{pendingHandedOff, pendingRetired} {
		was := map[int32]string{pendingHandedOff: "handed off", pendingRetired: "retired"}[state]
		p := &Pending{s: &Sandbox{id: "sbx-test"}}
		p.state.Store(state)
		for call, f := range map[string]func(){
			"Handoff": func() { p.Handoff(HandoffOptions{}) },
			"Retire":  func() { p.Retire(time.Second, nil) },
		} {
			func() {
				defer func() {
					msg, _ := recover().(string)
					if want := call + " on pre-started sandbox sbx-test, already " + was; !strings.Contains(msg, want) {
						t.Errorf("panic %q, want %q", msg, want)
					}
				}()
				f()
			}()
		}
		if got := p.MemoryBytes(); got != 0 {
			t.Errorf("MemoryBytes of a %s sandbox = %d, want 0", was, got)
		}
	}
}
