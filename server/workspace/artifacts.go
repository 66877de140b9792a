package workspace

// Everything under output/ was written by untrusted code, which could have
// replaced any file or directory there with a symlink to a host path
// (CVE-2018-15664-style symlink races), a FIFO that blocks an open forever, a
// socket, a device node, a hardlink to another file, or a huge sparse file.
// So output is read only through directory fds: every component is opened with
// O_NOFOLLOW, files additionally with O_NONBLOCK (a FIFO cannot block), and
// the type is checked with fstat on the opened fd before a byte is read.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"golang.org/x/sys/unix"
)

// Artifact is one file returned from output/artifacts/.
type Artifact struct {
	Name      string `json:"name"`
	Size      int64  `json:"size"`
	MediaType string `json:"media_type"`
	SHA256    string `json:"sha256"`
	// Width and Height are a PNG's size in pixels, read from its header
	// as it was copied (0, left out, for anything else).
	Width         int    `json:"width,omitempty"`
	Height        int    `json:"height,omitempty"`
	ContentBase64 string `json:"content_base64"`
}

// Omitted is an entry of output/artifacts/ that was not returned. Reason is
// one of the Reason* codes.
type Omitted struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Reasons an artifact is omitted.
const (
	ReasonSymlink        = "symlink"
	ReasonHardlink       = "hardlink"
	ReasonFIFO           = "fifo"
	ReasonSocket         = "socket"
	ReasonDevice         = "device"
	ReasonTooDeep        = "directory_too_deep"
	ReasonTooLarge       = "too_large"
	ReasonTotalLimit     = "total_size_limit"
	ReasonCountLimit     = "count_limit"
	ReasonUnreadable     = "unreadable"
	ReasonTooManyEntries = "too_many_entries"
	ReasonNameNotUTF8    = "name_not_utf8"
	// ReasonNotStored: the worker could not keep a readable artifact (its
	// result store failed, e.g. its disk is full): our failure, not the
	// code's.
	ReasonNotStored = "not_stored"
)

// ArtifactLimits bound what is collected.
type ArtifactLimits struct {
	MaxFileBytes  int64
	MaxTotalBytes int64
	MaxCount      int
}

const (
	// maxArtifactDepth bounds the directory nesting walked.
	maxArtifactDepth = 8
	// maxArtifactEntries bounds the directory entries examined, so a million
	// empty files cost a bounded walk.
	maxArtifactEntries = 4096
	// maxOmitted bounds the omitted list in the response.
	maxOmitted = 100
)

// mediaTypes by lower-case extension; anything else is octet-stream.
var mediaTypes = map[string]string{
	".png":  "image/png",
	".jpg":  "image/jpeg",
	".jpeg": "image/jpeg",
	".svg":  "image/svg+xml",
	".csv":  "text/csv",
	".json": "application/json",
	".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
	".txt":  "text/plain",
	".md":   "text/markdown",
	".html": "text/html",
}

// MediaType returns the media type for an artifact name.
func MediaType(name string) string {
	if t, ok := mediaTypes[strings.ToLower(path.Ext(name))]; ok {
		return t
	}
	return "application/octet-stream"
}

// openDirAt opens name under dirfd as a directory without following a symlink.
func openDirAt(dirfd int, name string) (int, error) {
	return unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// openOutput opens <workspace>/output as a directory fd.
func openOutput(workspace string) (int, error) {
	ws, err := unix.Open(workspace, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ws)
	return openDirAt(ws, inside.OutputDir)
}

// typeReason names a non-regular file type.
func typeReason(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return ReasonSymlink
	case unix.S_IFIFO:
		return ReasonFIFO
	case unix.S_IFSOCK:
		return ReasonSocket
	case unix.S_IFCHR, unix.S_IFBLK:
		return ReasonDevice
	}
	return ""
}

// readRegularAt reads name under dirfd if, and only if, it is a regular file
// with one link and at most limit bytes. reason is set when it is refused.
func readRegularAt(dirfd int, name string, limit int64) (data []byte, reason string, err error) {
	f, reason, err := openRegularAt(dirfd, name, limit)
	if f == nil {
		return nil, reason, err
	}
	defer f.Close()
	data, err = io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, ReasonUnreadable, err
	}
	if int64(len(data)) > limit {
		return nil, ReasonTooLarge, nil
	}
	return data, "", nil
}

