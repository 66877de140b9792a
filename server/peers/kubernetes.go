package peers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/server/sessionid"
)

// The service account a pod gets mounted (automountServiceAccountToken).
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// maxListBytes bounds the answer read: a pool's slices are a few KB
	// per hundred workers.
	maxListBytes = 8 << 20
	// Grace is how long a token must have been missing from the lists
	// that succeeded before it is "gone" (410); until then it is "not
	// ready" or "unknown" (503). A DaemonSet pod being replaced has no
	// endpoint between the old pod's removal and the new pod's address,
	// and a client must not be told that the sessions of a restarting
	// worker are gone. The time counts from the later of the first list
	// without the token, this worker's first list that succeeded, and the
	// end of the last outage of the API: what this worker did not see, it
	// does not call gone (SECURITY.md case 59).
	Grace = 60 * time.Second
	// minRelist spaces the lists Refresh asks for.
	minRelist = time.Second
)

// KubeOptions configure a Kubernetes resolver. Service and Port are
// required; the rest default to the pod's in-cluster settings.
type KubeOptions struct {
	Service   string // the headless Service of the workers (peers_service)
	Namespace string // its namespace ("": the service account's)
	// Port is the workers' port when a slice names none (worker_port).
	Port    int
	Refresh time.Duration // peers_refresh
	Logger  *slog.Logger

	// APIServer is the API's base URL ("": https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
	APIServer string
	// AccountDir holds token, ca.crt and namespace ("": the mounted
	// service account's directory).
	AccountDir string
}

// Kubernetes lists the EndpointSlices of the workers' headless Service
// through the in-cluster API, over plain net/http with the pod's service
// account token (read again for every list: the kubelet rotates it) and
// CA. A list that fails keeps the last one: known workers are still
// forwarded to, but nothing unknown is called gone (Unknown, 503). Only
// slices the EndpointSlice controller made for the Service are read
// (SECURITY.md case 59).
type Kubernetes struct {
	opts    KubeOptions
	client  *http.Client
	listURL string
	now     func() time.Time

	listMu   sync.Mutex // one list at a time
	lastList time.Time  // under listMu

	mu        sync.Mutex
	byToken   map[string]Peer
	missing   map[string]missingPeer // tokens of an earlier list absent from the later ones
	firstOK   time.Time              // the first list that succeeded (zero: none yet)
	outageEnd time.Time              // the first list that succeeded after one failed
	lastErr   error                  // the last list's error, nil when it succeeded
}

// missingPeer: a worker listed once, absent from every list since.
type missingPeer struct {
	workerID string
	since    time.Time // the first list without it
}

