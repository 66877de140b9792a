package main

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/rootfs"
)

// unpackProgress returns a rootfs.Cache.Progress func that draws the status
// line on m (a terminal only: m ignores it elsewhere) and hands every other
// stage to stage: one line each, for a terminal and for logs alike.
func unpackProgress(m *progress.Meter, stage func(rootfs.Progress)) func(rootfs.Progress) {
	return func(p rootfs.Progress) {
		if p.Stage == rootfs.ProgressUpdate {
			m.Status(progress.Status{
				Label: fmt.Sprintf("unpack layer %d/%d", p.Layer, p.Layers),
				Done:  p.BlobBytes, Total: p.BlobTotal,
				Bytes: p.TarBytes, Entries: p.Entries, Elapsed: p.Elapsed,
			})
			return
		}
		m.Clear()
		stage(p)
	}
}

// describeUnpack is the one line `sandboxd image unpack` prints per stage.
func describeUnpack(p rootfs.Progress) string {
	short := strings.TrimPrefix(p.Digest, "sha256:")
	short = short[:min(12, len(short))]
	switch p.Stage {
	case rootfs.ProgressStart:
		return fmt.Sprintf("unpack %s: %d layer(s), %s compressed", short, p.Layers, progress.Bytes(p.BlobTotal))
	case rootfs.ProgressLayer:
		return fmt.Sprintf("unpack %s: layer %d/%d", short, p.Layer, p.Layers)
	case rootfs.ProgressLayerDone:
		return fmt.Sprintf("unpack %s: layer %d/%d verified: %d entries, %s of tar (%s)", short, p.Layer, p.Layers,
			p.Entries, progress.Bytes(p.TarBytes), p.Elapsed.Round(100*time.Millisecond))
	case rootfs.ProgressSync:
		return fmt.Sprintf("unpack %s: syncing to disk (%s)", short, p.Elapsed.Round(100*time.Millisecond))
	case rootfs.ProgressPublished:
		return fmt.Sprintf("unpack %s: published (%s)", short, p.Elapsed.Round(100*time.Millisecond))
	}
	return fmt.Sprintf("unpack %s: %s", short, p.Stage)
}

// logUnpack is serve's line per stage: one structured log record.
func logUnpack(log *slog.Logger) func(rootfs.Progress) {
	return func(p rootfs.Progress) {
		log.Info("unpacking runtime image", "stage", p.Stage.String(), "digest", p.Digest,
			"layer", p.Layer, "layers", p.Layers, "blob_bytes", p.BlobBytes, "blob_total", p.BlobTotal,
			"tar_bytes", p.TarBytes, "entries", p.Entries, "elapsed_ms", p.Elapsed.Milliseconds())
	}
}
