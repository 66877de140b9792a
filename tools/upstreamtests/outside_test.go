package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// The outside side must run as the sandbox user, in the workspace, with the
// request's environment only: otherwise "same outcome outside" compares
// against a different world.
func TestOutsideRunsAsTheSandboxUserInTheWorkspace(t *testing.T) {
	nsjailtest.RequireRoot(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	ws := t.TempDir()
	if err := os.Chmod(ws, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ws+"/marker", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := outsideCommand(ctx, rootfs, ws, []string{"sh", "-c", `echo "$(id -u):$(id -g) $(pwd) $(ls) ${FSIZE-unset}"`})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := fmt.Sprintf("%d:%d %s marker unset", inside.UID, inside.GID, inside.Workspace)
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("outside ran as %q, want %q", got, want)
	}
}
