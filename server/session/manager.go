package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/sessionid"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Manager keeps the sessions.
type Manager struct {
	cfg     Config
	starter Starter
	log     *slog.Logger
	disk    disk
	lock    *os.File // flock on cfg.Root for the manager's life

	mu       sync.Mutex
	sessions map[string]*session // also those being created or deleted (gone)
	closed   bool
	starts   map[string]uint64 // kernel starts by "state/reason"
	ops      sync.WaitGroup    // Creates (their syncs, starts ahead), Deletes and kernel stops in flight: Close waits
	spares   []spare           // ready spare volumes (spares.go)

	stopJanitor chan struct{}
	janitorDone chan struct{}
	spareWake   chan struct{} // cap 1: the refill has something to do
	spareStop   chan struct{} // closed by Close
	spareDone   chan struct{} // closed when the refill returned
}

// session is one session. Its fields below mu are guarded by Manager.mu.
type session struct {
	id  string
	dir string
	ws  workspace
	// writeMu serializes the writes of session.json; it is taken before
	// Manager.mu, never after.
	writeMu sync.Mutex

	rec     record    // as it is now; LastUsedAt and Generation change
	written time.Time // when rec was last written
	dirty   bool      // rec changed since

	// gone: being created, being deleted, or deleted: invisible to the API.
	gone bool
	// busy: a Run holds the session (Begin..End).
	busy bool
	// lends: the volume is lent to the file API (Lend).
	lends int
	// ctx is cancelled once the session is being deleted (stop): the
	// lent requests end with it (a slow download must not hold a Delete).
	ctx  context.Context
	stop context.CancelFunc
	// lent counts the lends in flight: Delete waits for them before it
	// removes the volume a request reads or writes (SECURITY.md case 49).
	// Added to only under Manager.mu while !gone and !closed.
	lent sync.WaitGroup
	// starting / executing: a kernel is starting (for the Run, or ahead
	// of it: startAhead) / the Run runs code.
	starting, executing bool
	// ahead is the kernel Create started ahead of the first execution
	// (startAhead), or adopted from a spare (done and cancel nil from the
	// start), until that execution takes it (Run.kernel).
	ahead *aheadKernel
	// cancel cancels the running execution's context (Delete).
	cancel context.CancelFunc
	// kernel is the live kernel, if any.
	kernel Kernel
	// durable is closed once the session's creation is on disk (Create
	// answers before: syncCreated). Its code runs, its files are lent
	// and it is removed only after. Closed from the start for a loaded
	// session.
	durable chan struct{}
	// next is what the next execution says when it starts a kernel.
	next ExecInfo
	// endReason is why the last kernel stopped.
	endReason string
	// active counts the Run's Exec and the janitor's kernel stops in
	// flight: Delete waits for them before removing the volume a kernel
	// has bound (and a start ahead). Added to only under Manager.mu while
	// !gone and !closed (or by Create, which holds an m.ops count that
	// Close waits for).
	active sync.WaitGroup
}

// Open sweeps cfg.Root (half-created and half-removed volumes), loads the
// sessions found there (their kernels are gone: the next execution says
// StateRestarted) and starts the janitor.
func Open(cfg Config, starter Starter, log *slog.Logger) (*Manager, error) {
	return open(cfg, starter, log, volumeDisk{})
}

func open(cfg Config, starter Starter, log *slog.Logger, d disk) (*Manager, error) {
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.withDefaults()
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("open sessions: %w", err)
	}
	if err := prepareRoot(cfg.Root); err != nil {
		return nil, fmt.Errorf("open sessions: %w", err)
	}
	lock, err := lockRoot(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("open sessions: %w", err)
	}
	m := &Manager{cfg: cfg, starter: starter, log: log.With("component", "sessions"), disk: d, lock: lock,
		sessions: map[string]*session{}, starts: map[string]uint64{},
		stopJanitor: make(chan struct{}), janitorDone: make(chan struct{}),
		spareWake: make(chan struct{}, 1), spareStop: make(chan struct{}), spareDone: make(chan struct{})}
	if err := m.load(); err != nil {
		lock.Close()
		return nil, fmt.Errorf("open sessions: %w", err)
	}
	// A worker killed between a Create's answer and its sync
	// (syncCreated) left that session in the page cache only: make
	// whatever it left durable, once, before sessions are used.
	if err := unix.Syncfs(int(lock.Fd())); err != nil {
		m.log.Error("sessions dir not synced: a session created just before the last worker's end may not survive a host crash", "err", err)
	}
	go m.janitor()
	go m.refillSpares()
	return m, nil
}

