package nsjail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"golang.org/x/sys/unix"
)

// A template (issue 17, server/warmpool/TEMPLATE.md sections 2-5) is a
// sandbox whose process imports the data stack once and forks, per
// execution, G, the code's process, cloned into a new user and pid
// namespace of the execution's own; a shell (shell.go) then gives G the rest
// of a cold sandbox. This file starts the template's sandbox.

// templateCaps are the only capabilities the template's process holds, in
// its own user namespace U_T only: CAP_SETUID and CAP_SETGID to write each
// fork's id maps. No CAP_SETFCAP: the kernel asks for it (Linux 5.12+,
// verify_root_map) only for a map with an extent onto uid 0 of the parent
// namespace, and ForkIDMap maps onto HostIDBase and HostIDBase+inside.UID
// of U_T, never onto U_T's 0; one capability less for a compromised
// template to use (it would let T give files capabilities that count in
// U_T). None of them reaches the host's namespaces or a cold sandbox's:
// U_T is a child of the host's, and a cold sandbox's user namespace is not
// U_T's descendant.
//
// These two are not the limit of T's power: T is in the parent of every
// fork's user namespace U_F and its euid owns each (T made U_F with its
// creds), and the kernel (cap_capable) gives such a process every
// capability in that namespace and in every namespace it owns (PID_F,
// each shell's mount, net, ipc, uts and cgroup namespaces). T could ptrace,
// signal or join any fork of its own as far as its seccomp filter allows:
// hence the template seccomp profile (StartTemplate; SECURITY.md case 63),
// which denies ptrace, process_vm_* and pidfd_getfd as the execution
// profile does, and allows setns only into the five namespace types G
// joins (never a user or pid namespace).
var templateCaps = []string{"CAP_SETUID", "CAP_SETGID"}

// templateOOMScoreAdj keeps the kernel's OOM killer off the template
// (TEMPLATE.md section 4): it is pid 1 of the pid namespace every fork's
// lives in, so its death kills every execution made from it. Lowering it
// needs CAP_SYS_RESOURCE in the host's user namespace. It is written by the
// worker once the template's process runs, not through
// configs.Config.OomScoreAdj: libcontainer's nsexec writes that with the
// worker's privileges too, but fails the whole start when the worker lacks
// the capability (some container runtimes drop it; the development VM's
// root has it dropped), where a template without the protection still
// works. Every fork inherits the value, and its oom_score_adj_min with it:
// StartShell resets G's (resetOOMScoreAdj).
const templateOOMScoreAdj = -1000

// templateLeaf is the template's own cgroup on v2, a child of tpl-<id>.
const templateLeaf = "template"

// Template is a started template sandbox. Stop must be called on it.
type Template struct {
	s *Sandbox
	// cgroupRel is the template's cgroup, relative to the worker's own in
	// every hierarchy (<parent>/tpl-<id>): each shell's is its child.
	cgroupRel string
	// userNS and pidNS are the template's user and pid namespaces (U_T,
	// PID_T), opened while its process was our unreaped child. Held for the
	// template's life, so their inode numbers name them (an inode number is
	// not reused while a file holds it): a fork's namespaces must be their
	// children (StartShell).
	userNS, pidNS *os.File
	// nsMu guards the two against Stop's close (nsClosed).
	nsMu     sync.RWMutex
	nsClosed bool
	// dirV2 is tpl-<id>'s absolute directory on cgroup v2 (T is in its
	// leaf templateLeaf, each shell's cgroup is its child), "" on v1.
	dirV2 string
	// prepared are the shells' cgroups PrepareShell made (v2), by id,
	// until their Close.
	preparedMu sync.Mutex
	prepared   map[string]*PreparedShell
	// forksInFlight counts the prepared shells whose fork is not done
	// (PreparedShell.EndFork): tpl-<id>'s cgroup.procs is the template
	// root's only while it is not 0.
	forksInFlight int
	// chownBackFailed: tpl-<id>'s cgroup.procs could not be given back to
	// root after a fork; PrepareShell refuses every later fork.
	chownBackFailed bool
	// claimed are the host pids of the Gs a shell has taken, from
	// StartShell's check that G is a fork until MoveG placed G, the
	// shell's Destroy or the start's failure (claimG). Under preparedMu.
	claimed map[int]bool
	// seccompFilters is how many seccomp filters T holds (read at its
	// start).
	seccompFilters int
	// shells counts the shells StartShell made for it that Destroy has not
	// ended yet (WaitShells).
	shells sync.WaitGroup
	// weight is tpl-<id>'s CPU weight file (nil once stopped), fg how
	// many hold its foreground weight (HoldForeground), weightBackground
	// the weight last written and weightOK whether that write worked.
	// Under fgMu.
	fgMu             sync.Mutex
	fg               int
	weight           *cgroup.CPUWeight
	weightOK         bool
	weightBackground bool
	stopOnce         sync.Once
	result           *Result
}

