package warmpool

import (
	"maps"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/runner"
)

// zygoteProtocol is zygote.py's PROTOCOL block: each `NAME = literal` line,
// the literal as written.
func zygoteProtocol(t *testing.T) map[string]string {
	return protocolBlock(t, "zygote.py", zygoteSource)
}

// protocolBlock is the PROTOCOL block of a Python program of this package.
func protocolBlock(t *testing.T, name, source string) map[string]string {
	t.Helper()
	const begin, end = "# --- PROTOCOL (server/warmpool/protocol.go) ---\n", "# --- end PROTOCOL ---\n"
	_, rest, ok := strings.Cut(source, begin)
	block, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("%s has no PROTOCOL block (%q ... %q)", name, begin, end)
	}
	line := regexp.MustCompile(`^([A-Z_]+) = (.+)$`)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(block, "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("%s's PROTOCOL block has a line that is not NAME = value: %q", name, l)
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

// template.py's constants are protocol.go's (and nsjail's namespace
// order), each written as Python would: no name more, none less; the
// zygote's it takes from zygote.py, never repeats.
func TestTemplateMirrorsProtocol(t *testing.T) {
	want := map[string]string{
		"TEMPLATE_FD":      strconv.Itoa(TemplateFD),
		"FORK_FDS":         strconv.Itoa(ForkFDs),
		"FORK_CGROUP_FDS":  strconv.Itoa(ForkCgroupFDs),
		"FORK_OUTPUT_FDS":  strconv.Itoa(ForkOutputFDs),
		"PIDFD_MESSAGE":    pyBytes([]byte(PidfdMessage)...),
		"SHELL_NAMESPACES": strconv.Quote(strings.Join(nsjail.ShellNamespaces(), " ")),
	}
	if got := protocolBlock(t, "template.py", templateSource); !maps.Equal(got, want) {
		t.Fatalf("template.py's PROTOCOL block is\n%q\nprotocol.go says\n%q", got, want)
	}
	if TemplateFD != nsjail.FirstFileFD {
		t.Errorf("TemplateFD %d is not StartTemplate's first file's fd %d", TemplateFD, nsjail.FirstFileFD)
	}
	code := strings.Split(templateSource, "# --- end PROTOCOL ---\n")[1]
	repeated := regexp.MustCompile(`os\.\w+\([3456][,)]|b"R"|b"\\n"|split\(","\)|"_ses\.`)
	if m := repeated.FindAllString(code, -1); len(m) > 0 {
		t.Errorf("template.py repeats protocol values outside its PROTOCOL block: %q", m)
	}
	for _, name := range []string{"CONTROL_FD", "READY_FD", "EXIT_REPORT_FD", "READY_BYTE", "MESSAGE_END", "PRELOAD_SEP"} {
		if regexp.MustCompile(`(?m)^` + name + ` = `).MatchString(templateSource) {
			t.Errorf("template.py defines %s itself; it is zygote.py's", name)
		}
	}
	args := templateArgs([]string{"numpy", "pandas"})
	if args[3] != templateSource || args[4] != zygoteSource || args[5] != runner.Source || args[6] != "numpy"+PreloadSep+"pandas" {
		t.Errorf("template args are not template.py, zygote.py, the runner, the preload")
	}
}

// T's replies decode strictly: one of forked and refused.
func TestDecodeForkReply(t *testing.T) {
	for line, want := range map[string]ForkReply{
		"{\"forked\": true}\n":           {Forked: true},
		"{\"refused\": \"stray fds\"}\n": {Refused: "stray fds"},
	} {
		if got, err := DecodeForkReply([]byte(line)); err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", line, got, err, want)
		}
	}
	for _, line := range []string{"", "\n", "{}\n", "{\"forked\": true}", "{\"forked\": false}\n",
		"{\"forked\": true, \"refused\": \"x\"}\n", "{\"forked\": true}{}\n", "{\"pid\": 3}\n", "null\n"} {
		if got, err := DecodeForkReply([]byte(line)); err == nil {
			t.Errorf("%q decoded to %+v", line, got)
		}
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
