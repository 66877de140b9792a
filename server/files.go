package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/workspace"
)

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

// checkFilePath is volume.CheckPath (the one path rule: SECURITY.md case
// 38; paths are relative to /workspace/input/) plus the one name under
// input/ the server writes itself: a file there would turn request.json
// into something else.
func checkFilePath(p string) error {
	if err := volume.CheckPath(p); err != nil {
		return err
	}
	if p == reservedInput || strings.HasPrefix(p, reservedInput+"/") {
		return fmt.Errorf("path %q is reserved: %s holds the request's input", clip(p), reservedInput)
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
