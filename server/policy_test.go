package server

import (
	"os"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/stream"
)

// config.ReservedEnv, which allowed_env may not name, must cover every
// variable the worker sets; LANG alone is a default a request may change.
func TestBaseEnvIsReserved(t *testing.T) {
	for _, pol := range PoliciesFromConfig(config.Default()) {
		for _, kv := range pol.BaseEnv() {
			name, _, _ := strings.Cut(kv, "=")
			if name != "LANG" && !config.ReservedEnv[name] {
				t.Errorf("policy %s sets %s, which config.ReservedEnv lacks", pol.Name, name)
			}
		}
	}
}

// The warm pool serves a request only if the Spec the server builds for it
// matches the template the server builds for its policy: every request
// without env does (whatever its timeout), one with env has the shape but
// not the environment (it runs cold, counted), and neither matches the
// other policy's template.
func TestRequestSpecsMatchTheirPolicyTemplate(t *testing.T) {
	cfg := config.Default()
	s := &Server{cfg: cfg, policies: PoliciesFromConfig(cfg), streams: stream.NewRegistry(stream.DefaultLimits, finishedStreams, streamLinger)}
	const rootfs = "/rootfs"
	for _, name := range s.policies.Names() {
		for _, tc := range []struct {
			timeoutMS int64
			env       map[string]string
			wantEnv   bool
		}{{0, nil, true}, {5, nil, true}, {0, map[string]string{"TZ": "UTC"}, false}, {0, map[string]string{"LANG": "C"}, false}} {
			p, e := s.validate(&ExecutionRequest{Type: name, Code: "print(1)", TimeoutMS: tc.timeoutMS, Env: tc.env})
			if e != nil {
				t.Fatal(e)
			}
			spec := s.spec(p, rootfs, findPython(rootfs), "/work/exec-x", os.Stdin, nil)
			for _, other := range s.policies.Names() {
				shape, env := s.policies[other].Template(cfg, rootfs).Matches(&spec)
				if want := other == name; shape != want || env != (want && tc.wantEnv) {
					t.Errorf("%s request (timeout %d, env %v) on the %s template: shape %v env %v", name, tc.timeoutMS, tc.env, other, shape, env)
				}
			}
		}
	}
}
