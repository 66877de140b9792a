package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/volume"
)

// On disk, sessions_dir holds one directory per session, named by its id:
//
//	<root>/<id>/session.json   the record (this file), written last at Create
//	<root>/<id>/volume/        the workspace (package volume's directory)
//
// A session directory without session.json is a half-created or
// half-deleted session (Create writes the record last, Delete removes it
// first) and Open removes it.
const (
	recordName   = "session.json"
	recordTmp    = ".session.json.tmp-" // + random: an interrupted write
	volumeName   = "volume"
	recordFormat = 1
	// maxRecordBytes bounds the read of a session.json: it is a few hundred
	// bytes; anything bigger is not ours (SECURITY.md case 42).
	maxRecordBytes = 64 << 10
	maxPolicyLen   = 256
)

// record is session.json: what a restarted worker needs of a session.
type record struct {
	Format        int       `json:"format"`
	ID            string    `json:"id"`
	Policy        string    `json:"policy"`
	Runtime       string    `json:"runtime,omitempty"` // none, from before runtimes: the default (runtime())
	Kernel        bool      `json:"kernel"`
	IdleTimeoutMS int64     `json:"idle_timeout_ms"`
	CreatedAt     time.Time `json:"created_at"`
	LastUsedAt    time.Time `json:"last_used_at"`
	// Generation is the number of kernels started so far, so that a
	// restarted worker's next kernel gets a new number. Written with
	// last_used_at (coalesced): after a host crash it may repeat one.
	Generation int64 `json:"generation"`
}

// runtime is the session's runtime: the default one for a record written
// before runtimes existed.
func (r record) runtime() string {
	if r.Runtime == "" {
		return config.DefaultRuntime
	}
	return r.Runtime
}

func (r record) idleTimeout() time.Duration { return time.Duration(r.IdleTimeoutMS) * time.Millisecond }

// check validates a record read from dir (named name): nothing in it is
// trusted before this (SECURITY.md case 42).
func (r record) check(name string) error {
	var errs []error
	if r.Format != recordFormat {
		errs = append(errs, fmt.Errorf("format %d, want %d", r.Format, recordFormat))
	}
	if r.ID != name || !inside.ValidID(r.ID) {
		errs = append(errs, fmt.Errorf("id %q does not name its directory %q", r.ID, name))
	}
	if err := checkPolicyName(r.Policy); err != nil {
		errs = append(errs, err)
	}
	if err := checkRuntimeName(r.Runtime); r.Runtime != "" && err != nil {
		errs = append(errs, err)
	}
	if r.IdleTimeoutMS <= 0 {
		errs = append(errs, fmt.Errorf("idle_timeout_ms must be > 0, got: %d", r.IdleTimeoutMS))
	}
	if r.CreatedAt.IsZero() || r.LastUsedAt.IsZero() {
		errs = append(errs, errors.New("created_at and last_used_at are required"))
	}
	if r.Generation < 0 {
		errs = append(errs, fmt.Errorf("generation must be >= 0, got: %d", r.Generation))
	}
	return errors.Join(errs...)
}

func checkPolicyName(p string) error {
	if p == "" || len(p) > maxPolicyLen || strings.IndexFunc(p, func(r rune) bool { return !unicode.IsPrint(r) || r == '/' }) >= 0 {
		return fmt.Errorf("policy must be a printable name of 1 to %d bytes without '/', got: %q", maxPolicyLen, p)
	}
	return nil
}

// checkRuntimeName: a record's runtime is a name by the config's rule,
// looked up in the config by the server, so never a path or an image
// reference (SECURITY.md case 57).
func checkRuntimeName(r string) error {
	if !config.ValidRuntimeName(r) {
		return fmt.Errorf("runtime must match %s, got: %.64q", config.RuntimeNameRule, r)
	}
	return nil
}

// writeRecord replaces dir/session.json atomically and durably: a temporary
// file, fsync, rename, fsync of dir. A crash leaves the old record or the
// new one, and at worst a temporary file that the next write or Open's
// sweep removes.
func writeRecord(dir string, r record) error { return putRecord(dir, r, true) }

// writeNewRecord writes the first session.json in dir (Create) as
// writeRecord does, but without the fsyncs: the record is in the page
// cache when it returns, so it survives the worker's death (kill -9, OOM
// kill), never half-written (a temporary file renamed), but not yet a host
// crash: syncNewRecord makes it durable. A host crash before that leaves no
// session.json, or an empty one (the rename reached the disk, the data
// not yet), which classify takes for the half-made session it is.
func writeNewRecord(dir string, r record) error { return putRecord(dir, r, false) }

// syncNewRecord makes what writeNewRecord wrote, and the session
// directory's other entries, durable: the record's data, dir's entries
// (the record, the volume moved in) and dir's own entry in its parent.
// The three fsyncs run at once: everything they cover was written before,
// so each still guarantees what it does alone, and on a journaling file
// system they wait for one commit instead of a commit and two more cache
// flushes in a row (ext4 on this VM: 1.5-1.6 ms instead of 2.1-2.3, the
// median of 40 each). The first execution of a new session waits for it
// (Run.kernel).
func syncNewRecord(dir string) error {
	record := func() error {
		f, err := os.OpenFile(filepath.Join(dir, recordName), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return errors.Join(f.Sync(), f.Close())
	}
	var wg sync.WaitGroup
	var errDir, errParent error
	wg.Go(func() { errDir = volume.SyncDir(dir) })
	wg.Go(func() { errParent = volume.SyncDir(filepath.Dir(dir)) })
	err := record()
	wg.Wait()
	return errors.Join(err, errDir, errParent)
}

func putRecord(dir string, r record, durable bool) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, recordTmp+volume.RandomHex(6))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", recordName, err)
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil && durable {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err == nil {
		err = os.Rename(tmp, filepath.Join(dir, recordName))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s in %s: %w", recordName, dir, err)
	}
	if !durable {
		return nil
	}
	if err := volume.SyncDir(dir); err != nil {
		return fmt.Errorf("write %s in %s: %w", recordName, dir, err)
	}
	return nil
}

