package rootfs

import "time"

// ProgressStage says what a Progress report is about.
type ProgressStage int

const (
	// ProgressStart: the manifest and config are verified; Layers and
	// BlobTotal are known.
	ProgressStart ProgressStage = iota
	// ProgressLayer: layer Layer (1-based) starts.
	ProgressLayer
	// ProgressUpdate: one more entry was applied (sent for every entry;
	// whoever draws them throttles).
	ProgressUpdate
	// ProgressLayerDone: layer Layer is applied and both its digests match.
	ProgressLayerDone
	// ProgressSync: the tree is complete and being flushed to disk.
	ProgressSync
	// ProgressPublished: the tree was renamed into place.
	ProgressPublished
)

// String names the stage for log lines.
func (s ProgressStage) String() string {
	switch s {
	case ProgressStart:
		return "start"
	case ProgressLayer:
		return "layer"
	case ProgressUpdate:
		return "update"
	case ProgressLayerDone:
		return "layer-done"
	case ProgressSync:
		return "sync"
	case ProgressPublished:
		return "published"
	}
	return "unknown"
}

// Progress is one report on an unpack in progress (Cache.Progress). Nothing
// is reported for an image already in the cache.
type Progress struct {
	Stage  ProgressStage
	Digest string // the manifest digest being unpacked
	// Layer is the current layer, 1-based; Layers how many there are.
	Layer, Layers int
	// BlobBytes of BlobTotal compressed bytes have been read, over all
	// layers: the only measure of the whole known before the end, so the
	// one for a percentage and an ETA.
	BlobBytes, BlobTotal int64
	// TarBytes (uncompressed) and Entries applied so far, all layers.
	TarBytes, Entries int64
	// Elapsed since the unpack started.
	Elapsed time.Duration
}

// report sends one Progress to the cache's observer, if any.
func (e *extractor) report(stage ProgressStage) {
	if e.progress == nil {
		return
	}
	blob := e.blobDone
	if e.blob != nil {
		blob += e.blob.n
	}
	e.progress(Progress{
		Stage: stage, Digest: e.digest, Layer: e.layer, Layers: e.layers,
		BlobBytes: blob, BlobTotal: e.blobTotal,
		TarBytes: e.streamBytes, Entries: e.entries,
		Elapsed: time.Since(e.start),
	})
}