// load sweeps the root and opens every session found in it. A session that
// cannot be loaded is logged and left on disk for an operator (its id stays
// taken); only the manager's own leftovers are removed.
func (m *Manager) load() error {
	entries, err := os.ReadDir(m.cfg.Root)
	if err != nil {
		return err
	}
	now := m.cfg.Now()
	for _, e := range entries {
		name := e.Name()
		kind, err := classify(m.cfg.Root, name)
		if kind == entryForeign {
			m.log.Warn("sessions dir: entry left alone, not a session", "entry", name, "err", err)
			continue
		}
		dir := filepath.Join(m.cfg.Root, name)
		if err := m.disk.Sweep(dir); err != nil {
			m.log.Error("session skipped: its volume leftovers could not be swept", "session", name, "err", err)
			continue
		}
		if kind == entryLeftover && isSpareName(name) {
			if err := m.removeSpareDir(dir); err != nil {
				m.log.Error("spare volume could not be removed", "dir", name, "err", err)
			}
			continue
		}
		if kind == entryLeftover {
			if err := m.removeDir(dir); err != nil {
				m.log.Error("half-created or half-deleted session could not be removed", "session", name, "err", err)
			} else {
				m.log.Info("half-created or half-deleted session removed", "session", name)
			}
			continue
		}
		s, err := m.loadSession(dir, name, now)
		if err != nil {
			m.log.Error("session skipped: it stays on disk, its id taken", "session", name, "err", err)
			continue
		}
		m.sessions[name] = s
	}
	return nil
}

func (m *Manager) loadSession(dir, name string, now time.Time) (*session, error) {
	if err := removeTmpRecords(dir); err != nil {
		return nil, err
	}
	rec, err := readRecord(dir, name)
	if err != nil {
		return nil, err
	}
	// A last use in the future (a clock set back, or a planted record)
	// would keep the session forever (SECURITY.md case 42).
	if rec.LastUsedAt.After(now) {
		rec.LastUsedAt = now
	}
	rec.IdleTimeoutMS = min(rec.IdleTimeoutMS, m.cfg.MaxIdleTimeout.Milliseconds())
	ws, err := m.disk.Open(filepath.Join(dir, volumeName))
	if err != nil {
		return nil, err
	}
	s := newSession(name, dir, rec, now)
	s.ws = ws
	switch {
	case !rec.Kernel:
		s.next = ExecInfo{State: StateNew, Reason: ReasonNoKernel}
	case rec.Generation == 0:
		s.next = ExecInfo{State: StateNew, Reason: ReasonFirst}
	default:
		s.next = ExecInfo{State: StateRestarted, Reason: ReasonWorkerRestart}
		s.endReason = ReasonWorkerRestart
	}
	return s, nil
}

// newSession is a session of record rec in dir, last written at now.
func newSession(id, dir string, rec record, now time.Time) *session {
	s := &session{id: id, dir: dir, rec: rec, written: now, durable: make(chan struct{})}
	close(s.durable)
	s.ctx, s.stop = context.WithCancel(context.Background())
	return s
}

