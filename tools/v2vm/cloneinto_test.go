package v2vm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The permission model of template forks on v2 (server/warmpool/TEMPLATE.md
// section 4, experiment E7): F, an unprivileged process (the template's host
// uid) in a user namespace of its own, in the template's leaf
// tpl/template, forks G with clone3(CLONE_NEWPID|CLONE_INTO_CGROUP) into
// tpl/sbx, a sibling of its leaf, with a directory fd the worker gave it.
// The kernel (cgroup_css_set_fork, cgroup_attach_permissions) wants write
// access, for F's credentials (inode_permission in the initial user
// namespace: the file's owner, F's host uid), to cgroup.procs of the
// destination and of the common ancestor tpl, and with nsdelegate both
// cgroups below the root of F's cgroup namespace. And the fd itself: a
// plain O_PATH fd of the directory lets its holder walk ".." out of the
// cgroup tree into the worker's whole filesystem (runc's CVE-2024-21626,
// a leaked /sys/fs/cgroup fd); a detached bind mount of the directory
// (open_tree OPEN_TREE_CLONE) has no parent to walk to.

// templateUID stands for the template's host uid (HostIDBase+1).
const templateUID = 1_900_001

// cloneIntoChain is the "tplchain" role: uid templateUID, in the template's
// leaf, starts F ("tplf") in a user namespace of its own (and, with
// V2VM_CGROUPNS=1, a cgroup namespace rooted at the leaf), passing fd 3.
func cloneIntoChain() {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), childRoleEnv+"=tplf")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{os.NewFile(3, "cgroup")}
	flags := uintptr(unix.CLONE_NEWUSER)
	if os.Getenv("V2VM_CGROUPNS") == "1" {
		flags |= unix.CLONE_NEWCGROUP
	}
	uid := os.Getuid()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}}
	if err := cmd.Run(); err != nil {
		fmt.Println("chain:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// cloneIntoF is the "tplf" role: clone3(CLONE_NEWPID|CLONE_INTO_CGROUP)
// with fd 3 (Go's UseCgroupFD is clone3 with CLONE_INTO_CGROUP), and where
// ".." of fd 3 leads.
func cloneIntoF() {
	if fd, err := unix.Openat(3, "..", unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		fmt.Printf("dotdot: ino %d\n", st.Ino)
	} else {
		fmt.Printf("dotdot: %v\n", err)
	}
	// Far up: the cgroup root's parent mount (/sys), or the clone's root.
	if fd, err := unix.Openat(3, "../../../../../../../../..", unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		fmt.Printf("far: magic %#x ino %d\n", statfsType(fd), st.Ino)
	} else {
		fmt.Printf("far: %v\n", err)
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), childRoleEnv+"=tplg")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: 3, Cloneflags: unix.CLONE_NEWPID}
	if err := cmd.Run(); err != nil {
		fmt.Printf("clone3: %s\n", errName(err))
		os.Exit(0)
	}
	fmt.Println("clone3: ok")
	os.Exit(0)
}

// cloneIntoG is the "tplg" role: says where it is.
func cloneIntoG() {
	b, _ := os.ReadFile("/proc/self/cgroup")
	fmt.Printf("g: pid %d cgroup %s\n", os.Getpid(), strings.TrimSpace(string(b)))
	os.Exit(0)
}

func statfsType(fd int) int64 {
	var st unix.Statfs_t
	unix.Fstatfs(fd, &st)
	return st.Type
}