// NewKubernetes builds the resolver from the pod's service account; Run
// lists the slices. It fails when the pod has no service account mounted
// or is not in a cluster: peers_source = "kubernetes" needs both.
func NewKubernetes(o KubeOptions) (*Kubernetes, error) {
	if o.AccountDir == "" {
		o.AccountDir = serviceAccountDir
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.APIServer == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("peers_source = \"kubernetes\": KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod?)")
		}
		o.APIServer = "https://" + net.JoinHostPort(host, port)
	}
	if o.Namespace == "" {
		ns, err := os.ReadFile(o.AccountDir + "/namespace")
		if err != nil {
			return nil, fmt.Errorf("peers_source = \"kubernetes\" without peers_namespace: %w (automountServiceAccountToken)", err)
		}
		o.Namespace = strings.TrimSpace(string(ns))
	}
	if _, err := os.Stat(o.AccountDir + "/token"); err != nil {
		return nil, fmt.Errorf("peers_source = \"kubernetes\": the service account token: %w (automountServiceAccountToken)", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // the API server is in the cluster: never through an HTTP(S)_PROXY
	if strings.HasPrefix(o.APIServer, "https:") {
		ca, err := os.ReadFile(o.AccountDir + "/ca.crt")
		if err != nil {
			return nil, fmt.Errorf("peers_source = \"kubernetes\": the cluster CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("peers_source = \"kubernetes\": %s/ca.crt holds no PEM certificate", o.AccountDir)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	// The controller's slices of the Service only (SECURITY.md case 59):
	// ParseEndpointSlices checks the labels and the owner again.
	q := url.Values{"labelSelector": {serviceLabel + "=" + o.Service + "," + managedByLabel + "=" + managedByController}}
	return &Kubernetes{
		opts:    o,
		client:  &http.Client{Transport: tr, Timeout: 10 * time.Second},
		listURL: o.APIServer + "/apis/discovery.k8s.io/v1/namespaces/" + url.PathEscape(o.Namespace) + "/endpointslices?" + q.Encode(),
		now:     time.Now,
		byToken: map[string]Peer{},
		missing: map[string]missingPeer{},
	}, nil
}

// Run lists the slices now and then every Refresh until ctx is done.
func (k *Kubernetes) Run(ctx context.Context) {
	t := time.NewTicker(k.opts.Refresh)
	defer t.Stop()
	for {
		k.list(ctx, 0)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh lists the slices now unless a list ended less than a second ago.
func (k *Kubernetes) Refresh(ctx context.Context) { k.list(ctx, minRelist) }

func (k *Kubernetes) list(ctx context.Context, unlessWithin time.Duration) {
	k.listMu.Lock()
	defer k.listMu.Unlock()
	if unlessWithin > 0 && k.now().Sub(k.lastList) < unlessWithin {
		return
	}
	peers, err := k.fetch(ctx)
	k.lastList = k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		if k.lastErr == nil {
			k.opts.Logger.Error("peers: listing the workers' EndpointSlices failed (forwarding from the last list)", "err", err)
		}
		k.lastErr = err
		return
	}
	if k.lastErr != nil {
		k.opts.Logger.Info("peers: EndpointSlices listed again", "workers", len(peers))
	}
	k.apply(peers)
}

// apply replaces the list (under mu). Two workers whose names share an
// owner token make it ambiguous: neither is forwarded to (SECURITY.md
// case 59).
func (k *Kubernetes) apply(peers []Peer) {
	now := k.now()
	byNameOf := map[string][]string{}
	byToken := make(map[string]Peer, len(peers))
	for _, p := range peers {
		tok := sessionid.Token(p.WorkerID)
		byNameOf[tok] = append(byNameOf[tok], p.WorkerID)
		byToken[tok] = p
	}
	for tok, names := range byNameOf {
		if len(names) > 1 {
			byToken[tok] = Peer{WorkerID: strings.Join(names, ", "), Ambiguous: fmt.Sprintf(
				"workers %s share the owner token %s (a 32-bit hash of the node's name): which one has the session is not known", strings.Join(names, " and "), tok)}
		}
	}
	for tok, p := range byToken {
		if p.Ambiguous != "" && k.byToken[tok].Ambiguous != p.Ambiguous {
			k.opts.Logger.Error("peers: not forwarding to an ambiguous owner token", "token", tok, "why", p.Ambiguous)
		}
	}
	for tok, p := range k.byToken {
		if _, listed := byToken[tok]; !listed {
			if _, ok := k.missing[tok]; !ok {
				k.missing[tok] = missingPeer{workerID: p.WorkerID, since: now}
			}
		}
	}
	for tok, m := range k.missing {
		// Past Grace an entry says no more than its absence would.
		if _, back := byToken[tok]; back || now.Sub(m.since) > Grace {
			delete(k.missing, tok)
		}
	}
	switch {
	case k.firstOK.IsZero():
		k.firstOK = now
	case k.lastErr != nil:
		k.outageEnd = now
	}
	k.byToken, k.lastErr = byToken, nil
}

// Lookup finds the worker of token in the last list. A token absent from
// it is gone only once absent from the lists that succeeded for Grace,
// counted from no earlier than this worker's first list and the end of
// the last outage.
func (k *Kubernetes) Lookup(token string) Answer {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.byToken[token]; ok {
		switch {
		case p.Ambiguous != "":
			return Answer{Peer: p, Status: Ambiguous, Why: p.Ambiguous}
		case p.Ready:
			return Answer{Peer: p, Status: Ready, Why: fmt.Sprintf("worker %s (pod %s) at %s", p.WorkerID, p.Pod, p.URL)}
		}
		return Answer{Peer: p, Status: NotReady, Why: fmt.Sprintf("worker %s (pod %s) is not ready (restarting or draining)", p.WorkerID, p.Pod)}
	}
	switch {
	case k.firstOK.IsZero():
		return Answer{Status: Unknown, Why: fmt.Sprintf("the workers' EndpointSlices are not listed yet: %v", errOr(k.lastErr, "first list pending"))}
	case k.lastErr != nil:
		return Answer{Status: Unknown, Why: fmt.Sprintf("the workers' EndpointSlices cannot be listed now: %v", k.lastErr)}
	}
	from := later(k.firstOK, k.outageEnd)
	m, wasListed := k.missing[token]
	if wasListed {
		from = later(from, m.since)
	}
	if d := k.now().Sub(from); d <= Grace {
		if wasListed {
			return Answer{Peer: Peer{WorkerID: m.workerID}, Status: NotReady, Why: fmt.Sprintf(
				"worker %s has had no endpoint in %s for %s (its pod being replaced?); it is called gone after %s",
				m.workerID, k.opts.Service, d.Round(time.Second), Grace)}
		}
		return Answer{Status: Unknown, Why: fmt.Sprintf(
			"no endpoint of %s is on a node with that owner token in the lists of the last %s; it is called gone after %s",
			k.opts.Service, d.Round(time.Second), Grace)}
	}
	return Answer{Status: Gone, Why: fmt.Sprintf("no endpoint of Service %s/%s is on a node with that owner token (its node was removed, or its worker is gone for over %s)",
		k.opts.Namespace, k.opts.Service, Grace)}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// fetch GETs the EndpointSlices and parses them.
func (k *Kubernetes) fetch(ctx context.Context) ([]Peer, error) {
	token, err := os.ReadFile(k.opts.AccountDir + "/token")
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.listURL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxListBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxListBytes {
		return nil, fmt.Errorf("the EndpointSlice list is over %d bytes", maxListBytes)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.300s", k.listURL, resp.Status, body)
	}
	return ParseEndpointSlices(body, k.opts.Service, k.opts.Port)
}

// The labels and the owner of the EndpointSlices a Service's controller
// makes (SECURITY.md case 59).
const (
	serviceLabel        = "kubernetes.io/service-name"
	managedByLabel      = "endpointslice.kubernetes.io/managed-by"
	managedByController = "endpointslice-controller.k8s.io"
)

// endpointSliceList is what is read of a discovery.k8s.io/v1
// EndpointSliceList.
type endpointSliceList struct {
	Kind  string `json:"kind"`
	Items []struct {
		Metadata struct {
			Labels          map[string]string `json:"labels"`
			OwnerReferences []ownerRef        `json:"ownerReferences"`
		} `json:"metadata"`
		AddressType string `json:"addressType"`
		Endpoints   []struct {
			Addresses  []string `json:"addresses"`
			Conditions struct {
				Ready       *bool `json:"ready"`
				Terminating *bool `json:"terminating"`
			} `json:"conditions"`
			NodeName  string `json:"nodeName"`
			TargetRef *struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
			} `json:"targetRef"`
		} `json:"endpoints"`
		Ports []struct {
			Name string `json:"name"`
			Port *int   `json:"port"`
		} `json:"ports"`
	} `json:"items"`
}

type ownerRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
}

// ParseEndpointSlices reads an EndpointSliceList: one Peer per node (the
// worker_id is the endpoint's nodeName), its URL the endpoint's first
// address and the slice's port named "http" (else its only port, else
// defaultPort). Per the API, a missing ready condition means ready; a
// terminating endpoint is not ready. A node with several endpoints (a pod
// being replaced) is reached at its ready one; two ready ones (different
// addresses: the same endpoint may appear in two slices) make it
// ambiguous. Only slices the EndpointSlice controller made for service
// count: labelled with it and managed-by the controller, owned by the
// Service (SECURITY.md case 59). Endpoints without a node or an address,
// FQDN slices and slices with a port out of range are skipped.
func ParseEndpointSlices(data []byte, service string, defaultPort int) ([]Peer, error) {
	var list endpointSliceList
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("EndpointSlice list: %w", err)
	}
	if list.Kind != "EndpointSliceList" {
		return nil, fmt.Errorf("EndpointSlice list: kind %q, want EndpointSliceList", list.Kind)
	}
	byNode := map[string][]Peer{}
	for _, s := range list.Items {
		md := s.Metadata
		if (s.AddressType != "IPv4" && s.AddressType != "IPv6") ||
			md.Labels[serviceLabel] != service || md.Labels[managedByLabel] != managedByController ||
			!slices.Contains(md.OwnerReferences, ownerRef{APIVersion: "v1", Kind: "Service", Name: service}) {
			continue
		}
		port := defaultPort
		for _, p := range s.Ports {
			if p.Port != nil && (p.Name == "http" || len(s.Ports) == 1) {
				port = *p.Port
				break
			}
		}
		if port < 1 || port > 65535 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.NodeName == "" || len(e.Addresses) == 0 || net.ParseIP(e.Addresses[0]) == nil {
				continue
			}
			p := Peer{
				WorkerID: e.NodeName,
				URL:      "http://" + net.JoinHostPort(e.Addresses[0], strconv.Itoa(port)),
				Ready: (e.Conditions.Ready == nil || *e.Conditions.Ready) &&
					(e.Conditions.Terminating == nil || !*e.Conditions.Terminating),
			}
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				p.Pod = e.TargetRef.Name
			}
			byNode[p.WorkerID] = append(byNode[p.WorkerID], p)
		}
	}
	out := make([]Peer, 0, len(byNode))
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		out = append(out, onePerNode(byNode[node]))
	}
	return out, nil
}

