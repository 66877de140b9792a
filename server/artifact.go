package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/results"
)

// handleGetArtifact serves GET /v1/executions/{id}/artifacts/{name}: one
// artifact's bytes, streamed from the result store's part file (Range
// supported), without reading the rest of the answer: a client (the MCP
// resources among them) that wants one file of a 64 MB answer costs two
// buffers, not the answer decoded (SECURITY.md case 55).
func (s *Server) handleGetArtifact(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	name := strings.TrimPrefix(ps.ByName("name"), "/")
	notFound := fmt.Sprintf("no execution %q (unknown, or its result has expired)", clip(id))
	if !inside.ValidID(id) {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	if err := checkArtifactName(name); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rd, err := s.results.Open(id)
	switch {
	case errors.Is(err, results.ErrPending):
		writeError(w, http.StatusConflict, fmt.Sprintf("execution %q has not finished: its artifacts are served once it has", clip(id)))
		return
	case errors.Is(err, results.ErrNotFound):
		if _, live := s.live.get(id); live {
			writeError(w, http.StatusConflict, fmt.Sprintf("execution %q has not finished: its artifacts are served once it has", clip(id)))
			return
		}
		writeError(w, http.StatusNotFound, notFound)
		return
	case err != nil:
		s.writeStoreError(w, id, err)
		return
	}
	defer rd.Close()
	i, meta, err := findArtifact(rd, name)
	if err != nil {
		s.log.Error("stored answer not understood", "execution_id", clip(id), "err", err)
		writeError(w, http.StatusInternalServerError, "result store: "+clip(err.Error()))
		return
	}
	if i < 0 {
		writeError(w, http.StatusNotFound, fmt.Sprintf("execution %q returned no artifact %q (see its artifacts and artifacts_omitted)", clip(id), clip(name)))
		return
	}
	f, _, err := rd.OpenPart(i)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "result store: "+clip(err.Error()))
		return
	}
	defer f.Close()
	h := w.Header()
	if meta.SHA256 != "" {
		h.Set("ETag", `"`+meta.SHA256+`"`)
	}
	h.Set("Content-Type", meta.MediaType)
	h.Set("X-Content-Type-Options", "nosniff")
	// The sandboxed code wrote it: never rendered as a page (svg, html).
	h.Set("Content-Disposition", "attachment")
	h.Set("Content-Security-Policy", "sandbox")
	h.Set("Cache-Control", "no-cache")
	pw := &pacedWriter{ResponseWriter: w, pacer: newPacer(http.NewResponseController(w).SetWriteDeadline, time.Duration(s.cfg.WriteTimeout))}
	http.ServeContent(pw, r, "", time.Time{}, f)
}

// checkArtifactName refuses a name no artifact can have: artifacts are
// clean relative paths under output/artifacts/.
func checkArtifactName(name string) error {
	if name == "" || strings.ContainsRune(name, 0) || len(name) > 4096 {
		return fmt.Errorf("artifact name %q must be a relative path such as \"chart.png\"", clip(name))
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("artifact name %q must be a clean relative path (no empty, \".\" or \"..\" parts)", clip(name))
		}
	}
	return nil
}

// storedArtifact is an artifact's entry in a stored answer, without its
// content.
type storedArtifact struct {
	Name      string `json:"name"`
	MediaType string `json:"media_type"`
	SHA256    string `json:"sha256"`
}

// maxArtifactEntry bounds one artifact's entry (its fields before the
// content): a name of up to PATH_MAX bytes, each escaped to at most 6
// ("\u00XX"), and the other fields. A longer entry is a store not
// understood, never a reason to read more of the answer.
const maxArtifactEntry = 6*4096 + 1024

// findArtifact returns the index of the artifact called name in rd's
// answer (-1: none) and its entry, reading only the artifacts' entries:
// storedDocument writes the artifacts last, each entry
// {"name":...,"content_base64":"<hole>"}, so entry i ends at hole i and
// starts 3 bytes ("},) after hole i-1, or, for the first, at the last
// {"name":" before hole 0 (a bare quote never occurs inside a JSON string,
// so that text only starts an entry).
func findArtifact(rd *results.Reader, name string) (int, storedArtifact, error) {
	text := rd.Text()
	for i, hole := range rd.Holes() {
		var start int64
		if i == 0 {
			from := max(0, hole-maxArtifactEntry)
			win := make([]byte, hole-from)
			if _, err := text.ReadAt(win, from); err != nil {
				return -1, storedArtifact{}, fmt.Errorf("reading the answer: %w", err)
			}
			k := bytes.LastIndex(win, []byte(`{"name":"`))
			if k < 0 {
				return -1, storedArtifact{}, errors.New("no artifact entry before the first artifact's content")
			}
			start = from + int64(k)
		} else {
			start = rd.Holes()[i-1] + int64(len(`"},`))
		}
		if hole-start > maxArtifactEntry || hole < start {
			return -1, storedArtifact{}, fmt.Errorf("artifact entry %d is not understood", i)
		}
		entry := make([]byte, hole-start, hole-start+2)
		if _, err := text.ReadAt(entry, start); err != nil && !(errors.Is(err, io.EOF) && len(entry) == 0) {
			return -1, storedArtifact{}, fmt.Errorf("reading the answer: %w", err)
		}
		var a storedArtifact
		if err := json.Unmarshal(append(entry, `"}`...), &a); err != nil {
			return -1, storedArtifact{}, fmt.Errorf("artifact entry %d: %w", i, err)
		}
		if a.Name == name {
			return i, a, nil
		}
	}
	return -1, storedArtifact{}, nil
}
