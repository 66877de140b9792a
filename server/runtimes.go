package server

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/rootfs"
	"github.com/sandboxd/sandboxd/server/config"
)

// A runtime is a named image of the operator's config (`runtimes`): a
// policy runs on its own (dynamic_runtime, skill_runtime) unless a request
// names another. A request only ever names one: the image, its reference
// and its rootfs are the operator's (SECURITY.md case 57).

// preparedRuntime is one runtime once Prepare resolved it.
type preparedRuntime struct {
	name, ref string
	// image is the unpacked image: its rootfs, digest and labels.
	image  rootfs.Image
	python string // interpreter name found in the rootfs
}

// Label names of the runtime images' package versions (set by
// tools/runtime-image): org.debian.package.NAME = VERSION.
const (
	packageLabel = "org.debian.package."
	pythonLabel  = packageLabel + "python3"
)

// RuntimeView is one runtime as GET /v1/runtimes shows it: what an agent
// can import there, from the image's labels (empty for an image without
// them, such as a dir: rootfs).
type RuntimeView struct {
	Name    string `json:"name"`
	Default bool   `json:"default"`
	Image   string `json:"image"`
	Digest  string `json:"digest"`
	// Python is the python3 package's version.
	Python   string            `json:"python"`
	Packages map[string]string `json:"packages"`
}

// runtimesResponse is the body of GET /v1/runtimes.
type runtimesResponse struct {
	Runtimes []RuntimeView `json:"runtimes"`
}

func (r *preparedRuntime) view() RuntimeView {
	v := RuntimeView{Name: r.name, Default: r.name == config.DefaultRuntime, Image: r.ref, Digest: r.image.Digest,
		Python: r.image.Labels[pythonLabel], Packages: map[string]string{}}
	for k, val := range r.image.Labels {
		if name, ok := strings.CutPrefix(k, packageLabel); ok && name != "" {
			v.Packages[name] = val
		}
	}
	return v
}

// handleRuntimes lists the runtimes, sorted by name; 503 until Prepare
// resolved them (their versions are the images').
func (s *Server) handleRuntimes(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	if e := s.readyOr503(); e != nil {
		writeAPIError(w, e)
		return
	}
	s.mu.Lock()
	out := runtimesResponse{Runtimes: make([]RuntimeView, 0, len(s.runtimes))}
	for _, r := range s.runtimes {
		out.Runtimes = append(out.Runtimes, r.view())
	}
	s.mu.Unlock()
	sort.Slice(out.Runtimes, func(i, j int) bool { return out.Runtimes[i].Name < out.Runtimes[j].Name })
	writeJSON(w, http.StatusOK, out)
}

// runtimeFor is the runtime a request of pol runs on: the one it names,
// which must be in the config, else the policy's. The name is only ever
// looked up, never used as a path or a reference.
func (s *Server) runtimeFor(pol Policy, name string) (string, *apiError) {
	if name == "" {
		return pol.Runtime, nil
	}
	if _, ok := s.cfg.RuntimeImages()[name]; !ok {
		return "", badRequest("unknown runtime %q: want one of %v", clip(name), s.cfg.RuntimeNames())
	}
	return name, nil
}

// resolveRuntimes resolves every runtime of the config (unpacking what
// the cache lacks), the default first, and checks each rootfs; the first
// failure names its runtime.
func (s *Server) resolveRuntimes(ctx context.Context) (map[string]*preparedRuntime, error) {
	images := s.cfg.RuntimeImages()
	names := s.cfg.RuntimeNames()
	sort.SliceStable(names, func(i, j int) bool { return names[i] == config.DefaultRuntime && names[j] != config.DefaultRuntime })
	out := make(map[string]*preparedRuntime, len(names))
	for _, name := range names {
		ref := images[name]
		img, err := s.resolve(ctx, name, ref)
		if err == nil {
			err = checkReachable(img.RootfsPath)
		}
		if err != nil {
			return nil, fmt.Errorf("runtime %q (%s): %w", name, ref, err)
		}
		out[name] = &preparedRuntime{name: name, ref: ref, image: img, python: findPython(img.RootfsPath)}
	}
	return out, nil
}

// runtimeOr503 is the runtime name's rootfs and interpreter, or the 503 of
// a worker not ready.
func (s *Server) runtimeOr503(name string) (rootfs, python string, e *apiError) {
	if e := s.readyOr503(); e != nil {
		return "", "", e
	}
	s.mu.Lock()
	r := s.runtimes[name]
	s.mu.Unlock()
	if r == nil {
		// A backstop: requests of a session on a runtime gone from the
		// config are refused before anything is claimed (runtimeGone).
		return "", "", s.runtimeGone(name)
	}
	return r.image.RootfsPath, r.python, nil
}

// runtimeGone is nil if the config has the runtime name, else the 409
// runtime_gone of a session created under a runtime that a restarted
// worker's config no longer has: nothing can run there until the operator
// configures it again, and retrying does not help (so not a 503). The
// session's files can still be read and the session deleted. Checked from
// the config, so it holds before Prepare too.
func (s *Server) runtimeGone(name string) *apiError {
	if _, ok := s.cfg.RuntimeImages()[name]; ok {
		return nil
	}
	return &apiError{status: http.StatusConflict, reason: "runtime_gone", code: "runtime_gone",
		msg: fmt.Sprintf("runtime %q is not configured on this worker (want one of %v): nothing ran; the session's files can still be read", clip(name), s.cfg.RuntimeNames())}
}
