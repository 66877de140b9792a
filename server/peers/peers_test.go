package peers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/server/sessionid"
)

// TestParseEndpointSlices reads a list in the API's v1 wire form (written
// for this test in the form `kubectl get --raw` answers): one peer per
// node, ready or not as its conditions say.
func TestParseEndpointSlices(t *testing.T) {
	data, err := os.ReadFile("testdata/endpointslices.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseEndpointSlices(data, 3100)
	if err != nil {
		t.Fatal(err)
	}
	want := []Peer{
		{WorkerID: "node-a", URL: "http://10.244.1.7:3100", Ready: true, Pod: "sandboxd-4kx8d"},
		// Listed, not ready: a worker starting up (503, not 410).
		{WorkerID: "node-b", URL: "http://10.244.2.9:3100", Ready: false, Pod: "sandboxd-p2mzq"},
		// A pod being replaced: the ready new one, not the terminating one.
		{WorkerID: "node-c", URL: "http://10.244.3.11:3100", Ready: true, Pod: "sandboxd-new3c"},
		// No ready condition: ready, as the API defines it.
		{WorkerID: "node-d", URL: "http://10.244.4.2:3100", Ready: true, Pod: "sandboxd-q9w8e"},
		// Terminating only: not ready.
		{WorkerID: "node-e", URL: "http://10.244.5.3:3100", Ready: false, Pod: "sandboxd-gone5"},
		// IPv6, the port named http among two.
		{WorkerID: "node-f", URL: "http://[fd00:10:244:7::5]:3101", Ready: true, Pod: "sandboxd-v6v6v"},
		// The endpoint without a node and the FQDN slice are skipped.
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestParseEndpointSlicesRefuses(t *testing.T) {
	for _, in := range []string{
		``,
		`{"kind": "Status", "status": "Failure", "message": "endpointslices.discovery.k8s.io is forbidden", "code": 403}`,
		`{"kind": "EndpointSliceList", "items": [1]}`,
		`[]`,
	} {
		if _, err := ParseEndpointSlices([]byte(in), 3100); err == nil {
			t.Errorf("ParseEndpointSlices(%q) took it", in)
		}
	}
	// No slices: no peers, no error.
	if got, err := ParseEndpointSlices([]byte(`{"kind": "EndpointSliceList", "items": []}`), 3100); err != nil || len(got) != 0 {
		t.Fatalf("an empty list: %v, %v", got, err)
	}
}

func TestStatic(t *testing.T) {
	s, err := NewStatic("a", map[string]string{"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:2"})
	if err != nil {
		t.Fatal(err)
	}
	if a := s.Lookup(sessionid.Token("b")); a.Status != Ready || a.Peer.URL != "http://127.0.0.1:2" || a.Peer.WorkerID != "b" {
		t.Fatalf("b: %+v", a)
	}
	if a := s.Lookup(sessionid.Token("c")); a.Status != Gone || a.Why == "" {
		t.Fatalf("c: %+v", a)
	}
}

// TestStaticTokenCollision: two names whose owner tokens collide would
// send one's sessions to the other; found by searching names, fixed here.
func TestStaticTokenCollision(t *testing.T) {
	x, y := collidingNames(t)
	if _, err := NewStatic("self", map[string]string{x: "http://127.0.0.1:1", y: "http://127.0.0.1:2"}); err == nil || !strings.Contains(err.Error(), "same owner token") {
		t.Fatalf("NewStatic with %s and %s: %v", x, y, err)
	}
	if _, err := NewStatic(x, map[string]string{y: "http://127.0.0.1:2"}); err == nil {
		t.Fatalf("NewStatic: self %s and peer %s share a token, accepted", x, y)
	}
}

// collidingNames finds two worker names with one 32-bit owner token among
// n-0, n-1, ...: about 2^16 names by the birthday bound, a few ms.
func collidingNames(t *testing.T) (string, string) {
	seen := map[string]string{}
	for i := 0; i < 1<<20; i++ {
		name := "n-" + strconv.Itoa(i)
		tok := sessionid.Token(name)
		if other, ok := seen[tok]; ok {
			return other, name
		}
		seen[tok] = name
	}
	t.Skip("no collision among 2^20 names")
	return "", ""
}

// kubeEnv is a Kubernetes resolver on a fake API server (a recorded
// answer served by httptest: the parsing and the states are the logic
// under test) and a service account directory.
type kubeEnv struct {
	k      *Kubernetes
	answer atomic.Value // string
	status atomic.Int64
	lists  atomic.Int64
	auth   atomic.Value // string: the last Authorization
	now    time.Time
}

func newKubeEnv(t *testing.T) *kubeEnv {
	e := &kubeEnv{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	data, err := os.ReadFile("testdata/endpointslices.json")
	if err != nil {
		t.Fatal(err)
	}
	e.answer.Store(string(data))
	e.status.Store(http.StatusOK)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.lists.Add(1)
		e.auth.Store(r.Header.Get("Authorization"))
		if r.URL.Path != "/apis/discovery.k8s.io/v1/namespaces/sandboxd/endpointslices" ||
			r.URL.Query().Get("labelSelector") != "kubernetes.io/service-name=sandboxd-workers" {
			http.Error(w, "wrong path "+r.URL.String(), http.StatusNotFound)
			return
		}
		w.WriteHeader(int(e.status.Load()))
		w.Write([]byte(e.answer.Load().(string)))
	}))
	t.Cleanup(api.Close)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "token"), []byte("sa-token-1\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "namespace"), []byte("sandboxd"), 0o644)
	k, err := NewKubernetes(KubeOptions{Service: "sandboxd-workers", Port: 3100, Refresh: time.Hour,
		APIServer: api.URL, AccountDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	k.now = func() time.Time { return e.now }
	e.k = k
	// The token is read again for every list (the kubelet rotates it).
	os.WriteFile(filepath.Join(dir, "token"), []byte("sa-token-2\n"), 0o600)
	return e
}

func TestKubernetesStates(t *testing.T) {
	e := newKubeEnv(t)
	tok := sessionid.Token
	// Before any list nothing is known gone.
	if a := e.k.Lookup(tok("node-z")); a.Status != Unknown {
		t.Fatalf("before a list: %+v", a)
	}
	e.k.list(context.Background(), 0)
	if got := e.auth.Load(); got != "Bearer sa-token-2" {
		t.Fatalf("Authorization %q: the token is not read per list", got)
	}
	for _, c := range []struct {
		node string
		want Status
		url  string
	}{
		{"node-a", Ready, "http://10.244.1.7:3100"},
		{"node-b", NotReady, ""},
		{"node-c", Ready, "http://10.244.3.11:3100"},
		{"node-z", Gone, ""},
	} {
		a := e.k.Lookup(tok(c.node))
		if a.Status != c.want || (c.url != "" && a.Peer.URL != c.url) || a.Why == "" {
			t.Errorf("%s: %+v, want status %d %s", c.node, a, c.want, c.url)
		}
	}
	// node-a's pod goes (the next list has only node-b): not ready for
	// Grace, then gone.
	e.answer.Store(`{"kind":"EndpointSliceList","items":[{"addressType":"IPv4","endpoints":[
		{"addresses":["10.244.2.9"],"conditions":{"ready":true},"nodeName":"node-b"}],"ports":[{"name":"http","port":3100}]}]}`)
	e.now = e.now.Add(5 * time.Second)
	e.k.list(context.Background(), 0)
	if a := e.k.Lookup(tok("node-a")); a.Status != NotReady || !strings.Contains(a.Why, "node-a") {
		t.Fatalf("node-a just gone: %+v, want NotReady", a)
	}
	if a := e.k.Lookup(tok("node-b")); a.Status != Ready {
		t.Fatalf("node-b ready now: %+v", a)
	}
	e.now = e.now.Add(Grace + time.Second)
	e.k.list(context.Background(), 0)
	if a := e.k.Lookup(tok("node-a")); a.Status != Gone || !strings.Contains(a.Why, "sandboxd/sandboxd-workers") {
		t.Fatalf("node-a after the grace: %+v, want Gone", a)
	}
	// The API fails: the known worker is still forwarded to; nothing
	// unknown is called gone.
	e.status.Store(http.StatusForbidden)
	e.answer.Store(`{"kind":"Status","message":"forbidden"}`)
	e.now = e.now.Add(time.Minute)
	e.k.list(context.Background(), 0)
	if a := e.k.Lookup(tok("node-b")); a.Status != Ready {
		t.Fatalf("node-b with the API failing: %+v", a)
	}
	if a := e.k.Lookup(tok("node-a")); a.Status != Unknown || !strings.Contains(a.Why, "403") {
		t.Fatalf("node-a with the API failing: %+v, want Unknown", a)
	}
}

// TestKubernetesRefreshIsSpaced: refused connections ask for lists; at
// most one a second is made.
func TestKubernetesRefreshIsSpaced(t *testing.T) {
	e := newKubeEnv(t)
	e.k.Refresh(context.Background())
	e.k.Refresh(context.Background())
	if n := e.lists.Load(); n != 1 {
		t.Fatalf("%d lists for two refreshes within a second, want 1", n)
	}
	e.now = e.now.Add(minRelist)
	e.k.Refresh(context.Background())
	if n := e.lists.Load(); n != 2 {
		t.Fatalf("%d lists, want 2", n)
	}
}

func TestNewKubernetesNeedsTheServiceAccount(t *testing.T) {
	_, err := NewKubernetes(KubeOptions{Service: "s", Port: 1, APIServer: "https://127.0.0.1:1", AccountDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "automountServiceAccountToken") {
		t.Fatalf("no service account: %v", err)
	}
}