// onePerNode is the Peer of a node's endpoints: its ready one, else (none
// ready) its lowest address, so that every list says the same; two ready
// ones at different addresses make it ambiguous, never one picked.
func onePerNode(eps []Peer) Peer {
	// By address, a ready copy of one endpoint (listed in two slices)
	// before a stale one.
	slices.SortFunc(eps, func(a, b Peer) int {
		if c := strings.Compare(a.URL, b.URL); c != 0 || a.Ready == b.Ready {
			return c
		}
		if a.Ready {
			return -1
		}
		return 1
	})
	eps = slices.CompactFunc(eps, func(a, b Peer) bool { return a.URL == b.URL })
	var ready []string
	for _, p := range eps {
		if p.Ready {
			ready = append(ready, fmt.Sprintf("%s (pod %s)", p.URL, p.Pod))
		}
	}
	switch {
	case len(ready) > 1:
		return Peer{WorkerID: eps[0].WorkerID, Ambiguous: fmt.Sprintf(
			"node %s has %d ready endpoints, %s: which one has the session is not known", eps[0].WorkerID, len(ready), strings.Join(ready, " and "))}
	case len(ready) == 1:
		return eps[slices.IndexFunc(eps, func(p Peer) bool { return p.Ready })]
	}
	return eps[0]
}
