package rootfs

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// BenchmarkUnpackCached is the second unpack of a digest already in the
// cache: resolve the reference, find the published tree. Target: < 50 ms.
func BenchmarkUnpackCached(b *testing.B) {
	b.Run("busybox-oci-layout", func(b *testing.B) {
		w := newWorld(b)
		ref := "oci-layout:" + writeLayout(b, busyboxImage(b), "latest")
		benchCached(b, w.cache, ref)
	})
	b.Run("python-runtime", func(b *testing.B) {
		ref := nsjailtest.RuntimeImageRef(b)
		w := newWorld(b)
		benchCached(b, w.cache, ref)
	})
}

func benchCached(b *testing.B, c *Cache, ref string) {
	if _, err := c.Unpack(context.Background(), ref); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		img, err := c.Unpack(context.Background(), ref)
		if err != nil || !img.Cached {
			b.Fatalf("cached=%v err=%v", img.Cached, err)
		}
	}
}
