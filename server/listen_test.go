package server

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// otherGroup returns a group of this host other than root: name and gid.
func otherGroup(t *testing.T) (string, int) {
	t.Helper()
	data, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 3 {
			continue
		}
		if gid, err := strconv.Atoi(f[2]); err == nil && gid != 0 {
			return f[0], gid
		}
	}
	t.Skip("no group other than root in /etc/group")
	return "", 0
}

// unixClient is an HTTP client that reaches sock whatever the URL's host.
func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

// worker_socket: the same API on a unix socket with the configured group
// and mode. Any Host passes there (no browser reaches a unix socket, so no
// DNS rebinding); the same Host over TCP is refused; Origin is refused on
// both.
func TestUnixSocketServesTheAPI(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	group, gid := otherGroup(t)
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := ListenUnix(sock, group, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	hs := e.srv.HTTPServer(nil)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var st syscall.Stat_t
	if err := syscall.Lstat(sock, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || st.Mode&0o7777 != 0o660 || int(st.Gid) != gid {
		t.Fatalf("socket mode %o gid %d, want a socket 0660 gid %d", st.Mode, st.Gid, gid)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(sock), ".sandboxd-sock-*")); len(left) > 0 {
		t.Fatalf("private directory left: %v", left)
	}

	client := unixClient(sock)
	get := func(host string, hdr ...string) (int, string) {
		req, _ := http.NewRequest("GET", "http://localhost/v1/policies", nil)
		req.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, host := range []string{"localhost", "unix", "%2Frun%2Fsandboxd%2Fapi.sock", "evil.example"} {
		if code, body := get(host); code != 200 {
			t.Errorf("Host %q over the socket: %d %s", host, code, body)
		}
		if host != "localhost" {
			if code, _, _ := e.do("GET", "/v1/policies", nil, "Host", host); code != http.StatusForbidden {
				t.Errorf("Host %q over TCP: %d, want 403", host, code)
			}
		}
	}
	// An empty Host (HTTP/1.0 without one).
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /healthz HTTP/1.0\r\n\r\n")
	if code, body := readResponse(t, c); code != 200 {
		t.Errorf("no Host over the socket: %d %s", code, body)
	}
	c.Close()
	if code, _ := get("localhost", "Origin", "http://localhost"); code != http.StatusForbidden {
		t.Errorf("Origin over the socket: %d, want 403", code)
	}
	resp, err := client.Post("http://unix/v1/executions", "application/json", strings.NewReader(`{"code":"echo via-socket"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"stdout":"via-socket\n"`) {
		t.Fatalf("execution over the socket: %d %s", resp.StatusCode, body)
	}

	// A second worker must not take a live socket away.
	if _, err := ListenUnix(sock, "", 0o660); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("listen on a live socket: %v", err)
	}
	if err := hs.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left after shutdown: %v", err)
	}
}

// A stale socket (a killed worker's) is replaced; a regular file, a
// directory or a symlink at the path is an error and is left as it was.
func TestListenUnixStaleAndForeignFiles(t *testing.T) {
	nsjailtest.RequireRoot(t)
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ln, err := ListenUnix(stale, "", 0o600)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(stale, &st); err != nil || st.Mode&0o7777 != 0o600 {
		t.Fatalf("mode %o: %v", st.Mode, err)
	}
	ln.Close()
	if _, err := os.Lstat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}

	file := filepath.Join(dir, "file.sock")
	os.WriteFile(file, []byte("precious"), 0o600)
	os.Mkdir(filepath.Join(dir, "dir.sock"), 0o700)
	os.Symlink(file, filepath.Join(dir, "link.sock"))
	for _, name := range []string{"file.sock", "dir.sock", "link.sock"} {
		if _, err := ListenUnix(filepath.Join(dir, name), "", 0o660); err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != "precious" {
		t.Fatalf("regular file touched: %q %v", data, err)
	}
	if _, err := ListenUnix(filepath.Join(dir, "x.sock"), "no-such-group-sandboxd", 0o660); err == nil || !strings.Contains(err.Error(), "worker_socket_group") {
		t.Errorf("unknown group: %v", err)
	}
}

// SECURITY.md case 32 (the socket's set-up): a socket directory where
// someone else could swap the new socket for a symlink (and have root chmod
// and chown whatever it names) is refused, before anything is bound in it;
// a sticky one (like /tmp) is fine. The socket's final path may use all of
// sun_path: it is bound under a short private name first.
func TestListenUnixRefusesAnUnsafeDirectory(t *testing.T) {
	nsjailtest.RequireRoot(t)
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	os.WriteFile(victim, []byte("x"), 0o600)
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o777) // past the umask
	os.Symlink(victim, filepath.Join(open, "api.sock.new"))
	if _, err := ListenUnix(filepath.Join(open, "api.sock"), "", 0o660); err == nil || !strings.Contains(err.Error(), "without the sticky bit") {
		t.Fatalf("a world-writable socket directory: %v", err)
	}
	if entries, _ := os.ReadDir(open); len(entries) != 1 {
		t.Fatalf("something was created in the refused directory: %v", entries)
	}
	if fi, _ := os.Stat(victim); fi.Mode().Perm() != 0o600 {
		t.Fatalf("the victim's mode changed: %v", fi.Mode())
	}

	sticky := filepath.Join(dir, "sticky")
	os.Mkdir(sticky, 0o755)
	os.Chmod(sticky, 0o777|os.ModeSticky)
	long := filepath.Join(sticky, strings.Repeat("s", 107-len(sticky)-1))
	ln, err := ListenUnix(long, "", 0o660)
	if err != nil {
		t.Fatalf("a sticky directory, a %d-byte path: %v", len(long), err)
	}
	defer ln.Close()
	var st syscall.Stat_t
	if err := syscall.Lstat(long, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || st.Mode&0o7777 != 0o660 {
		t.Fatalf("socket mode %o: %v", st.Mode, err)
	}
	c, err := net.Dial("unix", long)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if entries, _ := os.ReadDir(sticky); len(entries) != 1 {
		t.Fatalf("left in the socket's directory: %v", entries)
	}
}
