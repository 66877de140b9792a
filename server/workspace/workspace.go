// Package workspace is an execution's host directory, bound at /workspace
// inside its sandbox: a tmpfs of its own (Create), or a warm sandbox's
// (CreateWarm), with the request written in (code, input, files: Write),
// read back after the run without trusting anything
// the code left there (result.json, artifacts), and removed, or swept at
// start-up when a killed worker left it. The layout is package inside's.
package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"golang.org/x/sys/unix"
)

// ColdPrefix names every execution's workspace directory, so the orphan
// sweep removes only what sandboxd created even if the work root is shared;
// WarmPrefix names the warm pool's (see CreateWarm).
const (
	ColdPrefix = "exec-"
	WarmPrefix = "warm-"
)

// ErrFull is returned when the work root has no space (or inodes) left; the
// API answers 507 and keeps serving.
var ErrFull = errors.New("work root is full")

// Options size and own a workspace.
type Options struct {
	// Bytes and Inodes size the workspace's tmpfs (see Mount).
	Bytes, Inodes int64
	// UID and GID are the sandbox user as the host sees it: the workspace
	// is theirs, so the code can read it and write output/.
	UID, GID int
}

// Request is what an execution's workspace holds before it runs.
type Request struct {
	// Code becomes inside.CodeFile.
	Code string
	// Input, when not nil, becomes inside.RequestFile.
	Input []byte
	// Files go under inside.InputDir; their paths are validated already.
	Files []File
}

// File is one request file: Path is relative to inside.InputDir.
type File struct {
	Path string
	Data []byte
}

// Workspace is one execution's host directory, bound at /workspace.
type Workspace struct {
	Dir string
}

// Create makes a fresh workspace under root for the run named run, mounts
// a tmpfs sized by o on it (see Mount) and writes the request in (Write),
// so the sandbox user can read it and write output/.
func Create(root, run string, o Options, req Request) (ws *Workspace, err error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, wrapSpace(fmt.Errorf("work root: %w", err))
	}
	dir, err := os.MkdirTemp(root, ColdPrefix+run+"-")
	if err != nil {
		return nil, wrapSpace(fmt.Errorf("create workspace: %w", err))
	}
	ws = &Workspace{Dir: dir}
	defer func() {
		if err != nil {
			ws.Remove()
			ws = nil
		}
	}()
	if err := Mount(dir, o); err != nil {
		return ws, err
	}
	if err := Write(dir, o, req); err != nil {
		return ws, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return ws, fmt.Errorf("chmod workspace: %w", err)
	}
	return ws, nil
}

// Write writes req into dir, a workspace without the layout yet (Create's,
// or a warm sandbox's before its hand-off), in the layout of package
// inside, and hands what it wrote to o.UID and o.GID. A warm sandbox's
// process is alive while it writes, and owns dir: had its template been
// compromised, it could plant links, FIFOs or renames in dir at any moment
// (SECURITY.md case 73). So everything goes through an os.Root of dir (no
// name resolves outside it, whatever a concurrent rename makes of a path),
// every layout directory and file is created anew (Mkdir, O_EXCL: an
// existing name, a FIFO among them, is an error, never opened), and the
// hand-over walks and chowns through the root too.
func Write(dir string, o Options, req Request) error {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open workspace: %w", err)
	}
	defer r.Close()
	for _, d := range inside.LayoutDirs {
		if err := r.Mkdir(d, 0o755); err != nil {
			return wrapSpace(fmt.Errorf("create workspace: %w", err))
		}
	}
	if err := createFile(r, inside.CodeFile, []byte(req.Code)); err != nil {
		return wrapSpace(fmt.Errorf("write code: %w", err))
	}
	if req.Input != nil {
		if err := createFile(r, inside.RequestFile, req.Input); err != nil {
			return wrapSpace(fmt.Errorf("write input: %w", err))
		}
	}
	for _, f := range req.Files {
		p := inside.InputDir + "/" + f.Path
		if err := r.MkdirAll(path.Dir(p), 0o755); err != nil {
			return wrapSpace(fmt.Errorf("write file %s: %w", f.Path, err))
		}
		if err := createFile(r, p, f.Data); err != nil {
			return wrapSpace(fmt.Errorf("write file %s: %w", f.Path, err))
		}
	}
	// Through the root: a path walked by name could be renamed into a
	// link to the host's / between the listing and the chown (the attack
	// case 73's test races), and Lchown follows links in every component
	// but the last.
	err = fs.WalkDir(r.FS(), ".", func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return r.Lchown(p, o.UID, o.GID)
	})
	if err != nil {
		return fmt.Errorf("chown workspace: %w", err)
	}
	return nil
}

// createFile creates name in r, which must not exist (O_EXCL: no link, no
// FIFO or device planted there is ever opened), and writes data.
func createFile(r *os.Root, name string, data []byte) error {
	f, err := r.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

// CreateWarm makes an empty workspace under root for a warm sandbox, which
// an execution's request is written into later (Write): a tmpfs sized by
// o, made a shared mount (a kernel's volume is bound on it later), or, when
// o.Bytes is 0, a plain directory (tests: no volume can be bound on it).
func CreateWarm(root string, o Options) (string, error) {
	dir, err := os.MkdirTemp(root, WarmPrefix)
	if err != nil {
		return "", err
	}
	if err := os.Chown(dir, o.UID, o.GID); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	if o.Bytes > 0 {
		if err := Mount(dir, o); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		// Shared, so that a session's volume bound on dir later (see
		// server/warmpool's kernels) propagates into the sandbox, whose copy
		// of this mount is a slave: host to sandbox only, and locked there
		// (the code cannot unmount it to reach the tmpfs below).
		if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
			Remove(dir)
			return "", fmt.Errorf("unable to make the warm workspace %s shared: %w", dir, err)
		}
	}
	return dir, nil
}

func wrapSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrFull, err)
	}
	return err
}

// Remove unmounts and deletes the workspace, as the function Remove does.
func (w *Workspace) Remove() error {
	if w == nil || w.Dir == "" {
		return nil
	}
	return Remove(w.Dir)
}

// Sweep removes every workspace under root, cold or warm, its tmpfs
// unmounted first: run at start-up, when no execution can be live, it clears
// what a SIGKILLed worker left behind (SECURITY.md case 22). It returns the
// names it removed.
func Sweep(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweep %s: %w", root, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ColdPrefix) && !strings.HasPrefix(e.Name(), WarmPrefix) {
			continue
		}
		if err := Remove(filepath.Join(root, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}