// openRegularAt opens name under dirfd if, and only if, it is a regular file
// with one link and at most limit bytes. reason is set when it is refused.
// The file may still grow while it is read: read at most limit+1 bytes.
func openRegularAt(dirfd int, name string, limit int64) (f *os.File, reason string, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, ReasonUnreadable, err
	}
	if r := typeReason(st.Mode); r != "" {
		return nil, r, nil
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, ReasonSymlink, nil
		}
		return nil, ReasonUnreadable, err
	}
	file := os.NewFile(uintptr(fd), name)
	defer func() {
		if f == nil {
			file.Close()
		}
	}()
	// The fstat of the open fd is what counts: the entry may have been
	// swapped between the Fstatat above and the open.
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, ReasonUnreadable, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		if r := typeReason(st.Mode); r != "" {
			return nil, r, nil
		}
		return nil, ReasonUnreadable, fmt.Errorf("not a regular file")
	}
	if st.Nlink > 1 {
		// A second name for a file elsewhere in the workspace: refused, so
		// one file cannot be returned twice or under a misleading name.
		return nil, ReasonHardlink, nil
	}
	if st.Size > limit {
		return nil, ReasonTooLarge, nil
	}
	return file, "", nil
}

// ReadResult reads output/result.json of the workspace dir. It returns the JSON, or nil and the
// reason in errMsg when it is missing, not a regular file, too large or not
// valid JSON.
func ReadResult(dir string, limit int64) (result json.RawMessage, errMsg string) {
	return ReadResultSince(dir, limit, nil)
}

// ReadResultSince is ReadResult of a workspace that outlives its
// executions (a session's): a result.json that is as it was in since is
// not this execution's, and is reported missing.
func ReadResultSince(dir string, limit int64, since *Snapshot) (result json.RawMessage, errMsg string) {
	out, err := openOutput(dir)
	if err != nil {
		return nil, fmt.Sprintf("%s/ is not a readable directory: %v", inside.OutputDir, err)
	}
	defer unix.Close(out)
	const name = inside.ResultFile // in messages
	if since != nil {
		var st unix.Stat_t
		if unix.Fstatat(out, inside.ResultName, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && since.hasResult && since.result == stampOf(&st) {
			return nil, name + " was not written by this execution"
		}
	}
	data, reason, err := readRegularAt(out, inside.ResultName, limit)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, name + " is missing"
	case reason == ReasonTooLarge:
		return nil, fmt.Sprintf("%s is larger than %d bytes", name, limit)
	case reason == ReasonUnreadable:
		return nil, fmt.Sprintf("%s is unreadable: %v", name, err)
	case reason != "":
		return nil, fmt.Sprintf("%s is not a regular file (%s)", name, reason)
	}
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		return nil, fmt.Sprintf("%s is not valid JSON: %v", name, err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return nil, fmt.Sprintf("%s is not valid JSON: %v", name, err)
	}
	return buf.Bytes(), ""
}

// SaveArtifact copies the content of the i-th accepted artifact from r
// (into the result store) and returns the bytes copied. An artifact refused
// after its copy (it grew past the limit) is followed by another with the
// same i, whose copy replaces it.
type SaveArtifact func(i int, r io.Reader) (int64, error)

// collector walks output/artifacts/ within its limits. With snap set it
// only records what it sees (TakeSnapshot); with since set it skips every
// entry that is as it was in since (CollectArtifactsSince).
type collector struct {
	snap      *Snapshot
	since     *Snapshot
	lim       ArtifactLimits
	save      SaveArtifact
	total     int64
	entries   int
	artifacts []Artifact
	omitted   []Omitted
	truncated bool
}

func (c *collector) omit(name, reason string) {
	if len(c.omitted) < maxOmitted {
		c.omitted = append(c.omitted, Omitted{Name: name, Reason: reason})
		return
	}
	c.truncated = true
}

// CollectArtifacts returns the regular files under output/artifacts/ of the
// workspace dir, in name order, and what it left out with a reason. Their
// contents go through save, streamed: the returned Artifacts have no
// ContentBase64, and no artifact is ever held in memory (SECURITY.md case
// 31: a client fills the worker's memory with large results).
func CollectArtifacts(dir string, lim ArtifactLimits, save SaveArtifact) ([]Artifact, []Omitted) {
	return CollectArtifactsSince(dir, lim, nil, save)
}

