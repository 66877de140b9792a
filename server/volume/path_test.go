package volume_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/server/volume"
)

// SECURITY.md case 38: paths that could leave the volume, or that no
// filesystem takes, are refused before anything is opened.
func TestCheckPath(t *testing.T) {
	deep := strings.Repeat("d/", volume.MaxDepth-1) + "f"
	for p, want := range map[string]error{
		"a.txt":                         nil,
		"data/in.csv":                   nil,
		".hidden":                       nil,
		"lost+found":                    nil, // a name like any other; ownership hides the real one
		deep:                            nil,
		"d/" + deep:                     volume.ErrBadPath,
		"":                              volume.ErrBadPath,
		".":                             volume.ErrBadPath,
		"..":                            volume.ErrBadPath,
		"../etc/passwd":                 volume.ErrBadPath,
		"a/../../b":                     volume.ErrBadPath,
		"a/..":                          volume.ErrBadPath,
		"/etc/passwd":                   volume.ErrBadPath,
		"a//b":                          volume.ErrBadPath,
		"a/./b":                         volume.ErrBadPath,
		"a/":                            volume.ErrBadPath,
		`a\..\b`:                        volume.ErrBadPath,
		"a\x00b":                        volume.ErrBadPath,
		strings.Repeat("n", 255):        nil,
		strings.Repeat("n", 256):        volume.ErrNameTooLong,
		strings.Repeat("n", 4096):       volume.ErrNameTooLong,
		strings.Repeat("abc/", 300):     volume.ErrNameTooLong,
		"x/" + strings.Repeat("n", 256): volume.ErrNameTooLong,
	} {
		err := volume.CheckPath(p)
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Errorf("CheckPath(%.60q) = %v, want %v", p, err, want)
		}
	}
	// The message echoes a long path cut short.
	if err := volume.CheckPath(strings.Repeat("../", 2000)); err == nil || len(err.Error()) > 300 {
		t.Errorf("CheckPath of a 6000-byte path: %d-byte message", len(err.Error()))
	}
	// A name too long is a bad path too: one 400 for both.
	if !errors.Is(volume.ErrNameTooLong, volume.ErrBadPath) {
		t.Error("ErrNameTooLong does not wrap ErrBadPath")
	}
}

// The image is big enough for the quota plus the inode tables, in whole
// blocks, and not much more (the ballast would take it up, but preallocated
// it is host disk).
func TestImageSize(t *testing.T) {
	for _, c := range []struct{ bytes, files int64 }{
		{volume.DefaultMaxBytes, volume.DefaultMaxFiles},
		{volume.MinBytes, volume.MinFiles},
		{volume.MinBytes, 100_000},
		{1 << 40, volume.MinFiles},
		{volume.MaxBytesLimit, volume.MaxFilesLimit},
	} {
		size := volume.ImageSize(c.bytes, c.files)
		if size < c.bytes+c.files*256 || size%4096 != 0 {
			t.Errorf("ImageSize(%d, %d) = %d: below the quota plus inode tables, or not whole blocks", c.bytes, c.files, size)
		}
		if limit := c.bytes*103/100 + c.files*256 + 4<<20 + c.bytes/(128<<20)*16<<10; size > limit {
			t.Errorf("ImageSize(%d, %d) = %d: more than %d", c.bytes, c.files, size, limit)
		}
	}
}
