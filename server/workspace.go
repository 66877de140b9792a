package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// Paths inside the sandbox (the workspace is bound at inside.Workspace).
const (
	CodePath    = inside.Workspace + "/" + inside.CodeFile
	InputPath   = inside.Workspace + "/" + inside.RequestFile
	OutputDir   = inside.Workspace + "/" + inside.OutputDir
	ResultPath  = inside.Workspace + "/" + inside.ResultFile
	ArtifactDir = inside.Workspace + "/" + inside.ArtifactsDir
)

// workspacePrefix names every workspace directory, so the orphan sweep removes
// only what sandboxd created even if work_root is shared; warmPrefix names
// the warm pool's (see Pool.start).
const (
	workspacePrefix = "exec-"
	warmPrefix      = "warm-"
)

// maxFileDepth bounds the directory depth of request files.
const maxFileDepth = 8

// File is one request file, written under /workspace/input/.
type File struct {
	Path          string `json:"path"`
	ContentBase64 string `json:"content_base64"`
}

// ErrWorkspaceFull is returned when the work root has no space (or inodes)
// left; the API answers 507 and keeps serving.
var ErrWorkspaceFull = errors.New("work root is full")

// errTooManyFiles: a request's files would create more than max_input_files
// entries (HTTP 413).
var errTooManyFiles = errors.New("too many files")

// reservedInput is the one name under /workspace/input/ the server writes
// itself: no request file may be it or below it.
const reservedInput = inside.RequestName

// checkFilePath rejects request file paths that could land outside
// /workspace/input/ (path traversal, CWE-22), name input/ itself, or collide
// with request.json: each would otherwise fail only when the workspace is
// written (a 500), or turn request.json into a directory. Messages carry the
// path clipped.
func checkFilePath(p string) error {
	q := clip(p)
	switch {
	case p == "":
		return errors.New("path is empty")
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("path %q contains a NUL byte", q)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is absolute: want a path relative to /workspace/input/", q)
	case strings.Contains(p, "\\"):
		return fmt.Errorf("path %q contains a backslash", q)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return fmt.Errorf("path %q contains ..", q)
		}
	}
	if !filepath.IsLocal(p) || path.Clean(p) != p {
		return fmt.Errorf("path %q is not a clean relative path", q)
	}
	if p == "." {
		return errors.New(`path "." names /workspace/input/ itself: want a file name`)
	}
	if strings.Count(p, "/") >= maxFileDepth {
		return fmt.Errorf("path %q is deeper than %d directories", q, maxFileDepth)
	}
	if p == reservedInput || strings.HasPrefix(p, reservedInput+"/") {
		return fmt.Errorf("path %q is reserved: %s holds the request's input", q, reservedInput)
	}
	return nil
}

// decodedFile is a validated request file.
type decodedFile struct {
	path string
	data []byte
}

// decodeFiles validates every path, checks that files and the directories
// they need are at most maxEntries (each is an inode of the workspace tmpfs,
// charged to the worker: SECURITY.md case 33), then decodes every content;
// total counts the decoded bytes.
func decodeFiles(files []File, maxEntries int) (out []decodedFile, total int64, err error) {
	if len(files) > maxEntries {
		return nil, 0, fmt.Errorf("%w: %d files, more than max_input_files (%d)", errTooManyFiles, len(files), maxEntries)
	}
	seen := map[string]bool{}
	for i, f := range files {
		if err := checkFilePath(f.Path); err != nil {
			return nil, 0, fmt.Errorf("files[%d]: %w", i, err)
		}
		if seen[f.Path] {
			return nil, 0, fmt.Errorf("files[%d]: duplicate path %q", i, clip(f.Path))
		}
		seen[f.Path] = true
	}
	// A file and a directory of the same name cannot both exist.
	dirs := map[string]bool{}
	for p := range seen {
		for d := path.Dir(p); d != "." && !dirs[d]; d = path.Dir(d) {
			if seen[d] {
				return nil, 0, fmt.Errorf("files: %q is both a file and a directory", clip(d))
			}
			dirs[d] = true
		}
	}
	if n := len(seen) + len(dirs); n > maxEntries {
		return nil, 0, fmt.Errorf("%w: the files create %d entries under input/ (%d files, %d directories), more than max_input_files (%d)",
			errTooManyFiles, n, len(seen), len(dirs), maxEntries)
	}
	for i, f := range files {
		data, err := base64.StdEncoding.DecodeString(f.ContentBase64)
		if err != nil {
			return nil, 0, fmt.Errorf("files[%d] (%s): content_base64 is not valid base64: %v", i, clip(f.Path), err)
		}
		total += int64(len(data))
		out = append(out, decodedFile{f.Path, data})
	}
	return out, total, nil
}