// readRecord reads and checks dir/session.json, never following a link nor
// blocking on a FIFO, and bounded in size (SECURITY.md case 42).
// fs.ErrNotExist when there is none.
func readRecord(dir, name string) (record, error) {
	var r record
	f, err := os.OpenFile(filepath.Join(dir, recordName), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = fmt.Errorf("%s is a symbolic link", recordName)
		}
		return r, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return r, err
	} else if !fi.Mode().IsRegular() {
		return r, fmt.Errorf("%s is not a regular file (%s)", recordName, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRecordBytes+1))
	if err != nil {
		return r, err
	}
	if len(data) > maxRecordBytes {
		return r, fmt.Errorf("%s is bigger than %d bytes", recordName, maxRecordBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("%s: %w", recordName, err)
	}
	if dec.More() {
		return r, fmt.Errorf("%s: data after the object", recordName)
	}
	if err := r.check(name); err != nil {
		return r, fmt.Errorf("%s: %w", recordName, err)
	}
	return r, nil
}

// prepareRoot makes sure the sessions directory exists, is a real
// directory (not a link), owned by the worker's user and writable by no
// one else, and searchable by all: the sandbox's mapped root binds a
// volume by its path (package volume, Create). It is made 0755 if missing.
func prepareRoot(root string) error {
	if !filepath.IsAbs(root) {
		return fmt.Errorf("sessions dir must be absolute, got: %q", root)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("sessions dir: %w", err)
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("sessions dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("sessions dir %s is not a directory (%s)", root, fi.Mode().Type())
	}
	if err := checkOwned(root, fi); err != nil {
		return fmt.Errorf("sessions dir: %w", err)
	}
	if fi.Mode().Perm() != 0o755 {
		if err := os.Chmod(root, 0o755); err != nil {
			return fmt.Errorf("sessions dir: %w", err)
		}
	}
	return nil
}

// checkOwned refuses what the worker's user does not own or what others
// may write: such an entry is not the manager's to trust or to delete.
func checkOwned(p string, fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner information", p)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by the worker (uid %d)", p, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others (mode %o)", p, fi.Mode().Perm())
	}
	return nil
}

// entryKind is what Open makes of an entry of the sessions directory.
type entryKind int

const (
	entrySession  entryKind = iota // a session directory with its record
	entryLeftover                  // ours, half-created or half-deleted: remove it
	entryForeign                   // not ours: log it, never touch it
)

// classify looks at the entry name of root (after its volume leftovers
// were swept). Only a directory named by a valid id, owned by the worker,
// holding nothing but what the manager puts there, is ours; a leftover is
// such a directory without session.json (SECURITY.md case 42).
//
// A spare volume's directory (spares.go) is classified as a session's is,
// except that it must not hold a session.json: ours, it is a leftover.
func classify(root, name string) (entryKind, error) {
	spare := isSpareName(name)
	if !spare && !inside.ValidID(name) {
		return entryForeign, fmt.Errorf("%q is not a session id", name)
	}
	p := filepath.Join(root, name)
	fi, err := os.Lstat(p)
	if err != nil {
		return entryForeign, err
	}
	if !fi.IsDir() {
		return entryForeign, fmt.Errorf("%s is not a directory (%s)", p, fi.Mode().Type())
	}
	if err := checkOwned(p, fi); err != nil {
		return entryForeign, err
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return entryForeign, err
	}
	hasRecord := false
	for _, e := range entries {
		switch n := e.Name(); {
		case n == recordName:
			// An empty record is what a host crash leaves of a Create whose
			// record had not been synced yet (writeNewRecord): a half-made
			// session, of which nothing but its 201 was answered (its code
			// runs, and its file requests are answered, only once the
			// record is durable). writeRecord never leaves one: its data is
			// synced before its rename.
			hasRecord = !e.Type().IsRegular() || !isEmptyFile(filepath.Join(p, n))
		case n == volumeName, strings.HasPrefix(n, recordTmp),
			// An interrupted volume.Create or volume.Remove (volume.Sweep).
			strings.HasPrefix(n, ".creating-"+volumeName+"-"), strings.HasPrefix(n, ".removing-"+volumeName+"-"):
		default:
			return entryForeign, fmt.Errorf("%s holds %q, which the session manager never makes", p, n)
		}
	}
	switch {
	case spare && hasRecord:
		return entryForeign, fmt.Errorf("%s holds a %s, which a spare volume's directory never does", p, recordName)
	case !hasRecord:
		return entryLeftover, nil
	}
	return entrySession, nil
}

// removeTmpRecords removes interrupted writes of session.json in dir.
func removeTmpRecords(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), recordTmp) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// lockRoot takes an exclusive flock on the sessions directory for the
// manager's lifetime: two workers on one sessions_dir would sweep each
// other's sessions being created and mount one image twice.
func lockRoot(root string) (*os.File, error) {
	f, err := os.OpenFile(root, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("sessions dir %s is in use by another worker", root)
		}
		return nil, fmt.Errorf("lock sessions dir %s: %w", root, err)
	}
	return f, nil
}

// isEmptyFile says whether p is a regular file of size 0 (not following a
// link).
func isEmptyFile(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Size() == 0
}
