package main

import (
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// TestMain removes the rootfs copy the tests made in the temporary directory
// (nsjailtest.BusyboxRootfs), which every run would otherwise leave behind.
func TestMain(m *testing.M) { nsjailtest.Main(m) }
