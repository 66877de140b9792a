package peers

import (
	"context"
	"log/slog"
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
	got, err := ParseEndpointSlices(data, "sandboxd-workers", 3100)
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
	// The same slices for another Service: none is its controller's.
	if got, err := ParseEndpointSlices(data, "other", 3100); err != nil || len(got) != 0 {
		t.Fatalf("the slices for Service other: %+v %v", got, err)
	}
}

// TestParseEndpointSlicesTrust (SECURITY.md case 59): only the
// EndpointSlice controller's slices of the Service are read: one without
// its managed-by label, owned by another Service or by anything else, or
// by nothing, names no worker (each would send node-x, y, z's sessions, or
// node-a's, to 10.9.9.x). A node with two ready pods is ambiguous, never
// one picked; an endpoint the controller lists in two slices is one. A
// port out of range makes no URL.
func TestParseEndpointSlicesTrust(t *testing.T) {
	data, err := os.ReadFile("testdata/hostile-endpointslices.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseEndpointSlices(data, "sandboxd-workers", 3100)
	if err != nil {
		t.Fatal(err)
	}
	want := []Peer{
		{WorkerID: "node-a", URL: "http://10.244.1.7:3100", Ready: true, Pod: "sandboxd-4kx8d"},
		{WorkerID: "node-d", Ambiguous: "node node-d has 2 ready endpoints, http://10.244.4.2:3100 (pod sandboxd-d1d1d) and " +
			"http://10.244.4.9:3100 (pod sandboxd-d2d2d): which one has the session is not known"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	e := newKubeEnv(t)
	e.answer.Store(string(data))
	e.k.list(context.Background(), 0)
	if a := e.k.Lookup(sessionid.Token("node-d")); a.Status != Ambiguous || a.Why != want[1].Ambiguous {
		t.Fatalf("node-d: %+v, want Ambiguous", a)
	}
}

func TestParseEndpointSlicesRefuses(t *testing.T) {
	for _, in := range []string{
		``,
		`{"kind": "Status", "status": "Failure", "message": "endpointslices.discovery.k8s.io is forbidden", "code": 403}`,
		`{"kind": "EndpointSliceList", "items": [1]}`,
		`[]`,
	} {
		if _, err := ParseEndpointSlices([]byte(in), "s", 3100); err == nil {
			t.Errorf("ParseEndpointSlices(%q) took it", in)
		}
	}
	// No slices: no peers, no error.
	if got, err := ParseEndpointSlices([]byte(`{"kind": "EndpointSliceList", "items": []}`), "s", 3100); err != nil || len(got) != 0 {
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
			r.URL.Query().Get("labelSelector") != "kubernetes.io/service-name=sandboxd-workers,endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io" {
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
		// Never listed, but this worker has listed only now.
		{"node-z", Unknown, ""},
	} {
		a := e.k.Lookup(tok(c.node))
		if a.Status != c.want || (c.url != "" && a.Peer.URL != c.url) || a.Why == "" {
			t.Errorf("%s: %+v, want status %d %s", c.node, a, c.want, c.url)
		}
	}
	// node-a's pod goes (the next list has only node-b): not ready for
	// Grace, then gone.
	e.answer.Store(onlyNodeB)
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
	if a := e.k.Lookup(tok("node-z")); a.Status != Gone {
		t.Fatalf("node-z, never listed in over %s of lists: %+v, want Gone", Grace, a)
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

// onlyNodeB is the workers' list once every node but node-b lost its pod.
const onlyNodeB = `{"kind":"EndpointSliceList","items":[{
	"metadata":{"labels":{"kubernetes.io/service-name":"sandboxd-workers","endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io"},
		"ownerReferences":[{"apiVersion":"v1","kind":"Service","name":"sandboxd-workers"}]},
	"addressType":"IPv4","endpoints":[{"addresses":["10.244.2.9"],"conditions":{"ready":true},"nodeName":"node-b"}],
	"ports":[{"name":"http","port":3100}]}]}`

// TestKubernetesJustStarted: a worker's first list lacks node-a, whose pod
// is between endpoints: what this worker never saw is not gone until the
// lists have lacked it for Grace.
func TestKubernetesJustStarted(t *testing.T) {
	e := newKubeEnv(t)
	e.answer.Store(onlyNodeB)
	e.k.list(context.Background(), 0)
	e.now = e.now.Add(Grace)
	e.k.list(context.Background(), 0)
	if a := e.k.Lookup(sessionid.Token("node-a")); a.Status != Unknown || !strings.Contains(a.Why, "called gone after") {
		t.Fatalf("node-a %s after this worker's first list: %+v, want Unknown", Grace, a)
	}
	e.now = e.now.Add(time.Second)
	if a := e.k.Lookup(sessionid.Token("node-a")); a.Status != Gone {
		t.Fatalf("node-a after %s of lists: %+v, want Gone", Grace, a)
	}
}

// TestKubernetesAfterAnOutage: the API cannot be read for longer than
// Grace, in which node-a's pod moves; the first list after it lacks node-a
// (between endpoints). What happened in the outage was not seen: node-a is
// not gone until the lists after it have lacked it for Grace.
func TestKubernetesAfterAnOutage(t *testing.T) {
	e := newKubeEnv(t)
	e.k.list(context.Background(), 0) // node-a ready
	e.status.Store(http.StatusServiceUnavailable)
	e.now = e.now.Add(5 * time.Second)
	e.k.list(context.Background(), 0)
	e.now = e.now.Add(2 * Grace)
	e.k.list(context.Background(), 0)
	if a := e.k.Lookup(sessionid.Token("node-a")); a.Status != Ready {
		t.Fatalf("node-a, known before the outage: %+v, want Ready", a)
	}
	e.status.Store(http.StatusOK)
	e.answer.Store(onlyNodeB)
	e.k.list(context.Background(), 0)
	for _, node := range []string{"node-a", "node-z"} {
		if a := e.k.Lookup(sessionid.Token(node)); a.Status == Gone || a.Status == Ready {
			t.Fatalf("%s right after the outage: %+v, want 503 (NotReady or Unknown)", node, a)
		}
	}
	e.now = e.now.Add(Grace + time.Second)
	e.k.list(context.Background(), 0)
	for _, node := range []string{"node-a", "node-z"} {
		if a := e.k.Lookup(sessionid.Token(node)); a.Status != Gone {
			t.Fatalf("%s after %s of lists since the outage: %+v, want Gone", node, Grace, a)
		}
	}
}

// TestKubernetesTokenCollision: two nodes whose names share an owner token
// make it ambiguous (503, logged), neither forwarded to.
func TestKubernetesTokenCollision(t *testing.T) {
	x, y := collidingNames(t)
	e := newKubeEnv(t)
	logs := &strings.Builder{}
	e.k.opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	e.answer.Store(strings.ReplaceAll(strings.ReplaceAll(string(mustRead(t, "testdata/endpointslices.json")),
		`"node-a"`, `"`+x+`"`), `"node-d"`, `"`+y+`"`))
	e.k.list(context.Background(), 0)
	a := e.k.Lookup(sessionid.Token(x))
	if a.Status != Ambiguous || !strings.Contains(a.Why, x+" and "+y) || !strings.Contains(logs.String(), "ambiguous owner token") {
		t.Fatalf("%s and %s: %+v\nlog: %s", x, y, a, logs)
	}
	// Logged once, not at every list.
	e.now = e.now.Add(time.Minute)
	e.k.list(context.Background(), 0)
	if n := strings.Count(logs.String(), "ambiguous owner token"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logs)
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
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
