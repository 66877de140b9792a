# What the code's process sees, as one JSON line on stdout: run cold (by
# the runner, as a cold execution runs a file) and by a template fork's G
# after its hand-off, by template_test.go, which compares the two.
# ctypes is imported first in both: libffi opens an fd of its own library
# on import, which a fork inherits from the template.
import ctypes
import errno
import json
import os
import socket

libc = ctypes.CDLL(None, use_errno=True)


def read(p):
    try:
        with open(p) as f:
            return f.read()
    except OSError as e:
        return "error: %s" % e


def probe(f):
    try:
        f()
        return "allowed"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def call(rc):
    if rc < 0:
        raise OSError(ctypes.get_errno(), "")
    return rc


def mount_tmpfs():
    call(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))


def lower_oom_score_adj():
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")


def keyring():
    """The session keyring's serial and description (keyctl: denied by the
    production profile, where both read the errno)."""
    keyctl = 250  # x86_64
    try:
        serial = call(libc.syscall(keyctl, 0, ctypes.c_long(-3), 0))  # KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING
        buf = ctypes.create_string_buffer(512)
        call(libc.syscall(keyctl, 6, serial, buf, len(buf)))  # KEYCTL_DESCRIBE
        return serial, buf.value.decode()
    except OSError as e:
        return None, errno.errorcode.get(e.errno, str(e.errno))


def fd_kind(fd):
    target = os.readlink("/proc/self/fd/%d" % fd)
    return target.split(":")[0] if target.startswith(("pipe:", "socket:", "anon_inode:")) else target


def randoms():
    import multiprocessing
    import random

    import numpy

    return {"random": random.random(), "numpy": float(numpy.random.random()),
            "authkey": bytes(multiprocessing.current_process().authkey).hex()}


def rlimits():
    import resource

    return {n: resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_")}


status = {k: v.strip() for k, _, v in (l.partition(":") for l in read("/proc/self/status").splitlines())}
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
fds = [fd for fd in fds if os.path.exists("/proc/self/fd/%d" % fd)]  # the listing's own fd is gone
serial, desc = keyring()
mountinfo = read("/proc/self/mountinfo").splitlines()
view = {
    "pid": os.getpid(), "ppid": os.getppid(),
    "uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(),
    "caps": {k: status.get(k) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
    "no_new_privs": status.get("NoNewPrivs"), "seccomp": status.get("Seccomp"),
    "seccomp_filters": status.get("Seccomp_filters"),
    "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
    "uid_map": read("/proc/self/uid_map"), "gid_map": read("/proc/self/gid_map"),
    "cgroup": read("/proc/self/cgroup"),
    "oom_score_adj": read("/proc/self/oom_score_adj").strip(),
    "hostname": socket.gethostname(), "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "mounts": [l.split()[4] for l in mountinfo],
    "root_mount_options": [l.split()[5] for l in mountinfo if l.split()[4] == "/"],
    "net": [l.split(":")[0].strip() for l in read("/proc/net/dev").splitlines()[2:]],
    "fds": [fd_kind(fd) for fd in fds],
    "stdio": [[os.fstat(fd).st_dev, os.fstat(fd).st_ino] for fd in (0, 1, 2)],
    "cwd": os.getcwd(),
    "rlimits": rlimits(),
    "keyring_serial": serial,
    # The description without its name: type;uid;gid;perm.
    "keyring": desc.rsplit(";", 1)[0] if serial else desc,
    "keyring_name": desc.rsplit(";", 1)[-1] if serial else None,
    "randoms": randoms(),
    "rootfs_write": probe(lambda: open("/usr/sandboxd-probe", "w")),
    "unshare_user": probe(lambda: os.unshare(os.CLONE_NEWUSER)),
    "mount_syscall": probe(mount_tmpfs),
    "oom_lower": probe(lower_oom_score_adj),
}
print(json.dumps(view))