// CollectArtifactsSince is CollectArtifacts of a workspace that outlives
// its executions (a session's): only the entries this execution created
// or changed, those not as they were in since (nil: all), are returned or
// omitted.
func CollectArtifactsSince(dir string, lim ArtifactLimits, since *Snapshot, save SaveArtifact) ([]Artifact, []Omitted) {
	c := &collector{lim: lim, save: save, since: since}
	out, err := openOutput(dir)
	if err != nil {
		return nil, nil
	}
	defer unix.Close(out)
	artifacts, err := openDirAt(out, inside.ArtifactsName)
	if err != nil {
		var st unix.Stat_t
		if unix.Fstatat(out, inside.ArtifactsName, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if r := typeReason(st.Mode); r != "" {
				c.omit("", r) // artifacts/ itself was replaced
			}
		}
		return nil, c.omitted
	}
	c.walk(artifacts, "", 0) // closes artifacts
	if c.truncated {
		c.omitted = append(c.omitted, Omitted{Name: "…", Reason: ReasonTooManyEntries})
	}
	return c.artifacts, c.omitted
}

// walk collects the directory dirfd (named prefix) and closes it.
func (c *collector) walk(dirfd int, prefix string, depth int) {
	d := os.NewFile(uintptr(dirfd), prefix)
	defer d.Close()
	var names []string
	for c.entries < maxArtifactEntries {
		batch, err := d.Readdirnames(min(256, maxArtifactEntries-c.entries))
		names = append(names, batch...)
		c.entries += len(batch)
		if err != nil {
			break
		}
	}
	if c.entries >= maxArtifactEntries {
		c.truncated = true
	}
	sort.Strings(names)
	for _, name := range names {
		rel := path.Join(prefix, name)
		var st unix.Stat_t
		statErr := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if statErr == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if c.snap != nil {
				c.snap.artifacts[rel] = c.snap.saw(stampOf(&st))
				continue
			}
			if c.since != nil && c.since.artifacts[rel] == stampOf(&st) {
				continue // not this execution's
			}
		}
		if !utf8.ValidString(name) {
			// JSON has only UTF-8: encoding/json turns each invalid byte
			// into U+FFFD, so files whose names differ only there would
			// come back under one name (SECURITY.md case 30). Not returned;
			// the omitted entry names it Go-quoted, which is injective, and
			// only this reason carries quoted names.
			c.omit(quotedName(rel), ReasonNameNotUTF8)
			continue
		}
		if statErr != nil {
			c.omit(rel, ReasonUnreadable)
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if depth+1 >= maxArtifactDepth {
				c.omit(rel+"/", ReasonTooDeep)
				continue
			}
			sub, err := openDirAt(dirfd, name)
			if err != nil {
				c.omit(rel+"/", ReasonUnreadable)
				continue
			}
			c.walk(sub, rel, depth+1)
			continue
		}
		if r := typeReason(st.Mode); r != "" {
			c.omit(rel, r)
			continue
		}
		if len(c.artifacts) >= c.lim.MaxCount {
			c.omit(rel, ReasonCountLimit)
			continue
		}
		if st.Size > c.lim.MaxFileBytes {
			c.omit(rel, ReasonTooLarge)
			continue
		}
		if c.total+st.Size > c.lim.MaxTotalBytes {
			c.omit(rel, ReasonTotalLimit)
			continue
		}
		limit := min(c.lim.MaxFileBytes, c.lim.MaxTotalBytes-c.total)
		f, reason, _ := openRegularAt(dirfd, name, limit)
		if reason != "" {
			c.omit(rel, reason)
			continue
		}
		sum := sha256.New()
		head := &pngHead{}
		src := &readErrs{r: io.LimitReader(f, limit+1)}
		n, err := c.save(len(c.artifacts), io.TeeReader(src, io.MultiWriter(sum, head)))
		f.Close()
		switch {
		case err != nil && src.err != nil:
			c.omit(rel, ReasonUnreadable)
			continue
		case err != nil:
			c.omit(rel, ReasonNotStored)
			continue
		case n > limit:
			c.omit(rel, ReasonTooLarge)
			continue
		}
		c.total += n
		w, h := head.size()
		c.artifacts = append(c.artifacts, Artifact{
			Name:      rel,
			Size:      n,
			MediaType: MediaType(rel),
			SHA256:    hex.EncodeToString(sum.Sum(nil)),
			Width:     w,
			Height:    h,
		})
	}
}

