package volume_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/server/volume"
)

// BenchmarkCreate is the time to create and mount one empty default volume
// (500 MiB, 10,000 files; its Remove is not timed), and reports the host
// disk its image takes.
func BenchmarkCreate(b *testing.B) {
	requireRoot(b)
	for _, prealloc := range []bool{false, true} {
		b.Run(fmt.Sprintf("preallocate=%v", prealloc), func(b *testing.B) {
			parent, err := os.MkdirTemp(testRoot, "bench-")
			if err != nil {
				b.Fatal(err)
			}
			defer os.Remove(parent)
			var kib int64
			i := 0
			for b.Loop() {
				dir := filepath.Join(parent, fmt.Sprint(i))
				i++
				v, err := volume.Create(dir, volume.Options{UID: testUID, GID: testGID, Preallocate: prealloc})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				kib = duKiB(b, filepath.Join(dir, "volume.img"))
				if err := v.Remove(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(kib), "image-KiB")
		})
	}
}

// BenchmarkOpenUnmounted is a worker restart after Close or a reboot:
// e2fsck -p of a clean image, attach, mount.
func BenchmarkOpenUnmounted(b *testing.B) {
	v := newVolume(b, volume.Options{})
	for b.Loop() {
		b.StopTimer()
		if err := v.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := volume.Open(v.Dir()); err != nil {
			b.Fatal(err)
		}
	}
}
