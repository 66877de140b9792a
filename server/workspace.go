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
)

// Paths inside the sandbox (the workspace is bound at nsjail.WorkspaceDir).
const (
	CodePath    = "/workspace/code/main.py"
	InputPath   = "/workspace/input/request.json"
	OutputDir   = "/workspace/output"
	ResultPath  = "/workspace/output/result.json"
	ArtifactDir = "/workspace/output/artifacts"
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

// checkFilePath rejects request file paths that could land outside
// /workspace/input/ (path traversal, CWE-22) or collide with request.json.
func checkFilePath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("path %q contains a NUL byte", p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is absolute: want a path relative to /workspace/input/", p)
	case strings.Contains(p, "\\"):
		return fmt.Errorf("path %q contains a backslash", p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return fmt.Errorf("path %q contains ..", p)
		}
	}
	if !filepath.IsLocal(p) || path.Clean(p) != p {
		return fmt.Errorf("path %q is not a clean relative path", p)
	}
	if strings.Count(p, "/") >= maxFileDepth {
		return fmt.Errorf("path %q is deeper than %d directories", p, maxFileDepth)
	}
	if p == "request.json" {
		return errors.New(`path "request.json" is reserved for the request's input`)
	}
	return nil
}

// decodedFile is a validated request file.
type decodedFile struct {
	path string
	data []byte
}

// decodeFiles validates every path and decodes every content; total counts
// the decoded bytes.
func decodeFiles(files []File) (out []decodedFile, total int64, err error) {
	seen := map[string]bool{}
	for i, f := range files {
		if err := checkFilePath(f.Path); err != nil {
			return nil, 0, fmt.Errorf("files[%d]: %w", i, err)
		}
		if seen[f.Path] {
			return nil, 0, fmt.Errorf("files[%d]: duplicate path %q", i, f.Path)
		}
		seen[f.Path] = true
		data, err := base64.StdEncoding.DecodeString(f.ContentBase64)
		if err != nil {
			return nil, 0, fmt.Errorf("files[%d] (%s): content_base64 is not valid base64: %v", i, f.Path, err)
		}
		total += int64(len(data))
		out = append(out, decodedFile{f.Path, data})
	}
	// A file and a directory of the same name cannot both exist.
	for p := range seen {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if seen[d] {
				return nil, 0, fmt.Errorf("files: %q is both a file and a directory", d)
			}
		}
	}
	return out, total, nil
}

// Workspace is one execution's host directory, bound at /workspace.
type Workspace struct {
	Dir string
}

// workspaceLayout is what a sandbox finds in /workspace.
var workspaceLayout = []string{"code", "input", "output", "output/artifacts"}

// CreateWorkspace makes a fresh workspace under root for execution id, mounts
// a tmpfs of size bytes on it (see mountWorkspace), writes the code, the
// input and the files, and hands everything to the sandbox's host uid/gid so
// uid 10001 inside can read it and write output/.
func CreateWorkspace(root, id string, size int64, uid, gid int, code string, input []byte, files []decodedFile) (ws *Workspace, err error) {
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
	if err := mountWorkspace(dir, size, uid, gid); err != nil {
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
	if err := r.WriteFile("code/main.py", []byte(code), 0o644); err != nil {
		return ws, wrapSpace(fmt.Errorf("write code: %w", err))
	}
	if input != nil {
		if err := r.WriteFile("input/request.json", input, 0o644); err != nil {
			return ws, wrapSpace(fmt.Errorf("write input: %w", err))
		}
	}
	for _, f := range files {
		p := "input/" + f.path
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