func errName(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

func TestCloneIntoCgroupPermissions(t *testing.T) {
	requireV2(t)
	parent := testParent(t)
	tpl := leaf(t, parent, "tpl")
	writeFile(t, filepath.Join(tpl, "cgroup.subtree_control"), "+cpu +memory +pids")
	leafT := leaf(t, tpl, "template")
	var tplIno, sbxIno uint64
	for _, c := range []struct {
		name string
		// chown: which cgroup.procs belong to the template's uid.
		chownTpl, chownSbx bool
		openTree, cgroupNS bool
		// readOnly: the detached mount made read-only (mount_setattr
		// MOUNT_ATTR_RDONLY), as nsjail's PrepareShell does.
		readOnly bool
		want     string // clone3's answer
	}{
		{"owned, plain fd", true, true, false, false, false, "ok"},
		{"owned, detached mount", true, true, true, false, false, "ok"},
		{"owned, read-only detached mount", true, true, true, false, true, "ok"},
		{"not owned", false, false, true, false, true, "EACCES"},
		{"only the destination owned", false, true, true, false, true, "EACCES"},
		{"only the ancestor owned", true, false, true, false, true, "EACCES"},
		{"owned, F's cgroup namespace at its leaf", true, true, true, true, true, "ENOENT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sbx := leaf(t, tpl, "sbx")
			defer func() {
				if err := unix.Rmdir(sbx); err != nil {
					t.Errorf("rmdir %s: %v", sbx, err)
				}
			}()
			own := func(dir string, yes bool) {
				uid := 0
				if yes {
					uid = templateUID
				}
				if err := os.Chown(filepath.Join(dir, "cgroup.procs"), uid, uid); err != nil {
					t.Fatal(err)
				}
			}
			own(tpl, c.chownTpl)
			own(sbx, c.chownSbx)
			var st unix.Stat_t
			unix.Stat(tpl, &st)
			tplIno = st.Ino
			unix.Stat(sbx, &st)
			sbxIno = st.Ino
			var cgfd int
			var err error
			if c.openTree {
				cgfd, err = unix.OpenTree(unix.AT_FDCWD, sbx, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
			} else {
				cgfd, err = unix.Open(sbx, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			cgf := os.NewFile(uintptr(cgfd), "sbx")
			defer cgf.Close()
			if c.readOnly {
				makeReadOnly(t, cgfd)
			}
			cmd := selfAs("tplchain")
			if c.cgroupNS {
				cmd.Env = append(cmd.Env, "V2VM_CGROUPNS=1")
			}
			cmd.ExtraFiles = []*os.File{cgf}
			fd, err := unix.Open(leafT, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd,
				Credential: &syscall.Credential{Uid: templateUID, Gid: templateUID}}
			out, err := cmd.CombinedOutput()
			t.Logf("E7 %s (tpl ino %d, sbx ino %d):\n%s", c.name, tplIno, sbxIno, out)
			if err != nil {
				t.Fatalf("chain: %v", err)
			}
			got := ""
			for _, l := range strings.Split(string(out), "\n") {
				if v, ok := strings.CutPrefix(l, "clone3: "); ok {
					got = v
				}
			}
			if got != c.want {
				t.Errorf("clone3: %q, want %q", got, c.want)
			}
			if got == "ok" && !strings.Contains(string(out), "g: pid 1 cgroup 0::/") {
				t.Errorf("G not pid 1 of its own pid namespace")
			}
			dotdot := "dotdot: ino " + strconv.FormatUint(tplIno, 10)
			if c.openTree {
				dotdot = "dotdot: ino " + strconv.FormatUint(sbxIno, 10)
			}
			if !strings.Contains(string(out), dotdot) {
				t.Errorf("want %q", dotdot)
			}
			// A plain fd walks out of cgroupfs; the detached mount stays.
			inCgroupfs := strings.Contains(string(out), fmt.Sprintf("far: magic %#x ino %d", unix.CGROUP2_SUPER_MAGIC, sbxIno))
			if c.openTree != inCgroupfs {
				t.Errorf("far up through the fd: want sbx itself only with a detached mount")
			}
		})
	}
}

// keptProcsFD is the "tplkeep" role: a template that kept a prepared
// shell's cgroup.procs. It opens "cgroup.procs" through fd 3 (the detached
// mount), says "opened", waits for a line on stdin and then writes its own
// pid through the fd it opened earlier: "write: ok" or the errno.
func keptProcsFD() {
	fd, err := unix.Openat(3, "cgroup.procs", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Printf("open: %s\n", errName(err))
		os.Exit(0)
	}
	fmt.Println("opened")
	var line string
	fmt.Scanln(&line)
	if _, err := unix.Write(fd, []byte(strconv.Itoa(os.Getpid()))); err != nil {
		fmt.Printf("write: %s\n", errName(err))
		os.Exit(0)
	}
	fmt.Println("write: ok")
	os.Exit(0)
}

// SECURITY.md case 70, the fix of the 2026-12-03 cold review: the kernel
// checks write access to the destination's cgroup.procs when it is opened,
// but the common ancestor's at every write, with the opener's credentials
// (__cgroup_procs_write: override_creds(of->file->f_cred)). So a template
// that kept a prepared shell's cgroup.procs open can move processes into
// that shell whenever tpl/cgroup.procs is its: until the fork is done, and
// again at every later fork, when the worker hands tpl/cgroup.procs back to
// it (nsjail PreparedShell.endFork gives it back to root in between). So
// nsjail's PrepareShell makes the detached mount read-only: no file can be
// opened for writing through it (EROFS), while clone3 CLONE_INTO_CGROUP
// through it still works (TestCloneIntoCgroupPermissions' read-only case).
func TestKeptCgroupProcsFD(t *testing.T) {
	requireV2(t)
	parent := testParent(t)
	tpl := leaf(t, parent, "tpl")
	leafT := leaf(t, tpl, "template")
	for _, c := range []struct {
		name     string
		readOnly bool // the detached mount read-only, as PrepareShell makes it
		takeTpl  bool // tpl/cgroup.procs back to root between open and write
		want     string
	}{
		// The fd works while tpl/cgroup.procs is the template's, at this
		// fork or, once handed back to it, at any later one: why
		// PrepareShell makes the mount read-only.
		{"ancestor still the template's", false, false, "write: ok"},
		{"ancestor taken back", false, true, "write: EACCES"},
		{"read-only mount", true, false, "open: EROFS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sbx := leaf(t, tpl, "sbx")
			defer func() {
				// The "ok" case moved the child into sbx: reaped by now
				// (cmd.Wait, deferred later, runs first).
				if err := unix.Rmdir(sbx); err != nil {
					t.Errorf("rmdir %s: %v", sbx, err)
				}
			}()
			for _, d := range []string{tpl, sbx} {
				if err := os.Chown(filepath.Join(d, "cgroup.procs"), templateUID, templateUID); err != nil {
					t.Fatal(err)
				}
			}
			cgfd, err := unix.OpenTree(unix.AT_FDCWD, sbx, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			cgf := os.NewFile(uintptr(cgfd), "sbx")
			defer cgf.Close()
			if c.readOnly {
				makeReadOnly(t, cgfd)
			}
			fd, err := unix.Open(leafT, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			cmd := selfAs("tplkeep")
			cmd.ExtraFiles = []*os.File{cgf}
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd,
				Credential: &syscall.Credential{Uid: templateUID, Gid: templateUID}}
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer stdin.Close() // before the Wait: the child reads a line
			lines := bufio.NewScanner(stdout)
			lines.Scan()
			got := lines.Text()
			if got == "opened" {
				if c.takeTpl {
					if err := os.Chown(filepath.Join(tpl, "cgroup.procs"), 0, 0); err != nil {
						t.Fatal(err)
					}
				}
				fmt.Fprintln(stdin, "go")
				lines.Scan()
				got = lines.Text()
			}
			t.Logf("kept fd, %s: %s", c.name, got)
			if got != c.want {
				t.Errorf("the kept fd: %q, want %q", got, c.want)
			}
		})
	}
}

// makeReadOnly makes the detached mount fd read-only (mount_setattr
// MOUNT_ATTR_RDONLY), as nsjail's PrepareShell does.
func makeReadOnly(t *testing.T, fd int) {
	t.Helper()
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		t.Fatal(err)
	}
}
