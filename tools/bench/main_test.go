package main

import (
	"os"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// TestMain removes the rootfs copy the tests made in the temporary
// directory (nsjailtest.BusyboxRootfs), which every run would otherwise
// leave behind.
func TestMain(m *testing.M) {
	code := m.Run()
	nsjailtest.RemoveRootfsCopies()
	os.Exit(code)
}