// StartTemplate starts a template sandbox: spec's command runs as root of
// its own user namespace U_T, whose root is host uid HostIDBase+1 (no
// sandbox's) and in which the sandbox's two host ids, HostIDBase and
// HostIDBase+inside.UID, map to themselves, so that the user namespace each
// fork makes can map 0 and inside.UID onto them (ForkIDMap) and reads, from
// inside, as a cold sandbox's. Its capabilities are CAP_SETUID and
// CAP_SETGID in U_T only; no_new_privs; oom_score_adj -1000; its own
// pid, mount (the read-only rootfs, no workspace: spec.Workspace must be
// empty), net (loopback), ipc, uts and cgroup namespaces, as buildConfig
// makes them; its cgroup is tpl-<id> under the Runner's cgroup parent,
// with the devices rules of every sandbox but no memory, pids or CPU limit
// of its own (a limit there would count every fork: an OOM kill in it could
// hit the template and with it every fork, TEMPLATE.md section 4; the
// worker's own cgroup bounds the whole). Each shell's cgroup is a child of
// tpl-<id> with the execution's limits. spec.Limits' rlimits and tmpfs
// sizes apply; its timeout does not (a template lives until Stop).
//
// On cgroup v2 the template's process is in the leaf tpl-<id>/template
// and keeps the worker's cgroup namespace; each shell's cgroup is made by
// PrepareShell before its fork, and G is forked into it (TEMPLATE.md
// section 4).
//
// Seccomp: the Runner's template filter (Options.TemplateSeccomp: the
// execution profile plus exactly the namespace, id, keyring and seccomp
// calls T and G make for a fork before G's drop, TEMPLATE.md section 6), loaded by
// libcontainer just before the command's execve, as a sandbox's. Every
// fork inherits it and G loads the execution filter over it, so a fork's
// effective policy is the execution filter's (SECURITY.md case 63). A
// Runner with its own execution filter and no template filter refuses.
//
// files are passed to the command as fds FirstFileFD, ... (its control
// socket). Errors are Start's.
func (r *Runner) StartTemplate(spec Spec, files ...*os.File) (*Template, error) {
	if spec.Workspace != "" {
		// The template's memory is every fork's (copy-on-write): nothing
		// of any execution, a workspace included, may ever be in it.
		return nil, errors.New("a template gets no workspace")
	}
	if spec.Background {
		// tpl-<id>'s weight is HoldForeground's; T's own leaf (v2) at the
		// background weight would slow T's part of every fork.
		return nil, errors.New("a template does not start in the background (Spec.Background): its weight is HoldForeground's")
	}
	if len(spec.ExtraFiles) > 0 {
		return nil, errors.New("a template takes its files as StartTemplate's arguments, not Spec.ExtraFiles")
	}
	v2 := cgroup.DetectMode().V2()
	if r.opts.TemplateSeccomp == nil {
		return nil, errors.New("this Runner has an execution seccomp filter of its own (Options.Seccomp) and no template filter " +
			"(Options.TemplateSeccomp), which must allow everything the execution filter does (SECURITY.md case 63)")
	}
	if spec.ID == "" {
		spec.ID = "tpl-" + newID()[len("sbx-"):]
	}
	base := int64(r.opts.HostIDBase)
	ids := []configs.IDMap{
		{ContainerID: 0, HostID: base + 1, Size: 1},
		{ContainerID: base, HostID: base, Size: 1},
		{ContainerID: base + inside.UID, HostID: base + inside.UID, Size: 1},
	}
	gids := []configs.IDMap{
		{ContainerID: 0, HostID: base + 1, Size: 1},
		{ContainerID: base, HostID: base, Size: 1},
		{ContainerID: base + inside.GID, HostID: base + inside.GID, Size: 1},
	}
	var cgroupRel string
	tune := func(cfg *configs.Config) {
		cfg.UIDMappings, cfg.GIDMappings = ids, gids
		cfg.Capabilities = &configs.Capabilities{Bounding: templateCaps, Effective: templateCaps, Permitted: templateCaps}
		cfg.Seccomp = r.opts.TemplateSeccomp
		res := cfg.Cgroups.Resources
		res.Memory, res.MemorySwap, res.PidsLimit, res.CpuQuota, res.CpuPeriod = 0, 0, nil, 0, 0
		cgroupRel = cfg.Cgroups.Path
		if v2 {
			// v2 (TEMPLATE.md section 4): no internal processes, so T
			// lives in the leaf tpl-<id>/template and each shell's cgroup
			// is its sibling, tpl-<id>/sbx-<id> (libcontainer creates
			// tpl-<id> and enables every controller in its
			// subtree_control). T clones G straight into the shell's
			// cgroup (clone3 CLONE_INTO_CGROUP), which the kernel allows
			// only when both cgroups are below the root of T's cgroup
			// namespace (nsdelegate; experiment E7: ENOENT otherwise):
			// the template gets no cgroup namespace of its own, it keeps
			// the worker's (T sees its cgroup's path from there; a fork's
			// G joins its shell's cgroup namespace, as a cold process is
			// in its own).
			cfg.Cgroups.Path = path.Join(cgroupRel, templateLeaf)
			cfg.Namespaces = slices.DeleteFunc(cfg.Namespaces, func(n configs.Namespace) bool { return n.Type == configs.NEWCGROUP })
		}
	}
	s, err := r.startWith(spec, startOptions{extraFiles: files, tune: tune, asRoot: true, v2ParentGoes: v2})
	if err != nil {
		return nil, err
	}
	t := &Template{s: s, cgroupRel: cgroupRel}
	if v2 {
		if dir, ok := s.cgroupPaths.V2(); ok && filepath.Base(dir) == templateLeaf {
			// tpl-<id> goes with the template's sandbox, after its leaf
			// and its shells' cgroups (cgroupAlso, v2ParentGoes; Stop).
			t.dirV2 = filepath.Dir(dir)
		} else {
			t.Stop(0)
			err := fmt.Errorf("the template's cgroup %v is not a leaf %s", s.cgroupPaths, templateLeaf)
			return nil, &StartError{ID: spec.ID, At: time.Now(), Err: err}
		}
	}
	// The template's process is our child and not reaped before Stop: its
	// pid is its own, so are the namespaces opened through it.
	pid, err := s.proc.Pid()
	if err == nil {
		t.userNS, err = os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	}
	if err == nil {
		t.pidNS, err = os.Open(fmt.Sprintf("/proc/%d/ns/pid", pid))
	}
	if err == nil {
		// The filters T holds (its template profile's), which every fork
		// inherits: a confined G holds one more (Shell.CheckConfined).
		var b []byte
		if b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			if v := statusField(string(b), "Seccomp_filters"); len(v) == 1 {
				t.seccompFilters, err = strconv.Atoi(v[0])
			} else {
				err = fmt.Errorf("no Seccomp_filters in its status (%v)", v)
			}
		}
	}
	// On v2, CLONE_INTO_CGROUP checks the cloning process's (T's) write
	// access to cgroup.procs of the common ancestor of its cgroup and the
	// destination (cgroup_attach_permissions, E7: EACCES otherwise):
	// tpl-<id>'s and the shell's are handed to the template's host root,
	// HostIDBase+1 (what T's credentials are on the host), only while a
	// fork is in flight (PrepareShell, PreparedShell.EndFork). T reaches
	// neither file by any path (no cgroupfs in its mount namespace): only
	// through the detached mount of a shell's cgroup PrepareShell gives
	// it, which has no ".." to tpl-<id> (SECURITY.md case 70).
	if err == nil {
		err = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(templateOOMScoreAdj)), 0)
		if errors.Is(err, os.ErrPermission) {
			// A worker without CAP_SYS_RESOURCE (a container that drops
			// it) cannot lower it; the template then runs unprotected.
			s.log.Warn("unable to protect the template from the OOM killer (no CAP_SYS_RESOURCE?)", "error", err)
			err = nil
		}
	}
	if err == nil {
		// tpl-<id>, which holds T and every fork's cgroup, weighs as a
		// background sandbox while nothing holds its foreground weight
		// (HoldForeground): a template started ahead of its rotation
		// imports, and the pool's refills get their shells ready, taking
		// little CPU from executions that want it.
		paths := t.s.cgroupPaths // v1: tpl-<id> is T's own
		if t.dirV2 != "" {
			paths = cgroup.Paths{"": t.dirV2}
		}
		if t.weight, err = cgroup.OpenCPUWeight(paths); err == nil {
			t.fgMu.Lock()
			t.applyWeightLocked()
			if !t.weightOK {
				err = errors.New("unable to give tpl-<id> the background CPU weight")
			}
			t.fgMu.Unlock()
		}
	}
	if err != nil {
		t.Stop(0)
		return nil, &StartError{ID: spec.ID, At: time.Now(), Err: fmt.Errorf("unable to prepare the template's process: %w", err)}
	}
	return t, nil
}

