package inside

import (
	"os"
	"path"
	"regexp"
	"strconv"
	"testing"
)

func TestLayout(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{CodeFile, "code/main.py"},
		{RequestFile, "input/request.json"},
		{ResultFile, "output/result.json"},
		{ArtifactsDir, "output/artifacts"},
		{Path(CodeFile), "/workspace/code/main.py"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	// Parents first, so that creating them in order needs no MkdirAll.
	seen := map[string]bool{".": true}
	for _, d := range LayoutDirs {
		if !seen[path.Dir(d)] {
			t.Errorf("LayoutDirs lists %s before its parent", d)
		}
		seen[d] = true
	}
	for _, f := range []string{CodeFile, RequestFile} {
		if !seen[path.Dir(f)] {
			t.Errorf("%s is not in a layout directory", f)
		}
	}
	if want := 1 + len(LayoutDirs) + 2; LayoutInodes != want {
		t.Errorf("LayoutInodes = %d, the root, %d directories and 2 files are %d", LayoutInodes, len(LayoutDirs), want)
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"a": true, "ex-0123abcd": true, "A.b_c-9": true, string(make([]byte, 64)): false,
		"x123456789012345678901234567890123456789012345678901234567890123":  true,  // 64
		"x1234567890123456789012345678901234567890123456789012345678901234": false, // 65
		"": false, "-a": false, ".a": false, "_a": false, "a/b": false, "a b": false, "..": false, "é": false, "a\n": false,
	} {
		if ValidID(id) != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, !want, want)
		}
	}
}

// Shell scripts cannot import the constants: they repeat the sandbox user,
// and must agree with UID and GID. Each must be found, so a script rewritten
// another way fails here instead of passing unchecked.
func TestScriptsAgreeOnTheSandboxUser(t *testing.T) {
	passwd := regexp.MustCompile(`sandbox:x:(\d+):(\d+):`)
	group := regexp.MustCompile(`sandbox:x:(\d+):(?:'|\\n)`)
	for _, script := range []string{
		"../../tools/runtime-image/customize.sh", // the runtime image's /etc/passwd and /etc/group
		"../../tools/v2vm/run.sh",                // the cgroup v2 VM's test root
	} {
		data, err := os.ReadFile(script)
		if err != nil {
			t.Fatal(err)
		}
		p := passwd.FindAllSubmatch(data, -1)
		g := group.FindAllSubmatch(data, -1)
		if len(p) == 0 || len(g) == 0 {
			t.Errorf("%s: no sandbox passwd (%d) or group (%d) line", script, len(p), len(g))
		}
		for _, m := range p {
			if string(m[1]) != strconv.Itoa(UID) || string(m[2]) != strconv.Itoa(GID) {
				t.Errorf("%s: passwd line %s, want uid %d gid %d", script, m[0], UID, GID)
			}
		}
		for _, m := range g {
			if string(m[1]) != strconv.Itoa(GID) {
				t.Errorf("%s: group line %s, want gid %d", script, m[0], GID)
			}
		}
	}
}
