package session

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/server/volume"
)

// Spare volumes: mkfs.ext4, the loop device and the mount (~13 ms) were
// most of a session's creation. The manager keeps Config.SpareVolumes empty
// volumes made ahead of time, off the request path. Every session has the
// same quota and owner (Config), so any spare fits any session: Create
// renames a spare's directory to the new session's (volume.MoveParentTo:
// one rename, the volume and its mount go with it) and wakes the refill;
// with none ready it makes the directory and the volume itself, as
// without spares.
//
// On disk a spare is a complete volume in <root>/.spare-<16 hex>/volume.
// That name is never a session id (no leading dot: inside.IDRule), and the
// directory never holds a session.json, so a spare is never adopted as a
// session. A worker killed at any point leaves a .spare-* directory
// (complete or half-made) or a session directory without session.json;
// Open removes both (classify: entryLeftover). Close removes the spares,
// mounts and loop devices with them. A spare is never lent, bound into a
// sandbox nor written: the session that takes it gets an empty volume.

// sparePrefix starts a spare's directory name; spareHexLen hex digits
// follow.
const (
	sparePrefix = ".spare-"
	spareHexLen = 16
)

// spare is one ready spare volume.
type spare struct {
	dir string    // <root>/.spare-<hex>
	ws  workspace // dir/volume, mounted
}

// isSpareName says whether name is a spare's directory name.
func isSpareName(name string) bool {
	hex, ok := strings.CutPrefix(name, sparePrefix)
	if !ok || len(hex) != spareHexLen {
		return false
	}
	return strings.Trim(hex, "0123456789abcdef") == ""
}

// wantSpareLocked says whether the refill should make another spare.
func (m *Manager) wantSpareLocked() bool {
	return !m.closed && len(m.spares) < m.cfg.SpareVolumes
}

// wakeSpares asks the refill to look (a spare was taken, or a make failed
// and the janitor's round retries it). It never blocks.
func (m *Manager) wakeSpares() {
	select {
	case m.spareWake <- struct{}{}:
	default:
	}
}

// refillSpares keeps Config.SpareVolumes spares ready until Close. A make
// that fails is logged and retried at the next wake (a Create, or the
// janitor's next round), not in a loop.
func (m *Manager) refillSpares() {
	defer close(m.spareDone)
	for {
		for {
			m.mu.Lock()
			want := m.wantSpareLocked()
			m.mu.Unlock()
			if !want {
				break
			}
			sp, err := m.makeSpare()
			if err != nil {
				m.log.Warn("spare session volume not made (sessions are created without one meanwhile); retried later", "err", err)
				break
			}
			// Appended even after Close began: Close removes the spares
			// once this goroutine is done.
			m.mu.Lock()
			m.spares = append(m.spares, sp)
			m.mu.Unlock()
		}
		select {
		case <-m.spareStop:
			return
		case <-m.spareWake:
		}
		// Woken (mostly) by a Create that took a spare: its session's
		// kernel start and first execution come next, on the same cores.
		// Making the next spare (mkfs, a loop device, a mount: ~13 ms of
		// CPU and I/O) waits until they are likely done (create + first
		// print(1) is ~5 ms); a burst of creates meanwhile makes its own
		// volumes. The janitor's retry waits as long, which costs nothing.
		select {
		case <-m.spareStop:
			return
		case <-time.After(spareRefillDelay):
		}
	}
}

// spareRefillDelay is how long a wake of the refill waits (refillSpares).
const spareRefillDelay = 100 * time.Millisecond

// makeSpare makes one spare volume, complete and mounted.
func (m *Manager) makeSpare() (spare, error) {
	dir := filepath.Join(m.cfg.Root, sparePrefix+volume.RandomHex(spareHexLen/2))
	// 0711 as a session's directory: the spare's becomes one.
	if err := os.Mkdir(dir, 0o711); err != nil {
		return spare{}, err
	}
	ws, err := m.newVolume(dir)
	if err != nil {
		if rerr := m.removeSpareDir(dir); rerr != nil {
			m.log.Error("half-made spare volume could not be removed; the next start sweeps it", "dir", dir, "err", rerr)
		}
		return spare{}, err
	}
	return spare{dir: dir, ws: ws}, nil
}

// newVolume makes a session's volume in dir (its volumeName), with every
// session volume's options.
func (m *Manager) newVolume(dir string) (workspace, error) {
	return m.disk.Create(filepath.Join(dir, volumeName),
		volume.Options{MaxBytes: m.cfg.MaxBytes, MaxFiles: m.cfg.MaxFiles, UID: m.cfg.UID, GID: m.cfg.GID})
}

// takeSpare renames a ready spare's directory to dst, a new session's
// directory, and returns its volume there (dst/volume); nil when there is
// none, or it could not be moved (then it is removed), and fs.ErrExist
// when dst exists (the spare kept, or removed if the refill has made up
// for it meanwhile). It wakes the refill either way.
func (m *Manager) takeSpare(dst string) (workspace, error) {
	defer m.wakeSpares()
	m.mu.Lock()
	n := len(m.spares)
	if n == 0 {
		m.mu.Unlock()
		return nil, nil
	}
	sp := m.spares[n-1]
	m.spares = m.spares[:n-1]
	m.mu.Unlock()
	ws, err := m.disk.MoveParent(sp.dir, sp.ws, dst)
	if errors.Is(err, fs.ErrExist) {
		// Kept, unless the refill has made up for it meanwhile.
		m.mu.Lock()
		keep := m.wantSpareLocked()
		if keep {
			m.spares = append(m.spares, sp)
		}
		m.mu.Unlock()
		if !keep {
			if rerr := m.removeSpareDir(sp.dir); rerr != nil {
				m.log.Error("spare volume could not be removed; the next start sweeps it", "dir", sp.dir, "err", rerr)
			}
		}
		return nil, err
	}
	if err != nil {
		m.log.Warn("spare volume could not be moved into a session; removed, the session makes its own", "dir", sp.dir, "err", err)
		if rerr := m.removeSpareDir(sp.dir); rerr != nil {
			m.log.Error("spare volume could not be removed; the next start sweeps it", "dir", sp.dir, "err", rerr)
		}
		return nil, nil
	}
	return ws, nil
}

// removeSpareDir removes a spare's directory: its volume (mounted or
// half-made) and the directory, as a session's (removeDir: what a lost
// write left of a record in one, as Open may find, goes too).
func (m *Manager) removeSpareDir(dir string) error {
	if err := m.disk.Sweep(dir); err != nil {
		return err
	}
	return m.removeDir(dir)
}

// closeSpares stops the refill and removes the ready spares (Close): a
// spare is worth nothing to the next worker that a refill does not give
// it, and this one leaves no mount behind.
func (m *Manager) closeSpares() {
	close(m.spareStop)
	<-m.spareDone
	m.mu.Lock()
	spares := m.spares
	m.spares = nil
	m.mu.Unlock()
	for _, sp := range spares {
		if err := m.removeSpareDir(sp.dir); err != nil {
			m.log.Error("spare volume could not be removed; the next start sweeps it", "dir", sp.dir, "err", err)
		}
	}
}