// Workspace is one execution's host directory, bound at /workspace.
type Workspace struct {
	Dir string
}

// workspaceLayout is what a sandbox finds in /workspace.
var workspaceLayout = inside.LayoutDirs

// CreateWorkspace makes a fresh workspace under root for execution id, mounts
// a tmpfs of size bytes and inodes inodes on it (see mountWorkspace), writes
// the code, the input and the files, and hands everything to the sandbox's
// host uid/gid so uid 10001 inside can read it and write output/.
func CreateWorkspace(root, id string, size, inodes int64, uid, gid int, code string, input []byte, files []decodedFile) (ws *Workspace, err error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, wrapSpace(fmt.Errorf("work root: %w", err))
	}
	dir, err := os.MkdirTemp(root, workspacePrefix+id+"-")
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
	if err := mountWorkspace(dir, size, inodes, uid, gid); err != nil {
		return ws, err
	}
	// os.Root: every write below stays inside dir whatever the names say
	// (defence in depth behind checkFilePath).
	r, err := os.OpenRoot(dir)
	if err != nil {
		return ws, fmt.Errorf("open workspace: %w", err)
	}
	defer r.Close()
	for _, d := range workspaceLayout {
		if err := r.Mkdir(d, 0o755); err != nil {
			return ws, wrapSpace(fmt.Errorf("create workspace: %w", err))
		}
	}
	if err := r.WriteFile(inside.CodeFile, []byte(code), 0o644); err != nil {
		return ws, wrapSpace(fmt.Errorf("write code: %w", err))
	}
	if input != nil {
		if err := r.WriteFile(inside.RequestFile, input, 0o644); err != nil {
			return ws, wrapSpace(fmt.Errorf("write input: %w", err))
		}
	}
	for _, f := range files {
		p := inside.InputDir + "/" + f.path
		if err := r.MkdirAll(path.Dir(p), 0o755); err != nil {
			return ws, wrapSpace(fmt.Errorf("write file %s: %w", f.path, err))
		}
		if err := r.WriteFile(p, f.data, 0o644); err != nil {
			return ws, wrapSpace(fmt.Errorf("write file %s: %w", f.path, err))
		}
	}
	// Nothing in dir is a symlink yet (the sandbox has not run), so a plain
	// walk is safe here.
	err = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		return ws, fmt.Errorf("chown workspace: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return ws, fmt.Errorf("chmod workspace: %w", err)
	}
	return ws, nil
}

func wrapSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrWorkspaceFull, err)
	}
	return err
}

// Remove unmounts and deletes the workspace (see removeWorkspace). It is
// idempotent.
func (w *Workspace) Remove() error {
	if w == nil || w.Dir == "" {
		return nil
	}
	return removeWorkspace(w.Dir)
}

// SweepWorkspaces removes every workspace under root, cold or warm, its tmpfs
// unmounted first: run at start-up, when no execution can be live, it clears
// what a SIGKILLed worker left behind (SECURITY.md case 22). It returns the
// names it removed.
func SweepWorkspaces(root string) ([]string, error) {
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
		if !strings.HasPrefix(e.Name(), workspacePrefix) && !strings.HasPrefix(e.Name(), warmPrefix) {
			continue
		}
		if err := removeWorkspace(filepath.Join(root, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// SweepOrphans clears what a worker killed with SIGKILL left behind (SECURITY.md
// case 22): its sandboxes (containers, cgroups, state, via Runner.Sweep) and
// then its workspaces and their tmpfs mounts. Call it on start, before
// serving and before the warm pool starts anything.
func SweepOrphans(r *nsjail.Runner, workRoot string, log *slog.Logger) error {
	sandboxes, err := r.Sweep()
	if err != nil {
		return fmt.Errorf("sweep orphan sandboxes: %w", err)
	}
	workspaces, err := SweepWorkspaces(workRoot)
	if err != nil {
		return err
	}
	log.Info("swept orphans", "sandboxes", len(sandboxes), "workspaces", len(workspaces),
		"state_root", r.StateRoot(), "work_root", workRoot)
	return nil
}
