package warmpool

import (
	"errors"

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

// ZygoteSource is zygote.py.
var ZygoteSource = zygoteSource
