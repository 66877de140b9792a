//go:build cgo && seccomp

package seccomp

import "testing"

// BenchmarkLibcontainer is what the worker pays per sandbox to produce the
// configs.Seccomp (validation included).
func BenchmarkLibcontainer(b *testing.B) {
	p := Default()
	for b.Loop() {
		if _, err := p.Libcontainer(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompileBPF approximates what runc's init pays before loading:
// building the libseccomp filter from the config and generating its BPF.
func BenchmarkCompileBPF(b *testing.B) {
	p := Default()
	native, err := NativeArch()
	if err != nil {
		b.Skip(err)
	}
	for b.Loop() {
		if _, err := p.BPF(native); err != nil {
			b.Fatal(err)
		}
	}
}
