package server

// Forwarding's own decisions without root: the server runs on a fake
// sandbox with a fake peer list, and the "owner" is a plain HTTP server
// that records what reached it.

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/peers"
	"github.com/sandboxd/sandboxd/server/sessionid"
)

// movingPeer is a peer list whose one worker moves to a new address when
// it is refreshed, as a restarted pod does.
type movingPeer struct {
	mu        sync.Mutex
	url, next string
	refreshes int
}

func (m *movingPeer) Lookup(string) peers.Answer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return peers.Answer{Peer: peers.Peer{WorkerID: "worker-b", URL: m.url, Ready: true}, Status: peers.Ready}
}

func (m *movingPeer) Refresh(context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refreshes++
	m.url = m.next
}

// refusingURL is an address where nothing listens.
func refusingURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return "http://" + ln.Addr().String()
}

// TestForwardRetriesAfterReresolving: the owner's old address refuses the
// connection; its address is looked up again and the request, body and
// all, goes to the new one, once, with the owner's Host, the client's
// token and the marker.
func TestForwardRetriesAfterReresolving(t *testing.T) {
	type seen struct{ host, auth, marker, body, path string }
	got := make(chan seen, 2)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Host, r.Header.Get("Authorization"), r.Header.Get(ForwardedHeader), string(b), r.URL.RequestURI()}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "from the owner")
	}))
	defer owner.Close()
	u := newUnitEnv(t, false, func(c *config.Config) {
		c.WorkerID, c.WorkerToken, c.PeersSource = "worker-a", "tok", config.PeersStatic
		c.Peers = map[string]string{"worker-b": "http://127.0.0.1:1"}
	})
	u.token = "tok"
	mp := &movingPeer{url: refusingURL(t), next: owner.URL}
	u.srv.fwd.peers = mp
	id := sessionid.New(sessionid.Token("worker-b"))
	code, _, body := u.do("PUT", "/v1/sessions/"+id+"/files/a%20b.csv?x=1", "col\n1\n")
	if code != http.StatusCreated || string(body) != "from the owner" {
		t.Fatalf("PUT through the forwarder: %d %s\n%s", code, body, u.logs)
	}
	s := <-got
	want := seen{"localhost", "Bearer tok", "worker-a", "col\n1\n", "/v1/sessions/" + id + "/files/a%20b.csv?x=1"}
	if s != want {
		t.Fatalf("the owner got %+v, want %+v", s, want)
	}
	if mp.refreshes != 1 || len(got) != 0 {
		t.Fatalf("%d refreshes, %d more requests: want one of each", mp.refreshes, len(got))
	}
}

// TestForwardStates: what the forwarder answers by itself, and that
// another owner's session is never served from the local manager.
func TestForwardStates(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) {
		c.WorkerID, c.PeersSource = "worker-a", config.PeersStatic
		c.Peers = map[string]string{"worker-a": "http://127.0.0.1:1", "worker-b": refusingURL(t)}
	})
	for _, c := range []struct {
		name, id, hdr string
		status        int
		code          string
	}{
		{"unknown owner", sessionid.New(sessionid.Token("worker-x")), "", http.StatusGone, "owner_gone"},
		{"owner down", sessionid.New(sessionid.Token("worker-b")), "", http.StatusServiceUnavailable, "owner_unavailable"},
		{"marked", sessionid.New(sessionid.Token("worker-b")), "worker-c", http.StatusGone, "forward_loop"},
		// Served here: this worker's own token, no owner, a client's name.
		{"own", sessionid.New(sessionid.Token("worker-a")), "worker-c", http.StatusNotFound, ""},
		{"no owner", sessionid.New(""), "", http.StatusNotFound, ""},
		{"chosen", "analysis", "", http.StatusNotFound, ""},
		// Not an id by the rule: never forwarded, whatever it names.
		{"bad id", "se-" + sessionid.Token("worker-b") + "-%20x", "", http.StatusNotFound, ""},
	} {
		var hdr []string
		if c.hdr != "" {
			hdr = []string{ForwardedHeader, c.hdr}
		}
		code, h, body := u.do("GET", "/v1/sessions/"+c.id, nil, hdr...)
		eb := decodeErr(t, body)
		if code != c.status || eb.Code != c.code {
			t.Errorf("%s: %d %s, want %d %q", c.name, code, body, c.status, c.code)
		}
		if (code == http.StatusServiceUnavailable) != (h.Get("Retry-After") != "") {
			t.Errorf("%s: %d with Retry-After %q", c.name, code, h.Get("Retry-After"))
		}
		if c.code != "" && !strings.Contains(eb.Error, c.id) {
			t.Errorf("%s: the message does not name the session: %s", c.name, eb.Error)
		}
	}
}
