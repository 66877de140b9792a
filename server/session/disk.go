package session

import "github.com/sandboxd/sandboxd/server/volume"

// disk is what the manager needs of package volume. The real one needs
// root and loop devices; the unit tests of the manager's own logic
// (states, busy, janitor, persistence, sweep) put a plain directory in its
// place.
type disk interface {
	Create(dir string, o volume.Options) (workspace, error)
	Open(dir string) (workspace, error)
	// Sweep removes interrupted Creates and Removes under dir.
	Sweep(dir string) error
	Remove(dir string) error
	// MoveParent renames from, the directory that holds ws (ws in its
	// volumeName), to dir (which must not exist: fs.ErrExist), ws mounted
	// as it is, and returns ws there: a spare's directory becomes a
	// session's.
	MoveParent(from string, ws workspace, dir string) (workspace, error)
}

// workspace is one session's mounted volume.
type workspace interface {
	Path() string
	Usage() (volume.Usage, error)
	// Volume is the real volume for the file API (nil in unit tests).
	Volume() *volume.Volume
}

type volumeDisk struct{}

type volumeWorkspace struct{ v *volume.Volume }

func (w volumeWorkspace) Path() string                 { return w.v.Path() }
func (w volumeWorkspace) Usage() (volume.Usage, error) { return w.v.Usage() }
func (w volumeWorkspace) Volume() *volume.Volume       { return w.v }

func (volumeDisk) Create(dir string, o volume.Options) (workspace, error) {
	v, err := volume.Create(dir, o)
	if err != nil {
		return nil, err
	}
	return volumeWorkspace{v}, nil
}

func (volumeDisk) Open(dir string) (workspace, error) {
	v, err := volume.Open(dir)
	if err != nil {
		return nil, err
	}
	return volumeWorkspace{v}, nil
}

func (volumeDisk) Sweep(dir string) error {
	_, err := volume.Sweep(dir)
	return err
}

func (volumeDisk) Remove(dir string) error { return volume.Remove(dir) }

func (volumeDisk) MoveParent(from string, ws workspace, dir string) (workspace, error) {
	v, err := ws.Volume().MoveParentTo(from, dir)
	if err != nil {
		return nil, err
	}
	return volumeWorkspace{v}, nil
}
