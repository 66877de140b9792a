package volume

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strconv"
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

// CheckPath is the one path rule of sandboxd: a session volume's file API,
// and the execution API's files[] (server's checkFilePath adds its one
// reserved name). It rejects a path that could resolve outside the
// directory it is relative to (path traversal, CWE-22) or that names
// nothing sensible: empty, absolute, a backslash, a NUL byte, a ".." or
// "." component, an empty component, the directory itself, deeper than
// MaxDepth, a name longer than ext4's NAME_MAX or a path longer than
// MaxPathBytes. Each would otherwise fail only when written (a 500), or
// worse. SECURITY.md case 38. Messages echo the path bounded (echo).
func CheckPath(p string) error {
	q := echo(p)
	switch {
	case p == "":
		return fmt.Errorf("%w: path is empty", ErrBadPath)
	case len(p) > MaxPathBytes:
		return fmt.Errorf("%w: path %s is %d bytes, more than %d", ErrNameTooLong, q, len(p), MaxPathBytes)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("%w: path %s contains a NUL byte", ErrBadPath, q)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("%w: path %s is absolute: want a relative path", ErrBadPath, q)
	case strings.Contains(p, "\\"):
		return fmt.Errorf("%w: path %s contains a backslash", ErrBadPath, q)
	case p == ".":
		return fmt.Errorf(`%w: path "." names the directory itself: want a file name`, ErrBadPath)
	}
	parts := strings.Split(p, "/")
	for _, c := range parts {
		if c == ".." {
			return fmt.Errorf("%w: path %s contains ..", ErrBadPath, q)
		}
		if len(c) > MaxNameBytes {
			return fmt.Errorf("%w: a name in path %s is %d bytes, more than %d", ErrNameTooLong, q, len(c), MaxNameBytes)
		}
	}
	if !filepath.IsLocal(p) || path.Clean(p) != p {
		return fmt.Errorf("%w: path %s is not a clean relative path", ErrBadPath, q)
	}
	if len(parts) > MaxDepth {
		return fmt.Errorf("%w: path %s is deeper than %d directories", ErrBadPath, q, MaxDepth)
	}
	return nil
}

// maxEcho bounds the part of a path an error message quotes: a client's
// path echoed in an answer or a log line cannot make either large.
const maxEcho = 128

// echo is p quoted, at most maxEcho bytes of it, with its length when cut.
func echo(p string) string {
	if len(p) <= maxEcho {
		return strconv.Quote(p)
	}
	return strconv.Quote(strings.ToValidUTF8(p[:maxEcho], "")) + fmt.Sprintf("…(%d bytes)", len(p))
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