// HoldForeground gives tpl-<id> the foreground CPU weight until release
// is called, as many holds at once as there are: a fork serving an
// execution (from its hand-off to its result, but for the time it is
// frozen, a session's idle kernel), a fork made for a request, and the
// pool's fork lock weigh against other sandboxes as a cold sandbox does.
// All the forks served share one weight, not one each: where cold
// executions compete with them, they get less CPU than as many cold ones
// would. release may be called more than once.
func (t *Template) HoldForeground() (release func()) {
	t.fgMu.Lock()
	defer t.fgMu.Unlock()
	t.fg++
	t.applyWeightLocked()
	return sync.OnceFunc(func() {
		t.fgMu.Lock()
		defer t.fgMu.Unlock()
		t.fg--
		t.applyWeightLocked()
	})
}

// applyWeightLocked writes tpl-<id>'s CPU weight when it is not what the
// holds want (a write that failed is tried again at the next hold or
// release); under fgMu.
func (t *Template) applyWeightLocked() {
	background := t.fg == 0
	if t.weight == nil || (t.weightOK && t.weightBackground == background) {
		return // stopped, or written already
	}
	err := t.weight.Set(background)
	t.weightOK, t.weightBackground = err == nil, background
	if err != nil {
		t.s.log.Error("unable to set the template's CPU weight", "background", background, "error", err)
	}
}