// pngHead keeps the first bytes copied of an artifact: a PNG's signature
// and its IHDR chunk, which holds the image's size. Nothing else is read
// or kept: the file is the code's, and only the header's bytes as copied
// are looked at (a file changed meanwhile has the size of what was sent).
type pngHead struct {
	b [pngHeadBytes]byte
	n int
}

// pngHeadBytes: the 8-byte signature, the IHDR chunk's length and type,
// then its width and height (big-endian uint32 each).
const pngHeadBytes = 24

var pngSignature = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR")

func (p *pngHead) Write(b []byte) (int, error) {
	p.n += copy(p.b[p.n:], b)
	return len(b), nil
}

// size is the PNG's width and height, or 0, 0 when the bytes are not a
// PNG header or give a size the PNG format forbids (0, or over 2^31-1).
func (p *pngHead) size() (int, int) {
	if p.n < pngHeadBytes || !bytes.Equal(p.b[:16], pngSignature) {
		return 0, 0
	}
	w, h := binary.BigEndian.Uint32(p.b[16:20]), binary.BigEndian.Uint32(p.b[20:24])
	if w == 0 || h == 0 || w > math.MaxInt32 || h > math.MaxInt32 {
		return 0, 0
	}
	return int(w), int(h)
}

// quotedName is name as a Go string literal without its outer quotes:
// invalid bytes become \xNN and a backslash \\, so different names never
// print the same.
func quotedName(name string) string {
	q := strconv.Quote(name)
	return q[1 : len(q)-1]
}

// readErrs remembers a read error other than EOF, to tell an unreadable
// artifact (the code's doing) from one the store could not keep (ours).
type readErrs struct {
	r   io.Reader
	err error
}

func (e *readErrs) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// stamp is one version of a file: a file created, written, truncated,
// replaced, renamed, chmod-ed or linked since has another. The ctime is the
// kernel's: the code can set a file's mtime back (utimensat), never its
// ctime.
type stamp struct {
	ino          uint64
	size         int64
	mtime, ctime unix.Timespec
}

func stampOf(st *unix.Stat_t) stamp {
	return stamp{ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// Snapshot is what output/ of a workspace that outlives its executions (a
// session's) held before one: the stamp of every entry under
// output/artifacts/ (the same bounded walk as CollectArtifacts) and of
// output/result.json. After the execution, CollectArtifactsSince and
// ReadResultSince take only what it created or changed.
type Snapshot struct {
	artifacts map[string]stamp
	result    stamp
	hasResult bool
	latest    unix.Timespec // the latest ctime seen
}

func (s *Snapshot) saw(st stamp) stamp {
	if timespecAfter(st.ctime, s.latest) {
		s.latest = st.ctime
	}
	return st
}

func timespecAfter(a, b unix.Timespec) bool {
	return a.Sec > b.Sec || a.Sec == b.Sec && a.Nsec > b.Nsec
}

// settle returns once the clock the kernel stamps files with (the coarse
// realtime clock, one tick of a few ms) has passed every ctime recorded:
// a file rewritten later, within the same tick as its recorded version,
// would otherwise keep its stamp (same size, same ctime) and pass for
// unchanged. Almost always at once: the files are older.
func (s *Snapshot) settle() {
	for i := 0; i < 100; i++ {
		var now unix.Timespec
		if unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &now) != nil || timespecAfter(now, s.latest) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TakeSnapshot records output/ of the workspace dir (nothing when it is
// missing or not a directory: everything found after is new). Take it
// right before the execution starts: it returns once a write after it is
// sure to change a file's stamp (settle).
func TakeSnapshot(dir string) *Snapshot {
	snap := &Snapshot{artifacts: map[string]stamp{}}
	out, err := openOutput(dir)
	if err != nil {
		return snap
	}
	defer unix.Close(out)
	var st unix.Stat_t
	if unix.Fstatat(out, inside.ResultName, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		snap.result, snap.hasResult = snap.saw(stampOf(&st)), true
	}
	if artifacts, err := openDirAt(out, inside.ArtifactsName); err == nil {
		c := &collector{snap: snap}
		c.walk(artifacts, "", 0) // closes artifacts
	}
	snap.settle()
	return snap
}
