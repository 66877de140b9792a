package nsjail

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// A start its caller cancelled (a request gone, the pool closing) is
// logged as information, every other failure as an error; both return the
// StartError, the cause still in its chain.
func TestStartFailedLevel(t *testing.T) {
	for _, tc := range []struct {
		cause error
		level string
	}{
		{context.Canceled, "level=INFO"},
		{context.DeadlineExceeded, "level=ERROR"},
		{errors.New("runc init: exit status 1"), "level=ERROR"},
	} {
		var buf bytes.Buffer
		err := startFailed("sbx-1", slog.New(slog.NewTextHandler(&buf, nil)), "shell start failed", "ended: %w", tc.cause)
		var se *StartError
		if !errors.As(err, &se) || se.ID != "sbx-1" || !errors.Is(err, tc.cause) {
			t.Errorf("%v: returned %#v", tc.cause, err)
		}
		if !strings.Contains(buf.String(), tc.level) || !strings.Contains(buf.String(), "shell start failed") {
			t.Errorf("%v: logged %q, want %s", tc.cause, buf.String(), tc.level)
		}
	}
}
