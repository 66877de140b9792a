package volume

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// Errors of the file API, for the HTTP layer to map (errors.Is):
//
//	ErrBadPath, ErrNameTooLong  400: the path itself is unacceptable
//	ErrNotFound                 404
//	ErrNotRegular, ErrNotEmpty  409: the path is fine but what the session
//	                            holds there (a symlink, FIFO, socket, device,
//	                            directory, or a file where a directory is
//	                            needed) is not something the API touches
//	ErrQuota                    413: the session's quota is used up. Not
//	                            507, which the API keeps for the worker's own
//	                            disk being full: this is the client's limit,
//	                            and retrying without deleting files is futile.
var (
	ErrBadPath     = errors.New("bad path")
	ErrNameTooLong = fmt.Errorf("%w: name too long", ErrBadPath)
	ErrNotFound    = errors.New("no such file")
	ErrNotRegular  = errors.New("not a regular file")
	ErrNotEmpty    = errors.New("directory not empty")
	ErrQuota       = errors.New("volume quota exceeded")
)

const (
	// MaxDepth bounds the directories in a path, as for files[] today.
	MaxDepth = 8
	// MaxNameBytes is ext4's NAME_MAX: no component can be longer.
	MaxNameBytes = 255
	// MaxPathBytes bounds a whole path, so it fits a URL and a log line.
	MaxPathBytes = 1024
)

// CheckPath rejects a volume path that could resolve outside the volume root
// (path traversal, CWE-22) or that names nothing sensible. The rules are
// those of server's checkFilePath for files[] (copied here so this package
// stands alone; the lead unifies them), without its request.json
// reservation, plus "." and length limits. SECURITY.md case 38.
func CheckPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: path is empty", ErrBadPath)
	case len(p) > MaxPathBytes:
		return fmt.Errorf("%w: path is %d bytes, more than %d", ErrNameTooLong, len(p), MaxPathBytes)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("%w: path %q contains a NUL byte", ErrBadPath, p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("%w: path %q is absolute: want a path relative to /workspace/", ErrBadPath, p)
	case strings.Contains(p, "\\"):
		return fmt.Errorf("%w: path %q contains a backslash", ErrBadPath, p)
	}
	parts := strings.Split(p, "/")
	for _, c := range parts {
		if c == ".." {
			return fmt.Errorf("%w: path %q contains ..", ErrBadPath, p)
		}
		if len(c) > MaxNameBytes {
			return fmt.Errorf("%w: a name in path %.40q... is %d bytes, more than %d", ErrNameTooLong, p, len(c), MaxNameBytes)
		}
	}
	if p == "." || !filepath.IsLocal(p) || path.Clean(p) != p {
		return fmt.Errorf("%w: path %q is not a clean relative path", ErrBadPath, p)
	}
	if len(parts) > MaxDepth {
		return fmt.Errorf("%w: path %q is deeper than %d directories", ErrBadPath, p, MaxDepth)
	}
	return nil
}

// splitPrefix turns a List prefix into the directory to walk ("" for the
// root) and the prefix every listed name must have. "data/" lists
// everything under data, "data/re" what under data starts with "re".
func splitPrefix(prefix string) (dir string, err error) {
	if prefix == "" {
		return "", nil
	}
	trimmed := strings.TrimSuffix(prefix, "/")
	if err := CheckPath(trimmed); err != nil {
		return "", fmt.Errorf("prefix: %w", err)
	}
	if strings.HasSuffix(prefix, "/") {
		return trimmed, nil
	}
	if d := path.Dir(trimmed); d != "." {
		return d, nil
	}
	return "", nil
}
