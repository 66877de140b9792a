# What the code of a template fork can reach of other processes and of the
# fds it was given (SECURITY.md cases 66, 68 and 69), as one JSON line on
# stdout: run through a fork's hand-off by template_test.go
# TestTemplateForkIsConfined, which judges it.
import errno
import json
import os
import signal

# A process of the code's own: the listing and the kill sweep must find it
# (so they can see a process at all), and nothing but it and the code. It
# holds no fd of its own: the fd listing below is the code's as handed off.
child = os.fork()
if child == 0:
    while True:
        signal.pause()  # until the parent kills it


def status(pid):
    try:
        with open("/proc/%s/status" % pid) as f:
            lines = f.read().splitlines()
    except OSError as e:
        return {"error": e.strerror}
    return {k: v.strip() for k, _, v in (l.partition(":") for l in lines) if k in ("Name", "State", "PPid", "NSpid")}


# Case 66 and 69: every process /proc lists, with its NSpid (one field when
# /proc is the code's own pid namespace's: an ancestor's lists more).
procs = {p: status(p) for p in os.listdir("/proc") if p.isdigit()}

# Case 69: which pids a signal reaches. ESRCH is "no such process in my pid
# namespace"; anything else (success, EPERM) means one is there.
signalable = {}
for pid in range(1, 32769):
    try:
        os.kill(pid, 0)
        signalable[pid] = "ok"
    except ProcessLookupError:
        pass
    except OSError as e:
        signalable[pid] = errno.errorcode.get(e.errno, str(e.errno))

# Case 68: every fd, what it is and where it was opened. The listing's own
# directory fd is closed by the time it is read (readlink fails).
root_mnt = None
with open("/proc/self/mountinfo") as f:
    for line in f:
        fields = line.split()
        if fields[4] == "/":
            root_mnt = fields[0]
fds = {}
for name in sorted(os.listdir("/proc/self/fd"), key=int):
    fd = int(name)
    try:
        target = os.readlink("/proc/self/fd/%d" % fd)
        st = os.fstat(fd)
        with open("/proc/self/fdinfo/%d" % fd) as f:
            info = dict(l.split(":\t", 1) for l in f.read().splitlines() if ":\t" in l)
    except OSError:
        continue
    fds[fd] = {"target": target, "mode": st.st_mode, "ino": st.st_ino, "rdev": st.st_rdev,
               "flags": int(info.get("flags", "0"), 8), "mnt_id": info.get("mnt_id", "").strip()}

os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
print(json.dumps({"self": os.getpid(), "child": child, "procs": procs, "signalable": signalable,
                  "root_mnt": root_mnt, "fds": fds}))