// removeDir removes a session directory: session.json first (so that a
// removal cut short leaves a leftover for the next Open's sweep, never a
// session with half its files), then its volume, then the directory.
func (m *Manager) removeDir(dir string) error {
	if err := os.Remove(filepath.Join(dir, recordName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := volume.SyncDir(dir); err != nil {
		return err
	}
	if err := m.disk.Remove(filepath.Join(dir, volumeName)); err != nil {
		return err
	}
	if err := removeTmpRecords(dir); err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return volume.SyncDir(filepath.Dir(dir))
}

// Create creates a session and its volume.
func (m *Manager) Create(spec Spec) (Info, error) {
	idle, err := m.checkSpec(&spec)
	if err != nil {
		return Info{}, err
	}
	now := m.cfg.Now()
	s := newSession(spec.ID, filepath.Join(m.cfg.Root, spec.ID), record{Format: recordFormat, ID: spec.ID,
		Policy: spec.Policy, Runtime: spec.Runtime, Kernel: spec.Kernel, IdleTimeoutMS: idle.Milliseconds(), CreatedAt: now, LastUsedAt: now}, now)
	s.gone = true
	s.next = ExecInfo{State: StateNew, Reason: ReasonFirst}
	if !spec.Kernel {
		s.next.Reason = ReasonNoKernel
	} else {
		// The kernel started ahead (startAhead), recorded in the first
		// record.
		s.rec.Generation = 1
	}
	// Reserve the id (and a place under max_sessions) while the volume is
	// made outside the lock.
	m.mu.Lock()
	switch {
	case m.closed:
		err = ErrClosed
	case m.sessions[spec.ID] != nil:
		err = ErrExists
	case len(m.sessions) >= m.cfg.MaxSessions:
		err = ErrTooMany
	default:
		m.sessions[spec.ID] = s
		m.ops.Add(1)
	}
	m.mu.Unlock()
	if err != nil {
		s.stop()
		return Info{}, err
	}
	defer m.ops.Done()
	adopt := spec.Kernel && spec.Policy == m.cfg.SparePolicy && spec.Runtime == m.cfg.SpareRuntime
	k, err := m.build(s, adopt)
	if err != nil {
		s.stop()
		m.mu.Lock()
		delete(m.sessions, spec.ID)
		m.mu.Unlock()
		return Info{}, err
	}
	// Made durable right away, off the request path (build's fsyncs were
	// 2-4 ms of a 9 ms create + first execution, more on a busy disk).
	// Close waits for it (ops).
	s.durable = make(chan struct{})
	m.ops.Add(1)
	go m.syncCreated(s)
	m.mu.Lock()
	s.gone = false
	var ahead *aheadKernel
	closeK := false
	switch {
	case k != nil && m.closed:
		// Closing meanwhile: Close stops the kernels it found, not this
		// one; the start Create recorded is taken back (Close writes it).
		s.rec.Generation--
		s.dirty = true
		closeK = true
	case k != nil:
		// A spare's kernel (spares.go), adopted: this session's kernel
		// started ahead, its start done.
		s.kernel = k
		s.ahead = &aheadKernel{kernel: k, info: s.next}
		m.starts[s.next.State+"/"+s.next.Reason]++
	case spec.Kernel:
		ahead = &aheadKernel{done: make(chan struct{})}
		s.ahead, s.starting = ahead, true // as Create answers
		s.active.Add(1)
		m.ops.Add(1)
	}
	m.mu.Unlock()
	if closeK {
		k.Close()
	}
	info := m.info(s) // as Create answers: the kernel idle or starting
	if ahead != nil {
		go m.startAhead(s, ahead)
	}
	m.log.Info("session created", "session", s.id, "policy", spec.Policy, "kernel", spec.Kernel, "spare_kernel", k != nil && !closeK)
	return info, nil
}

// checkSpec validates spec, generates its id if it has none, and returns
// its idle timeout.
func (m *Manager) checkSpec(spec *Spec) (time.Duration, error) {
	if spec.ID == "" {
		spec.ID = sessionid.New(m.cfg.Owner)
	}
	var errs []error
	if !inside.ValidID(spec.ID) {
		errs = append(errs, fmt.Errorf("id must match %s, got: %q", inside.IDRule, spec.ID))
	} else if owner, ok := sessionid.Owner(spec.ID); ok && owner != m.cfg.Owner {
		// A client's id of the owned form names the worker that holds the
		// session: one naming another worker would be forwarded there by
		// every other worker, and never reach this one's session.
		errs = append(errs, fmt.Errorf("id %q has the form se-<owner>-… of generated ids and names the owner %s, not this worker (%s): choose an id of another form, or let the worker generate one",
			spec.ID, owner, cmp.Or(m.cfg.Owner, "none: worker_id is not set")))
	}
	if err := checkPolicyName(spec.Policy); err != nil {
		errs = append(errs, err)
	}
	if spec.Runtime == "" {
		spec.Runtime = config.DefaultRuntime
	}
	if err := checkRuntimeName(spec.Runtime); err != nil {
		errs = append(errs, err)
	}
	// The one rule of a session's idle timeout: above the maximum it is
	// refused, not capped (as an execution's timeout: SECURITY.md case 20).
	if spec.IdleTimeout < 0 || spec.IdleTimeout > m.cfg.MaxIdleTimeout {
		errs = append(errs, fmt.Errorf("idle_timeout_ms must be in 0..%d (session_max_idle_timeout; 0: the default), got: %d",
			m.cfg.MaxIdleTimeout.Milliseconds(), spec.IdleTimeout.Milliseconds()))
	}
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if spec.IdleTimeout == 0 {
		return m.cfg.IdleTimeout, nil
	}
	return spec.IdleTimeout, nil
}

// build makes the session's directory, its volume, and last its record,
// in the page cache: all of it survives the worker's death (kill -9, OOM
// kill) from here on, and a host crash once syncCreated is done. The
// order keeps a session half-made until its record exists: a directory
// without session.json (or, after a host crash, with an empty one) is a
// leftover for the next Open.
func (m *Manager) build(s *session, adopt bool) (k Kernel, err error) {
	// A spare made ahead of time when one is ready (spares.go): its
	// directory becomes the session's, and its kernel, if it holds one
	// and adopt, the session's. Else the directory and volume are made
	// here.
	s.ws, k, err = m.takeSpare(s.dir, adopt)
	if err == nil && s.ws == nil {
		err = os.Mkdir(s.dir, 0o711)
	}
	if errors.Is(err, fs.ErrExist) {
		// A session on disk that Open could not load keeps its id.
		return nil, fmt.Errorf("%w (a directory %s is in the way)", ErrExists, s.dir)
	}
	if err != nil {
		return nil, fmt.Errorf("create session %s: %w", s.id, err)
	}
	defer func() {
		if err != nil {
			if k != nil {
				k.Close() // before its volume goes
				k = nil
			}
			if rerr := m.removeDir(s.dir); rerr != nil {
				m.log.Error("half-created session could not be removed; the next start sweeps it", "session", s.id, "err", rerr)
			}
		}
	}()
	if s.ws == nil {
		if s.ws, err = m.newVolume(s.dir); err != nil {
			return nil, fmt.Errorf("create session %s: %w", s.id, err)
		}
	}
	if err := writeNewRecord(s.dir, s.rec); err != nil {
		return k, fmt.Errorf("create session %s: %w", s.id, err)
	}
	return k, nil
}

// syncCreatedRecord is syncNewRecord; tests hold it back.
var syncCreatedRecord = syncNewRecord

// syncCreated makes a created session durable (syncNewRecord: its record,
// its directory's entries, its entry in the root) and then closes
// s.durable. What a host crash before that loses is the session and its
// 201, nothing else: Run.kernel runs no code and Lend lends no volume
// before s.durable. A failed sync is logged; the session goes on (it is
// in the page cache), and its next record write (writeRecord) syncs its
// record and directory again.
func (m *Manager) syncCreated(s *session) {
	defer m.ops.Done()
	defer close(s.durable)
	if err := syncCreatedRecord(s.dir); err != nil {
		m.log.Error("session created but not made durable: a host crash may lose it", "session", s.id, "err", err)
	}
}

// lookup is the visible session id; called with m.mu held.
func (m *Manager) lookupLocked(id string) (*session, error) {
	if m.closed {
		return nil, ErrClosed
	}
	s := m.sessions[id]
	if s == nil || s.gone {
		return nil, ErrNotFound
	}
	return s, nil
}

// Get is one session.
func (m *Manager) Get(id string) (Info, error) {
	m.mu.Lock()
	s, err := m.lookupLocked(id)
	m.mu.Unlock()
	if err != nil {
		return Info{}, err
	}
	return m.info(s), nil
}

// Has tells whether session id is here, without reading its volume.
func (m *Manager) Has(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.lookupLocked(id)
	return err == nil
}

// List is every session, by id.
func (m *Manager) List() []Info {
	m.mu.Lock()
	var ss []*session
	if !m.closed {
		for _, s := range m.sessions {
			if !s.gone {
				ss = append(ss, s)
			}
		}
	}
	m.mu.Unlock()
	slices.SortFunc(ss, func(a, b *session) int { return strings.Compare(a.id, b.id) })
	infos := make([]Info, 0, len(ss))
	for _, s := range ss {
		infos = append(infos, m.info(s))
	}
	return infos
}

// info is s as the API shows it; the volume's usage is read outside the
// lock.
func (m *Manager) info(s *session) Info {
	m.mu.Lock()
	i := Info{ID: s.id, Type: s.rec.Policy, Runtime: s.rec.runtime(), IdleTimeoutMS: s.rec.IdleTimeoutMS,
		CreatedAt: s.rec.CreatedAt, LastUsedAt: s.rec.LastUsedAt,
		ExpiresAt: s.rec.LastUsedAt.Add(m.cfg.Retention),
		Kernel:    KernelInfo{Enabled: s.rec.Kernel, State: s.kernelStateLocked(), Generation: s.rec.Generation}}
	if s.kernel != nil && !ended(s.kernel) {
		t := s.kernel.StartedAt()
		i.Kernel.StartedAt = &t
	} else {
		i.Kernel.EndReason = s.endReason
		if s.kernel != nil {
			i.Kernel.EndReason = s.kernel.EndReason()
		}
	}
	ws := s.ws
	m.mu.Unlock()
	u, err := ws.Usage()
	if err != nil {
		m.log.Warn("session volume usage", "session", s.id, "err", err)
	}
	i.Workspace = WorkspaceInfo{BytesUsed: u.Bytes, FilesUsed: u.Files, MaxBytes: u.MaxBytes, MaxFiles: u.MaxFiles}
	return i
}

func (s *session) kernelStateLocked() string {
	switch {
	case s.starting:
		return KernelStarting
	case s.executing:
		return KernelBusy
	case s.kernel != nil && !ended(s.kernel):
		return KernelIdle
	}
	return KernelNone
}

// ended tells whether k has ended, without waiting.
func ended(k Kernel) bool {
	select {
	case <-k.Ended():
		return true
	default:
		return false
	}
}

// touchLocked marks s used now.
func (m *Manager) touchLocked(s *session) {
	s.rec.LastUsedAt = m.cfg.Now()
	s.dirty = true
}

// Delete kills the session's kernel and removes its volume. A running
// execution is cancelled: its context is cancelled and its kernel killed.
func (m *Manager) Delete(id string) error {
	m.mu.Lock()
	s, err := m.lookupLocked(id)
	if err == nil {
		m.ops.Add(1)
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	defer m.ops.Done()
	return m.remove(s, "deleted", nil)
}

// remove deletes s (Delete, retention) if it is still there and, when
// check is not nil, check says so under the lock. The id stays taken until
// its directory is gone.
func (m *Manager) remove(s *session, why string, check func() bool) error {
	m.mu.Lock()
	if s.gone || (check != nil && !check()) {
		m.mu.Unlock()
		return ErrNotFound
	}
	s.gone = true // no new Exec, lend or kernel stop from here on
	k := s.kernel
	s.kernel = nil
	if s.cancel != nil && k == nil { // else Close kills the running execution at once (an interrupt could be answered first)
		s.cancel()
	}
	s.stop()
	m.mu.Unlock()
	if k != nil {
		k.Close()
	}
	// The Run's Exec, if any, returns once its kernel is closed; a kernel
	// it was starting is closed by it, seeing the session gone. The lent
	// requests see their context cancelled and end (SECURITY.md case 49).
	s.active.Wait()
	s.lent.Wait()
	<-s.durable // no sync of a directory being removed
	s.writeMu.Lock()
	err := m.removeDir(s.dir)
	s.writeMu.Unlock()
	if err != nil {
		// Left gone and taken: the next Open sweeps or reports it.
		m.log.Error("session files could not be removed", "session", s.id, "err", err)
		return fmt.Errorf("delete session %s: %w", s.id, err)
	}
	m.mu.Lock()
	delete(m.sessions, s.id)
	m.mu.Unlock()
	m.log.Info("session removed", "session", s.id, "why", why)
	return nil
}

// Interrupt raises KeyboardInterrupt in the session's running execution.
func (m *Manager) Interrupt(id string) error {
	m.mu.Lock()
	s, err := m.lookupLocked(id)
	var k Kernel
	if err == nil {
		if !s.executing || s.kernel == nil {
			err = ErrNotRunning
		}
		k = s.kernel
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	return k.Interrupt()
}

// Begin reserves the session for one execution (ErrBusy when one runs)
// and marks it used. The Run must be ended with End.
func (m *Manager) Begin(id string) (*Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.lookupLocked(id)
	if err != nil {
		return nil, err
	}
	if s.busy {
		return nil, ErrBusy
	}
	s.busy = true
	m.touchLocked(s)
	return &Run{m: m, s: s}, nil
}

// Lend is a session's volume lent to the file API (Manager.Lend): the
// session cannot be deleted, nor expire, nor its volume go, before Release.
type Lend struct {
	// Volume is the session's volume; its path names this session's
	// volume until Release, and no other's (SECURITY.md case 49).
	Volume *volume.Volume
	// Policy and Runtime are the session's: the profile's sandbox's.
	Policy, Runtime string
	// Ctx is cancelled when the session is being deleted: the request
	// must end then (the Delete waits for it). Close leaves lends alone:
	// the volumes stay mounted, and the HTTP server's shutdown bounds the
	// requests.
	Ctx context.Context

	release func()
}

// Release gives the volume back; the session counts as used. It is
// idempotent.
func (l *Lend) Release() { l.release() }

// Lend lends the session's volume to the file API until Release. The
// session counts as used. Once a Delete began, ErrNotFound.
func (m *Manager) Lend(id string) (*Lend, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.lookupLocked(id)
	for err == nil {
		select {
		case <-s.durable:
		default:
			// A file written, listed or read is answered only once the
			// session is durable: a host crash never loses a session
			// whose file request was answered (syncCreated). Only right
			// after its Create: a few ms.
			m.mu.Unlock()
			<-s.durable
			m.mu.Lock()
			s, err = m.lookupLocked(id) // maybe deleted, even made again, meanwhile
			continue
		}
		break
	}
	if err != nil {
		return nil, err
	}
	s.lends++
	s.lent.Add(1)
	m.touchLocked(s)
	var once sync.Once
	return &Lend{Volume: s.ws.Volume(), Policy: s.rec.Policy, Runtime: s.rec.runtime(), Ctx: s.ctx, release: func() {
		once.Do(func() {
			m.mu.Lock()
			s.lends--
			m.touchLocked(s)
			m.mu.Unlock()
			s.lent.Done()
		})
	}}, nil
}

// Close stops every kernel (files kept), the janitor, and closes the
// volumes' handles (they stay mounted for the next worker).
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	var kernels []Kernel
	var all []*session
	for _, s := range m.sessions {
		all = append(all, s)
		if s.cancel != nil {
			s.cancel()
		}
		if s.ahead != nil && s.ahead.cancel != nil {
			s.ahead.cancel() // a start ahead ends now, not at its own timeout
		}
		if s.kernel != nil {
			kernels = append(kernels, s.kernel)
			s.kernel = nil
		}
	}
	m.mu.Unlock()
	close(m.stopJanitor)
	<-m.janitorDone
	var wg sync.WaitGroup
	for _, k := range kernels {
		wg.Go(k.Close)
	}
	wg.Wait()
	m.ops.Wait()
	m.closeSpares()
	for _, s := range all {
		s.active.Wait()
	}
	for _, s := range all {
		if err := m.flush(s, true); err != nil {
			m.log.Error("session's last use not saved", "session", s.id, "err", err)
		}
	}
	m.lock.Close()
}

// Stats for /metrics.
type Stats struct {
	Sessions, Busy, IdleKernels int
	IdleKernelBytes             int64
	// SpareKernels are the spares' live kernels (spares.go), of
	// SpareKernelsWanted (Config.SpareKernels).
	SpareKernels, SpareKernelsWanted int
	BytesOnDisk                      int64
	KernelStarts                     map[string]uint64 // by reason (state/reason)
}

// Stats is the manager's state. BytesOnDisk is what the sessions' files
// take of their quotas (the volumes' usage).
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	st := Stats{KernelStarts: make(map[string]uint64, len(m.starts)),
		SpareKernels: m.spareKernelsLocked(), SpareKernelsWanted: m.cfg.SpareKernels}
	for k, v := range m.starts {
		st.KernelStarts[k] = v
	}
	var idle []Kernel
	var wss []workspace
	for _, s := range m.sessions {
		if s.gone {
			continue
		}
		st.Sessions++
		if s.busy {
			st.Busy++
		}
		if !s.executing && !s.starting && s.kernel != nil && !ended(s.kernel) {
			idle = append(idle, s.kernel)
		}
		wss = append(wss, s.ws)
	}
	m.mu.Unlock()
	st.IdleKernels = len(idle)
	for _, k := range idle {
		st.IdleKernelBytes += k.MemoryBytes()
	}
	for _, ws := range wss {
		if u, err := ws.Usage(); err == nil {
			st.BytesOnDisk += u.Bytes
		}
	}
	return st
}

// flush writes s's record if it changed (and, unless force, was last
// written flushInterval ago or more).
func (m *Manager) flush(s *session, force bool) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	m.mu.Lock()
	now := m.cfg.Now()
	if s.gone || !s.dirty || (!force && now.Sub(s.written) < flushInterval) {
		m.mu.Unlock()
		return nil
	}
	rec := s.rec
	s.dirty, s.written = false, now
	m.mu.Unlock()
	if err := writeRecord(s.dir, rec); err != nil {
		m.mu.Lock()
		s.dirty = true
		m.mu.Unlock()
		return err
	}
	return nil
}

// Run is one execution reserved in a session.
type Run struct {
	m      *Manager
	s      *session
	execed bool // guarded by m.mu
	ended  bool
}

// Volume is the session's volume, for the request's files and artifacts.
func (r *Run) Volume() *volume.Volume { return r.s.ws.Volume() }

// Exec runs the execution in the session's kernel, starting one first
// when none runs (kernel: false: always a fresh one, closed after), and
// says what happened to the Python state. It may be called once per Run.
func (r *Run) Exec(ctx context.Context, e warmpool.KernelExec) (*warmpool.KernelResult, ExecInfo, error) {
	m, s := r.m, r.s
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.mu.Lock()
	var err error
	switch {
	case m.closed:
		err = ErrClosed
	case s.gone:
		err = ErrNotFound
	case r.ended || r.execed:
		err = errors.New("session run: Exec after End or a second Exec")
	}
	if err != nil {
		m.mu.Unlock()
		return nil, ExecInfo{ID: s.id}, err
	}
	r.execed = true
	s.cancel = cancel
	s.active.Add(1)
	m.mu.Unlock()
	defer s.active.Done()
	defer func() {
		m.mu.Lock()
		s.cancel, s.executing = nil, false
		if s.ahead == nil || s.ahead.done == nil { // else startAhead clears it
			s.starting = false
		}
		m.mu.Unlock()
	}()
	// At most twice: a kernel found alive may end before it gets the code
	// (ErrKernelEnded); then a new one runs it, saying why.
	for attempt := 0; ; attempt++ {
		k, info, err := r.kernel(ctx)
		if err != nil {
			return nil, info, err
		}
		res, err := k.Exec(ctx, e)
		if errors.Is(err, warmpool.ErrKernelEnded) && attempt == 0 {
			r.after(k, nil, cmp.Or(k.EndReason(), warmpool.EndExited))
			continue
		}
		info.KernelEnded = r.after(k, res, "")
		if err != nil {
			return nil, info, fmt.Errorf("session %s: %w", s.id, err)
		}
		return res, info, nil
	}
}

// kernel is the kernel the execution runs in: the session's live one
// (StatePreserved), else a new one, started here. On return the session's
// state says the code is running.
func (r *Run) kernel(ctx context.Context) (Kernel, ExecInfo, error) {
	m, s := r.m, r.s
	m.mu.Lock()
	// A kernel being started ahead (startAhead) is waited for: the code
	// runs in it, never in a second one; and, as in any kernel, only once
	// the session is on disk (syncCreated, which a kernel started ahead
	// may have overtaken).
	for s.ahead != nil && s.ahead.done != nil {
		if err := m.awaitLocked(ctx, s, s.ahead.done); err != nil {
			m.mu.Unlock()
			return nil, ExecInfo{ID: s.id}, err
		}
	}
	ahead := s.ahead
	s.ahead = nil
	if ahead != nil && ahead.kernel != nil {
		if err := m.awaitLocked(ctx, s, s.durable); err != nil {
			s.ahead = ahead // nothing ran: the next execution is its first
			m.mu.Unlock()
			return nil, ExecInfo{ID: s.id}, err
		}
	}
	if k := s.kernel; k != nil && ended(k) {
		s.kernel = nil
		s.setEndedLocked(k.EndReason())
		m.mu.Unlock()
		k.Close()
		m.mu.Lock()
	}
	if k := s.kernel; k != nil {
		s.executing = true
		info := ExecInfo{ID: s.id, KernelGeneration: s.rec.Generation, State: StatePreserved}
		if ahead != nil && ahead.kernel == k {
			// Started ahead: this is its first execution.
			info.State, info.Reason = ahead.info.State, ahead.info.Reason
		}
		m.mu.Unlock()
		return k, info, nil
	}
	info := s.next
	info.ID = s.id
	k, err := m.startKernelLocked(ctx, s)
	if err != nil {
		m.mu.Unlock()
		return nil, info, err
	}
	info.KernelGeneration = s.rec.Generation
	s.executing = true
	m.mu.Unlock()
	return k, info, nil
}

// startKernelLocked starts s's kernel and records the start (s.next says
// which kind it is); on success it is s.kernel. Called and returning with
// m.mu held, which it releases meanwhile.
func (m *Manager) startKernelLocked(ctx context.Context, s *session) (Kernel, error) {
	s.starting = true
	policy, runtime, path := s.rec.Policy, s.rec.runtime(), s.ws.Path()
	// The start is recorded on disk before the code runs, not coalesced:
	// a worker killed from then on must find the kernel started, so that
	// its successor says the Python state was lost (StateRestarted),
	// never "new" as if none had run. (Without a kernel, every execution
	// is new anyway.) Written while the kernel starts, not after it: the
	// fsyncs cost as much as a warm start. A start that fails takes the
	// generation back (rewritten at the next flush); a worker killed
	// meanwhile leaves a generation one ahead, whose successor says
	// restarted of a kernel that may not have started. A failed write
	// leaves the record dirty for the next flush.
	persist := s.rec.Kernel
	if persist {
		s.rec.Generation++
		s.dirty = true
	}
	// And no code runs before the session is durable (syncCreated,
	// which right after Create may still be syncing): waited for beside
	// the kernel's start too.
	saved := make(chan error, 1)
	go func() {
		<-s.durable
		if !persist {
			saved <- nil
			return
		}
		saved <- m.flush(s, true)
	}()
	m.mu.Unlock()

	k, err := m.starter.StartKernel(ctx, policy, runtime, path, warmpool.KernelOptions{})
	if saveErr := <-saved; saveErr != nil {
		m.log.Error("session's kernel start not saved", "session", s.id, "err", saveErr)
	}
	m.mu.Lock()
	s.starting = false
	if persist && (err != nil || s.gone || m.closed) {
		s.rec.Generation--
		s.dirty = true
	}
	if s.gone || m.closed {
		// Deleted or closed while the kernel started (which may have
		// failed for it: its context is cancelled): its volume is about to
		// go, or its kernels to stop; this one with it. The session's
		// error, not the start's.
		gone := s.gone
		m.mu.Unlock()
		if k != nil {
			k.Close()
		}
		m.mu.Lock()
		if gone {
			return nil, ErrNotFound
		}
		return nil, ErrClosed
	}
	if err != nil {
		return nil, fmt.Errorf("session %s: start kernel: %w", s.id, err)
	}
	if !persist {
		s.rec.Generation++
		s.dirty = true
	}
	m.starts[s.next.State+"/"+s.next.Reason]++
	s.kernel = k
	return k, nil
}

// awaitLocked waits, m.mu released, for ch or the end of ctx; then it is
// ErrNotFound or ErrClosed for a session deleted or a manager closed
// meanwhile, else ctx's error, else nil. Called and returning with m.mu
// held.
func (m *Manager) awaitLocked(ctx context.Context, s *session, ch <-chan struct{}) error {
	m.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
	m.mu.Lock()
	if err := m.goneLocked(s); err != nil {
		return err
	}
	return ctx.Err()
}

// goneLocked is ErrNotFound for a session being deleted, ErrClosed once
// the manager is closing, else nil.
func (m *Manager) goneLocked(s *session) error {
	switch {
	case s.gone:
		return ErrNotFound
	case m.closed:
		return ErrClosed
	}
	return nil
}

// aheadKernel is a new session's kernel started ahead of its first
// execution (startAhead): in flight while done is open, then the kernel
// (nil if none was started) and what its first execution says. A kernel
// adopted from a spare (Create) is one whose done and cancel are nil from
// the start.
type aheadKernel struct {
	done   chan struct{}
	cancel context.CancelFunc // ends the start (Delete, Close)
	kernel Kernel
	info   ExecInfo
}

// startAhead starts a new session's kernel as Create answers, so that its
// hand-off is done, or under way, when the first execution comes (issue
// 12: create + first print(1)). Only from a warm sandbox (WarmOnly): without
// one the first execution starts it, as it would have, under admission;
// this moves work the pool did already and never starts a cold sandbox
// outside max_concurrent (SECURITY.md case 61). Create counted the start
// in the record it wrote (generation 1, made durable with the session by
// syncCreated), so nothing is written here unless the start fails: then
// the generation is taken back (and written durably). The first
// execution waits for the start and, as in any kernel, runs its code only
// once the session is durable (Run.kernel).
func (m *Manager) startAhead(s *session, a *aheadKernel) {
	defer m.ops.Done()
	defer s.active.Done()
	m.mu.Lock()
	a.info = s.next
	policy, runtime, path := s.rec.Policy, s.rec.runtime(), s.ws.Path()
	var k Kernel
	err := ErrNotFound
	if !s.gone && !m.closed {
		ctx, cancel := context.WithCancel(s.ctx)
		a.cancel = cancel
		m.mu.Unlock()
		k, err = m.starter.StartKernel(ctx, policy, runtime, path, warmpool.KernelOptions{WarmOnly: true})
		m.mu.Lock()
		cancel()
	}
	if k != nil && (s.gone || m.closed) {
		// Deleted or closed meanwhile: this kernel with it.
		m.mu.Unlock()
		k.Close()
		m.mu.Lock()
		k, err = nil, ErrNotFound
	}
	if err == nil {
		m.starts[a.info.State+"/"+a.info.Reason]++
		s.kernel, a.kernel = k, k
	} else {
		s.rec.Generation--
		s.dirty = true
	}
	s.starting = false
	close(a.done)
	a.done = nil
	flush := err != nil && !s.gone && !m.closed
	m.mu.Unlock()
	if flush {
		// The generation taken back, on disk; a start the first execution
		// makes meanwhile writes its own (flush writes the record as it is
		// then, under writeMu).
		if ferr := m.flush(s, true); ferr != nil {
			m.log.Error("session's record not saved", "session", s.id, "err", ferr)
		}
	}
	if err != nil && !errors.Is(err, warmpool.ErrNoWarmSandbox) && !errors.Is(err, ErrNotFound) {
		m.log.Warn("session's kernel not started ahead; its first execution starts it", "session", s.id, "err", err)
	}
}

// after records what an execution in k left (res nil when nothing ran;
// why, when known to have ended): a kernel that ended, or any kernel of a
// kernel: false session, is closed and the next execution will say why.
// It returns why k ended, if it did.
func (r *Run) after(k Kernel, res *warmpool.KernelResult, why string) string {
	m, s := r.m, r.s
	if why == "" && res != nil {
		why = res.Ended
	}
	if why == "" && ended(k) {
		why = k.EndReason()
	}
	m.mu.Lock()
	s.executing = false
	mine := s.kernel == k // else Delete or Close took it and closes it
	closeIt := mine && (why != "" || !s.rec.Kernel)
	if closeIt {
		s.kernel = nil
		if s.rec.Kernel {
			s.setEndedLocked(why)
		} else {
			s.next = ExecInfo{State: StateNew, Reason: ReasonNoKernel}
			s.endReason = cmp.Or(why, warmpool.EndClosed)
		}
	}
	m.mu.Unlock()
	if closeIt {
		k.Close()
	}
	return why
}

// setEndedLocked records that the session's kernel ended (why): the next
// execution starts a new one and says so.
func (s *session) setEndedLocked(why string) {
	s.endReason = why
	s.next = ExecInfo{State: StateNew, Reason: why}
}

// End releases the session for its next execution. It is idempotent.
func (r *Run) End() {
	m := r.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	r.s.busy = false
	m.touchLocked(r.s)
}
