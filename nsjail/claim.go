package nsjail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Claim makes this Runner the only one on the host using its state root and
// its cgroup parent, until release is called or the process exits (the
// kernel drops flock locks with the process, so a SIGKILLed worker never
// leaves a stale claim). Sweep treats every sandbox under both as an orphan
// of a crashed worker: two live workers sharing either would kill each
// other's sandboxes. A worker calls Claim before Sweep; a second one fails with a
// clear error instead.
func (r *Runner) Claim() (release func(), err error) {
	parentKey := strings.ReplaceAll(r.opts.CgroupParent, "/", "_")
	paths := []string{
		filepath.Clean(r.opts.StateRoot) + ".lock",
		filepath.Join(filepath.Dir(filepath.Clean(r.opts.StateRoot)), "cgroup-"+parentKey+".lock"),
	}
	var held []*os.File
	release = func() {
		for _, f := range held {
			f.Close()
		}
	}
	for _, p := range paths {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			release()
			return nil, fmt.Errorf("unable to open lock %s: %w", p, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			release()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("another sandboxd already uses state root %s or cgroup parent %q (lock %s): give each worker its own", r.opts.StateRoot, r.opts.CgroupParent, p)
			}
			return nil, fmt.Errorf("unable to lock %s: %w", p, err)
		}
		held = append(held, f)
	}
	return release, nil
}
