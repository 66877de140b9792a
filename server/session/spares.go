package session

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
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
// Spare kernels: then the kernel's hand-off (~1.7 ms, started as Create
// answered: startAhead) was what was left of create + first print(1).
// Config.SpareKernels of the spares also hold a kernel of one kind
// (Config.SparePolicy on SpareRuntime: the default session type's), handed
// off from a warm sandbox by the refill with the spare's volume at
// /workspace (WarmOnly: never a cold sandbox outside admission, SECURITY.md
// case 61). A Create of that kind takes such a spare and adopts its kernel
// as the one it would have started ahead: same sandbox spec (nothing in a
// kernel's spec names its session), same generation 1 and first execution
// ("new", "first_execution"). A spare's kernel has run no code and was
// never lent (SECURITY.md case 62): taken out of the list under the lock by
// exactly one Create, it serves that session only and ends with it. A
// Create of another kind takes a spare without a kernel, or makes its own.
// A spare kernel that ended (OOM of the host, a kill) is closed and its
// volume serves as a plain spare; one older than Config.SpareMaxAge
// (pool_max_idle, as the pool's warm sandboxes) is closed and replaced. Spare kernels are outside the idle
// kernels' budget and metrics (they are the warm pool's cost: one warm
// sandbox each, which the pool refills at once, RefillNow).
//
// On disk a spare is a complete volume in <root>/.spare-<16 hex>/volume.
// That name is never a session id (no leading dot: inside.IDRule), and the
// directory never holds a session.json, so a spare is never adopted as a
// session. A worker killed at any point leaves a .spare-* directory
// (complete or half-made) or a session directory without session.json;
// Open removes both (classify: entryLeftover), and the start-up sweep the
// sandboxes of any spare kernels. Close closes the spares' kernels and
// removes the spares, mounts and loop devices with them. A spare's volume
// is never lent nor written before a session takes it: that session gets
// an empty volume.

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
	// kernel, when not nil, is a kernel of the spare kind with ws at its
	// /workspace, which has run nothing.
	kernel Kernel
}

// live says whether the spare holds a kernel that has not ended.
func (sp spare) live() bool { return sp.kernel != nil && !ended(sp.kernel) }

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

// refillSpares keeps Config.SpareVolumes spares ready, SpareKernels of
// them with a kernel, until Close. A volume that fails to be made is
// logged and retried at the next wake (a Create, or the janitor's next
// round), not in a loop; a kernel that finds no warm sandbox is retried
// after spareKernelRetry, doubling up to spareKernelRetryMax (the pool
// refills in about a second).
func (m *Manager) refillSpares() {
	defer close(m.spareDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.spareStop:
			cancel() // a kernel's hand-off in flight ends now
		case <-ctx.Done():
		}
	}()
	retry := spareKernelRetry
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
		var again <-chan time.Time
		if m.fillSpareKernels(ctx) {
			again = time.After(retry)
			retry = min(2*retry, spareKernelRetryMax)
		} else {
			retry = spareKernelRetry
		}
		select {
		case <-m.spareStop:
			return
		case <-again:
			continue
		case <-m.spareWake:
		}
		// Woken (mostly) by a Create that took a spare: its session's
		// kernel start and first execution come next, on the same cores.
		// Making the next spare (mkfs, a loop device, a mount: ~13 ms of
		// CPU and I/O; a kernel's hand-off) waits until they are likely
		// done (create + first print(1) is ~5 ms); a burst of creates
		// meanwhile makes its own volumes. The janitor's retry waits as
		// long, which costs nothing.
		select {
		case <-m.spareStop:
			return
		case <-time.After(spareRefillDelay):
		}
	}
}

