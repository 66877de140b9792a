package volume

import "os"

// SetCrashPoint makes the process exit with code 3 at the named stage of
// Create ("create": built and mounted, not yet renamed into place) or Remove
// ("remove": renamed away, not yet deleted), as if the worker were killed.
func SetCrashPoint(stage string) {
	crashPoint = func(s, dir string) {
		if s == stage {
			os.Exit(3)
		}
	}
}

// ImageSize exposes the sizing rule to the tests.
func ImageSize(maxBytes, maxFiles int64) int64 {
	return imageSize(meta{MaxBytes: maxBytes, MaxFiles: maxFiles})
}
