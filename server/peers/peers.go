// Package peers finds the other workers of a pool: which base URL serves
// the sessions of an owner token (server/sessionid), and whether that
// worker is ready. The server forwards a session's request there
// (server/forward.go). Two sources, chosen by the config's peers_source:
//
//   - Static: a fixed list worker_id = URL (VMs, tests). Every listed
//     worker counts as ready; a refused connection says otherwise.
//   - Kubernetes: the EndpointSlices of the workers' headless Service,
//     listed through the in-cluster API every peers_refresh (kubernetes.go).
//     An endpoint's nodeName is the worker's worker_id (the DaemonSet sets
//     worker_id to spec.nodeName), its conditions say ready or not.
package peers

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/sandboxd/sandboxd/server/sessionid"
)

// Peer is one worker.
type Peer struct {
	// WorkerID is the worker's worker_id (on Kubernetes its node's name).
	WorkerID string
	// URL is its base URL, http://HOST:PORT.
	URL string
	// Ready: it takes requests now. A listed worker that is not ready is
	// restarting or draining: come back later (503), not gone (410).
	Ready bool
	// Pod names its pod (Kubernetes only), for messages.
	Pod string
	// Ambiguous, when set, says why no one worker can be told to have the
	// token (two ready endpoints on its node, two nodes sharing it): it
	// is not forwarded to (503), never one picked (SECURITY.md case 59).
	Ambiguous string
}

// Status is what a lookup found.
type Status int

const (
	// Gone: no worker has the token, so its sessions cannot be reached
	// (410 owner_gone).
	Gone Status = iota
	// NotReady: the worker is listed but takes no requests now (503).
	NotReady
	// Ready: forward to Peer.URL.
	Ready
	// Unknown: the list cannot be read now, or has not lacked the token
	// long enough, so nothing is known to be gone (503).
	Unknown
	// Ambiguous: more than one worker claims the token (Peer.Ambiguous
	// says how); nothing is forwarded (503).
	Ambiguous
)

// Answer is a lookup's result: the peer (when listed), its status, and in
// words why, for the error a client reads.
type Answer struct {
	Peer   Peer
	Status Status
	Why    string
}

// Resolver finds the worker of an owner token.
type Resolver interface {
	// Lookup finds the worker whose sessionid.Token is token.
	Lookup(token string) Answer
	// Refresh re-reads the source now, after a connection to a peer was
	// refused (its address may have changed). It may return at once when
	// it read the source a moment ago.
	Refresh(ctx context.Context)
}

// Static is a fixed list of workers.
type Static struct {
	byToken map[string]Peer
}

// NewStatic builds the list from peers (worker_id → base URL, as validated
// by server/config). self is this worker's worker_id: its own entry may be
// in the list, but no two workers, self included, may share a token.
func NewStatic(self string, peers map[string]string) (*Static, error) {
	s := &Static{byToken: map[string]Peer{}}
	owners := map[string]string{sessionid.Token(self): self}
	for _, id := range slices.Sorted(maps.Keys(peers)) {
		tok := sessionid.Token(id)
		if other, ok := owners[tok]; ok && other != id {
			return nil, fmt.Errorf("peers: %s and %s have the same owner token %s (a SHA-256 prefix): rename one", other, id, tok)
		}
		owners[tok] = id
		s.byToken[tok] = Peer{WorkerID: id, URL: peers[id], Ready: true}
	}
	return s, nil
}

// Lookup finds the listed worker of token.
func (s *Static) Lookup(token string) Answer {
	if p, ok := s.byToken[token]; ok {
		return Answer{Peer: p, Status: Ready, Why: fmt.Sprintf("worker %s at %s", p.WorkerID, p.URL)}
	}
	return Answer{Status: Gone, Why: "no worker in this worker's peers list has that owner token"}
}

// Refresh does nothing: the list is the config's.
func (*Static) Refresh(context.Context) {}
