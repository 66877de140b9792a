package warmpool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// codecProbe loads zygote.py as a module (its __main__ guard keeps the
// zygote from starting), decodes the hand-off message on stdin with
// zygote.py's decode_handoff and prints it as JSON, decodes the kernel
// request in its second argument with decode_request and prints it, writes
// two replies with encode_reply, then encodes the real
// wait statuses of three children with encode_exit_report: one exits 7,
// one kills itself with SIGKILL, one exits 0.
const codecProbe = `import json, os, signal, sys
zygote = {"__name__": "zygote"}
exec(compile(sys.argv[1], "zygote.py", "exec"), zygote)
job, kernel, cwd_on_path, events = zygote["decode_handoff"](sys.stdin.buffer.read())
sys.stdout.write(json.dumps({"path": job["path"], "argv": job["argv"], "cwd": job["cwd"], "kernel": kernel,
    "cwd_on_path": cwd_on_path, "display": job["display"], "figures": job["figures"], "events": events}) + "\n")
seq, code, env, display, figures, drop_interrupt = zygote["decode_request"](sys.argv[2].encode())
sys.stdout.write(json.dumps({"seq": seq, "code": code, "env": env, "display": display, "figures": figures,
    "drop_interrupt": drop_interrupt}) + "\n")
sys.stdout.buffer.write(zygote["encode_reply"](seq, 3) + zygote["encode_reply"](seq + 1, 0))
for act in ("exit 7", "kill", "exit 0"):
    pid = os.fork()
    if pid == 0:
        if act == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(int(act.split()[1]))
    _, status = os.waitpid(pid, 0)
    sys.stdout.buffer.write(zygote["encode_exit_report"](status))
sys.stdout.flush()
`

// The two sides' codecs agree, run by the runtime image's Python: a
// message EncodeHandoff wrote (with a path and argv JSON must escape) is
// what zygote.py decodes, and the exit reports zygote.py writes for real
// wait statuses are what DecodeExitReport reads.
func TestZygoteCodecsAgree(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	h := warmpool.Handoff{Path: inside.Path("code/m\u00e4in \"1\"\n.py"), Argv: []string{"a\tb", "\u2603", ""}, Cwd: inside.Workspace, Kernel: true, CwdOnPath: true,
		Display: true, Figures: true, Events: true}
	msg, err := warmpool.EncodeHandoff(h)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.IndexByte(msg, warmpool.MessageEnd) != len(msg)-1 {
		t.Fatalf("the message %q has MessageEnd inside it", msg)
	}
	tpl := poolTemplate(rootfs)
	req := warmpool.KernelRequest{Seq: 41, Code: "print('\u00e4')\n\x00\r\n", Env: map[string]string{"K": "v\nw"}, Figures: true, DropInterrupt: true}
	reqLine, err := warmpool.EncodeKernelRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.IndexByte(reqLine, warmpool.MessageEnd) != len(reqLine)-1 {
		t.Fatalf("the request %q has MessageEnd inside it", reqLine)
	}
	res, err := r.Run(context.Background(), nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "-P", "-c", codecProbe, warmpool.ZygoteSource, string(reqLine)},
		Env: tpl.Env, Limits: tpl.Limits, Stdin: bytes.NewReader(msg)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nsjail.StatusSucceeded {
		t.Fatalf("status %s: %s", res.Status, res.Stderr)
	}
	decodedLine, rest, _ := strings.Cut(string(res.Stdout), "\n")
	var got warmpool.Handoff
	if err := json.Unmarshal([]byte(decodedLine), &got); err != nil {
		t.Fatalf("zygote.py decoded %q: %v", decodedLine, err)
	}
	if got.Path != h.Path || !slices.Equal(got.Argv, h.Argv) || got.Cwd != h.Cwd || got.Kernel != h.Kernel ||
		got.CwdOnPath != h.CwdOnPath || got.Display != h.Display || got.Figures != h.Figures || got.Events != h.Events {
		t.Errorf("zygote.py decoded %+v, want %+v", got, h)
	}
	reqDecoded, rest, _ := strings.Cut(rest, "\n")
	var gotReq warmpool.KernelRequest
	if err := json.Unmarshal([]byte(reqDecoded), &gotReq); err != nil {
		t.Fatalf("zygote.py decoded the request as %q: %v", reqDecoded, err)
	}
	if gotReq.Seq != req.Seq || gotReq.Code != req.Code || !maps.Equal(gotReq.Env, req.Env) || gotReq.Display != req.Display ||
		gotReq.Figures != req.Figures || gotReq.DropInterrupt != req.DropInterrupt {
		t.Errorf("zygote.py decoded %+v, want %+v", gotReq, req)
	}
	for _, want := range []warmpool.KernelReply{{Seq: 41, ExitCode: 3}, {Seq: 42}} {
		line, more, _ := strings.Cut(rest, "\n")
		rest = more
		reply, err := warmpool.DecodeKernelReply([]byte(line + "\n"))
		if err != nil || reply != want {
			t.Errorf("zygote.py's reply %q decodes to %+v, %v; want %+v", line, reply, err, want)
		}
	}
	reports := rest
	var statuses []syscall.WaitStatus
	for _, line := range strings.SplitAfter(reports, string(warmpool.MessageEnd)) {
		if line == "" {
			continue
		}
		ws, err := warmpool.DecodeExitReport([]byte(line))
		if err != nil {
			t.Fatalf("report %q: %v", line, err)
		}
		statuses = append(statuses, ws)
	}
	if len(statuses) != 3 || statuses[0].ExitStatus() != 7 || !statuses[1].Signaled() || statuses[1].Signal() != syscall.SIGKILL ||
		!statuses[2].Exited() || statuses[2].ExitStatus() != 0 {
		t.Fatalf("reports %q decode to %v", reports, statuses)
	}
}