// ID is the template's id (tpl-<hex> unless the spec named it).
func (t *Template) ID() string { return t.s.id }

// Pid is the host pid of the template's process. It stays that process's
// until Stop has reaped it.
func (t *Template) Pid() (int, error) { return t.s.proc.Pid() }

// CgroupPaths are the template's cgroup directories, one per hierarchy:
// tpl-<id> on v1, where each shell's cgroup is a child of them; on v2 the
// leaf tpl-<id>/template, each shell's cgroup its sibling.
func (t *Template) CgroupPaths() cgroup.Paths { return t.s.cgroupPaths }

// ForkIDMap is what the template writes to each fork's uid_map and
// gid_map, in U_T's ids: uid (gid) 0 and inside.UID (inside.GID) of the
// fork's user namespace on the host ids a cold sandbox's map them to
// (HostIDBase and HostIDBase+inside.UID, mapped to themselves in U_T).
// StartShell refuses a fork whose maps, as the host sees them, are
// anything else.
func (t *Template) ForkIDMap() (uidMap, gidMap string) {
	base := t.s.r.opts.HostIDBase
	return fmt.Sprintf("0 %d 1\n%d %d 1\n", base, inside.UID, base+inside.UID),
		fmt.Sprintf("0 %d 1\n%d %d 1\n", base, inside.GID, base+inside.GID)
}

