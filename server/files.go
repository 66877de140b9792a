package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// maxFileDepth bounds the directory depth of request files.
const maxFileDepth = 8

// File is one request file, written under /workspace/input/.
type File struct {
	Path          string `json:"path"`
	ContentBase64 string `json:"content_base64"`
}

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

// decodeFiles validates every path, checks that files and the directories
// they need are at most maxEntries (each is an inode of the workspace tmpfs,
// charged to the worker: SECURITY.md case 33), then decodes every content;
// total counts the decoded bytes.
func decodeFiles(files []File, maxEntries int) (out []workspace.File, total int64, err error) {
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
		out = append(out, workspace.File{Path: f.Path, Data: data})
	}
	return out, total, nil
}