// fillSpareKernels starts kernels in spares until Config.SpareKernels of
// them hold a live one, closing those that ended or aged (SpareMaxAge). It
// says whether one is still missing because the start failed (mostly: no
// warm sandbox ready); not for want of a spare volume, which the volume
// refill's retry brings.
func (m *Manager) fillSpareKernels(ctx context.Context) (retry bool) {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return false
		}
		var dead []Kernel
		live, free := 0, -1
		for i := range m.spares {
			sp := &m.spares[i]
			// A kernel's StartedAt is the real clock's (Config.Now is
			// the sessions').
			aged := sp.kernel != nil && m.cfg.SpareMaxAge > 0 && time.Since(sp.kernel.StartedAt()) >= m.cfg.SpareMaxAge
			if sp.kernel != nil && (!sp.live() || aged) {
				dead = append(dead, sp.kernel)
				sp.kernel = nil
			}
			if sp.kernel != nil {
				live++
			} else if free < 0 {
				free = i
			}
		}
		var sp spare
		start := live < m.cfg.SpareKernels && free >= 0
		if start {
			// Out of the list while its kernel starts: no Create takes
			// it half-made.
			sp = m.spares[free]
			m.spares = slices.Delete(m.spares, free, free+1)
		}
		m.mu.Unlock()
		for _, k := range dead {
			if ended(k) {
				m.log.Warn("spare session kernel ended before a session took it; replaced", "reason", k.EndReason())
			} else {
				m.log.Info("spare session kernel retired after session_spare_kernels' max age (pool_max_idle); replaced", "started_at", k.StartedAt())
			}
			k.Close()
		}
		if !start {
			return false
		}
		k, err := m.starter.StartKernel(ctx, m.cfg.SparePolicy, m.cfg.SpareRuntime, sp.ws.Path(),
			warmpool.KernelOptions{WarmOnly: true, RefillNow: true})
		sp.kernel = k
		// Put back even after Close began: Close closes the spares'
		// kernels once this goroutine is done.
		m.mu.Lock()
		m.spares = append(m.spares, sp)
		m.mu.Unlock()
		if err != nil {
			if !errors.Is(err, warmpool.ErrNoWarmSandbox) && ctx.Err() == nil {
				m.log.Warn("spare session kernel not started; retried later", "err", err)
			}
			return true
		}
	}
}

// spareRefillDelay is how long a wake of the refill waits (refillSpares);
// spareKernelRetry and spareKernelRetryMax pace the retries of a spare
// kernel's start.
const (
	spareRefillDelay    = 100 * time.Millisecond
	spareKernelRetry    = 100 * time.Millisecond
	spareKernelRetryMax = 2 * time.Second
)

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
// directory, and returns its volume there (dst/volume) and, when adopt
// (the session is of the spare kernels' kind), the spare's kernel if it
// holds one. It returns no volume when there is no spare, or it could not
// be moved (then it is removed), and fs.ErrExist when dst exists (the spare
// kept, or removed if the refill has made up for it meanwhile). It wakes
// the refill either way.
func (m *Manager) takeSpare(dst string, adopt bool) (workspace, Kernel, error) {
	defer m.wakeSpares()
	m.mu.Lock()
	i := m.pickSpareLocked(adopt)
	if i < 0 {
		m.mu.Unlock()
		return nil, nil, nil
	}
	sp := m.spares[i]
	m.spares = slices.Delete(m.spares, i, i+1)
	m.mu.Unlock()
	if sp.kernel != nil && (!adopt || !sp.live()) {
		// Ended (pickSpareLocked gives a session of another kind no live
		// one): its volume is a plain spare.
		sp.kernel.Close()
		sp.kernel = nil
	}
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
			m.dropSpare(sp)
		}
		return nil, nil, err
	}
	if err != nil {
		m.log.Warn("spare volume could not be moved into a session; removed, the session makes its own", "dir", sp.dir, "err", err)
		m.dropSpare(sp)
		return nil, nil, nil
	}
	return ws, sp.kernel, nil
}

// pickSpareLocked is the index of the spare a Create takes, -1 if none:
// for a session of the spare kernels' kind (adopt), one with a live kernel
// first; else one without (a spare's kernel is kept for the sessions it
// fits).
func (m *Manager) pickSpareLocked(adopt bool) int {
	pick := -1
	for i, sp := range m.spares {
		live := sp.live()
		if live == adopt {
			return i
		}
		if !live && pick < 0 {
			pick = i
		}
	}
	return pick
}

// dropSpare closes a spare's kernel and removes its directory.
func (m *Manager) dropSpare(sp spare) {
	if sp.kernel != nil {
		sp.kernel.Close()
	}
	if err := m.removeSpareDir(sp.dir); err != nil {
		m.log.Error("spare volume could not be removed; the next start sweeps it", "dir", sp.dir, "err", err)
	}
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

// closeSpares stops the refill, closes the spares' kernels and removes the
// spares (Close): a spare is worth nothing to the next worker that a
// refill does not give it, and this one leaves no mount behind.
func (m *Manager) closeSpares() {
	close(m.spareStop)
	<-m.spareDone
	m.mu.Lock()
	spares := m.spares
	m.spares = nil
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, sp := range spares {
		wg.Go(func() { m.dropSpare(sp) })
	}
	wg.Wait()
}

// spareKernelsLocked counts the spares' live kernels.
func (m *Manager) spareKernelsLocked() int {
	n := 0
	for _, sp := range m.spares {
		if sp.live() {
			n++
		}
	}
	return n
}