// Stop ends the template: it gives its process grace to exit on its own
// (the caller has told it to), then kills it, which kills every process of
// its pid namespace, every fork included; it returns its result (what it
// wrote) and removes its sandbox and cgroup, as Wait does. Destroy the
// template's shells first: their containers are the caller's. Stop is
// idempotent.
//
// A StartShell concurrent with or after Stop fails: Stop closes the
// template's namespace fds under nsMu, which StartShell's parentage
// checks (isChildNamespace) hold for reading, so that they never read
// fd numbers that may by then name another file, another template's
// namespace included, and accept a fork of another template.
func (t *Template) Stop(grace time.Duration) *Result {
	t.stopOnce.Do(func() {
		t.s.lim.Timeout = max(grace, time.Nanosecond)
		t.s.noDeadline = false
		// Wait's removal of the sandbox, in the background, takes
		// tpl-<id> on v2 too (cgroupAlso), after the leaf and before the
		// owner marker, so that a tpl-<id> that stays (a shell's cgroup
		// still in it) keeps the marker for Sweep.
		t.fgMu.Lock()
		if t.weight != nil {
			t.weight.Close()
			t.weight = nil
		}
		t.fgMu.Unlock()
		t.result = t.s.Wait(context.Background())
		t.nsMu.Lock()
		t.nsClosed = true
		for _, f := range []*os.File{t.userNS, t.pidNS} {
			if f != nil {
				f.Close()
			}
		}
		t.nsMu.Unlock()
	})
	return t.result
}

// WaitShells returns once every shell made for the template has been
// destroyed: its forks are then over, and Stop kills none that serves an
// execution. No StartShell may begin while it waits (the caller has
// stopped asking the template for forks).
func (t *Template) WaitShells() { t.shells.Wait() }

// claimG marks G's host pid as taken by a shell; false if a shell took it
// already. SECURITY.md case 65: forks of a template are made ready side
// by side (the pool's fork lock covers only the template's part), so
// several Gs can be unplaced forks at once, and a template answering one
// fork request with the pidfd of another request's G would otherwise get
// that G two shells: a second runc init joining its namespaces (which G,
// root there before its drop, could stop, leaving it in the pid namespace
// of an execution: case 66) and two moves. The pid is G's while it is
// claimed until MoveG placed it (T does not reap G before the worker's
// go-ahead, which comes after MoveG); a G that dies and is reaped early
// (a hostile template), or whose shell fails before MoveG, can at worst
// get a later fork with its pid refused (and the template retired), never
// a second shell.
func (t *Template) claimG(pid int) bool {
	t.preparedMu.Lock()
	defer t.preparedMu.Unlock()
	if t.claimed[pid] {
		return false
	}
	if t.claimed == nil {
		t.claimed = map[int]bool{}
	}
	t.claimed[pid] = true
	return true
}

// unclaimG ends claimG's mark.
func (t *Template) unclaimG(pid int) {
	t.preparedMu.Lock()
	defer t.preparedMu.Unlock()
	delete(t.claimed, pid)
}

// nsID identifies a namespace: the device and inode of its nsfs file.
type nsID struct{ dev, ino uint64 }

func nsIDOf(fd int) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nsID{}, err
	}
	return nsID{uint64(st.Dev), st.Ino}, nil
}
