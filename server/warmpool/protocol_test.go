package warmpool

import (
	"maps"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail"
)

// zygoteProtocol is zygote.py's PROTOCOL block: each `NAME = literal` line,
// the literal as written.
func zygoteProtocol(t *testing.T) map[string]string {
	t.Helper()
	const begin, end = "# --- PROTOCOL (server/warmpool/protocol.go) ---\n", "# --- end PROTOCOL ---\n"
	_, rest, ok := strings.Cut(zygoteSource, begin)
	block, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("zygote.py has no PROTOCOL block (%q ... %q)", begin, end)
	}
	line := regexp.MustCompile(`^([A-Z_]+) = (.+)$`)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(block, "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("zygote.py's PROTOCOL block has a line that is not NAME = value: %q", l)
		}
		got[m[1]] = m[2]
	}
	return got
}

// pyBytes is b as a Python bytes literal (ASCII only, as the protocol's).
func pyBytes(b ...byte) string { return "b" + strconv.Quote(string(b)) }

// zygote.py's constants are protocol.go's, each written as Python would:
// no name more, none less.
func TestZygoteMirrorsProtocol(t *testing.T) {
	want := map[string]string{
		"CONTROL_FD":       strconv.Itoa(ControlFD),
		"READY_FD":         strconv.Itoa(ReadyFD),
		"EXIT_REPORT_FD":   strconv.Itoa(ExitReportFD),
		"READY_BYTE":       pyBytes(ReadyByte),
		"PRELOAD_SEP":      strconv.Quote(PreloadSep),
		"MESSAGE_END":      pyBytes(MessageEnd),
		"KERNEL_READY_SEQ": strconv.Itoa(KernelReadySeq),
		"KERNEL_FDS":       strconv.Itoa(KernelFDs),
		"CELL_NAME_FORMAT": strconv.Quote(CellNameFormat),
	}
	if got := zygoteProtocol(t); !maps.Equal(got, want) {
		t.Fatalf("zygote.py's PROTOCOL block is\n%q\nprotocol.go says\n%q", got, want)
	}
	// Outside the block, zygote.py names them, never repeats their values.
	code := strings.Split(zygoteSource, "# --- end PROTOCOL ---\n")[1]
	repeated := regexp.MustCompile(`os\.\w+\([345][,)]|b"R"|b"\\n"|split\(","\)`)
	if m := repeated.FindAllString(code, -1); len(m) > 0 {
		t.Errorf("zygote.py repeats protocol values outside its PROTOCOL block: %q", m)
	}
}

// The pipes become the fds the protocol names, whatever their order.
func TestZygoteFilesAreTheProtocolFds(t *testing.T) {
	control, ready, report := os.NewFile(100, "control"), os.NewFile(101, "ready"), os.NewFile(102, "report")
	files := zygoteFiles(control, ready, report)
	for fd, want := range map[int]*os.File{ControlFD: control, ReadyFD: ready, ExitReportFD: report} {
		if got := files[fd-nsjail.FirstFileFD]; got != want {
			t.Errorf("fd %d is %s, want %s", fd, got.Name(), want.Name())
		}
	}
	if args := zygoteArgs([]string{"numpy", "pandas"}); args[len(args)-1] != "numpy"+PreloadSep+"pandas" {
		t.Errorf("zygote args end with %q", args[len(args)-1])
	}
}

// A kernel reply is parsed strictly: everything the kernel writes is
// untrusted (SECURITY.md case 39).
func TestDecodeKernelReply(t *testing.T) {
	good := map[string]KernelReply{
		"{\"seq\": 3, \"exit_code\": 0}\n":   {Seq: 3},
		"{\"seq\":4,\"exit_code\":130}\n":    {Seq: 4, ExitCode: 130},
		"{\"seq\": 0, \"exit_code\": 255}\n": {ExitCode: 255},
	}
	for line, want := range good {
		if got, err := DecodeKernelReply([]byte(line)); err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", line, got, err, want)
		}
	}
	bad := []string{
		"", "\n", "{\"seq\": 3, \"exit_code\": 0}", "null\n", "[]\n", "{}{}\n",
		"{\"seq\": 3, \"exit_code\": 0} 1\n",
		"{\"seq\": 3, \"exit_code\": 0, \"status\": \"ok\"}\n",
		"{\"seq\": -1, \"exit_code\": 0}\n", "{\"seq\": 1.5, \"exit_code\": 0}\n",
		"{\"seq\": 1, \"exit_code\": 256}\n", "{\"seq\": 1, \"exit_code\": -1}\n",
		"{\"seq\": 1, \"exit_code\": \"0\"}\n", "{\"seq\": 1}\n", "{\"exit_code\": 0}\n",
		"{\"seq\": null, \"exit_code\": 0}\n",
		"{\"seq\": 1, \"exit_code\": 0, \"pad\": \"" + strings.Repeat("x", 200) + "\"}\n",
	}
	for _, line := range bad {
		if got, err := DecodeKernelReply([]byte(line)); err == nil {
			t.Errorf("%q decoded to %+v", line, got)
		}
	}
}
