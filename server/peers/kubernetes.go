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
	// Grace is how long a worker that had an endpoint stays "not ready"
	// (503) after its last endpoint went, before it is "gone" (410): a
	// DaemonSet pod being replaced has no endpoint between the old pod's
	// removal and the new pod's address, and a client must not be told
	// that the sessions of a restarting worker are gone.
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
// forwarded to, but nothing unknown is called gone (Unknown, 503).
type Kubernetes struct {
	opts    KubeOptions
	client  *http.Client
	listURL string
	now     func() time.Time

	listMu   sync.Mutex // one list at a time
	lastList time.Time  // under listMu

	mu      sync.Mutex
	byToken map[string]Peer
	seen    map[string]seenPeer // token → when it last had an endpoint
	listed  bool                // a list succeeded once
	lastErr error               // the last list's error, nil when it succeeded
}

type seenPeer struct {
	workerID string
	at       time.Time
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
	q := url.Values{"labelSelector": {"kubernetes.io/service-name=" + o.Service}}
	return &Kubernetes{
		opts:    o,
		client:  &http.Client{Transport: tr, Timeout: 10 * time.Second},
		listURL: o.APIServer + "/apis/discovery.k8s.io/v1/namespaces/" + url.PathEscape(o.Namespace) + "/endpointslices?" + q.Encode(),
		now:     time.Now,
		byToken: map[string]Peer{},
		seen:    map[string]seenPeer{},
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

// apply replaces the list (under mu).
func (k *Kubernetes) apply(peers []Peer) {
	now := k.now()
	byToken := make(map[string]Peer, len(peers))
	for _, p := range peers {
		tok := sessionid.Token(p.WorkerID)
		if q, ok := byToken[tok]; ok && q.WorkerID != p.WorkerID {
			k.opts.Logger.Error("peers: two workers share an owner token: neither is forwarded to", "token", tok, "workers", []string{q.WorkerID, p.WorkerID})
			continue
		}
		byToken[tok] = p
		k.seen[tok] = seenPeer{workerID: p.WorkerID, at: now}
	}
	for tok, s := range k.seen {
		if now.Sub(s.at) > Grace {
			delete(k.seen, tok)
		}
	}
	k.byToken, k.listed, k.lastErr = byToken, true, nil
}

// Lookup finds the worker of token in the last list.
func (k *Kubernetes) Lookup(token string) Answer {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.byToken[token]; ok {
		if p.Ready {
			return Answer{Peer: p, Status: Ready, Why: fmt.Sprintf("worker %s (pod %s) at %s", p.WorkerID, p.Pod, p.URL)}
		}
		return Answer{Peer: p, Status: NotReady, Why: fmt.Sprintf("worker %s (pod %s) is not ready (restarting or draining)", p.WorkerID, p.Pod)}
	}
	if s, ok := k.seen[token]; ok && k.now().Sub(s.at) <= Grace {
		return Answer{Peer: Peer{WorkerID: s.workerID}, Status: NotReady, Why: fmt.Sprintf(
			"worker %s has had no endpoint in %s for %s (its pod being replaced?); it is called gone after %s",
			s.workerID, k.opts.Service, k.now().Sub(s.at).Round(time.Second), Grace)}
	}
	switch {
	case !k.listed:
		return Answer{Status: Unknown, Why: fmt.Sprintf("the workers' EndpointSlices are not listed yet: %v", errOr(k.lastErr, "first list pending"))}
	case k.lastErr != nil:
		return Answer{Status: Unknown, Why: fmt.Sprintf("the workers' EndpointSlices cannot be listed now: %v", k.lastErr)}
	}
	return Answer{Status: Gone, Why: fmt.Sprintf("no endpoint of Service %s/%s is on a node with that owner token (its node was removed, or its worker is gone for over %s)",
		k.opts.Namespace, k.opts.Service, Grace)}
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
	return ParseEndpointSlices(body, k.opts.Port)
}

// endpointSliceList is what is read of a discovery.k8s.io/v1
// EndpointSliceList.
type endpointSliceList struct {
	Kind  string `json:"kind"`
	Items []struct {
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

// ParseEndpointSlices reads an EndpointSliceList: one Peer per node (the
// worker_id is the endpoint's nodeName), its URL the endpoint's first
// address and the slice's port named "http" (else its only port, else
// defaultPort). A node with several endpoints (a pod being replaced) is
// ready when one of them is, and is reached at that one. Per the API, a
// missing ready condition means ready; a terminating endpoint is not
// ready. Endpoints without a node or an address, and FQDN slices, are
// skipped.
func ParseEndpointSlices(data []byte, defaultPort int) ([]Peer, error) {
	var list endpointSliceList
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("EndpointSlice list: %w", err)
	}
	if list.Kind != "EndpointSliceList" {
		return nil, fmt.Errorf("EndpointSlice list: kind %q, want EndpointSliceList", list.Kind)
	}
	byNode := map[string]Peer{}
	for _, s := range list.Items {
		if s.AddressType != "IPv4" && s.AddressType != "IPv6" {
			continue
		}
		port := defaultPort
		for _, p := range s.Ports {
			if p.Port != nil && (p.Name == "http" || len(s.Ports) == 1) {
				port = *p.Port
				break
			}
		}
		for _, e := range s.Endpoints {
			if e.NodeName == "" || len(e.Addresses) == 0 || net.ParseIP(e.Addresses[0]) == nil {
				continue
			}
			ready := (e.Conditions.Ready == nil || *e.Conditions.Ready) &&
				(e.Conditions.Terminating == nil || !*e.Conditions.Terminating)
			p := Peer{
				WorkerID: e.NodeName,
				URL:      "http://" + net.JoinHostPort(e.Addresses[0], strconv.Itoa(port)),
				Ready:    ready,
			}
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				p.Pod = e.TargetRef.Name
			}
			if q, ok := byNode[p.WorkerID]; ok && !better(p, q) {
				continue
			}
			byNode[p.WorkerID] = p
		}
	}
	out := make([]Peer, 0, len(byNode))
	for _, p := range byNode {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.WorkerID, b.WorkerID) })
	return out, nil
}

// better: p is chosen over q for one node: a ready endpoint first, then the
// lower address, so that every list picks the same one.
func better(p, q Peer) bool {
	if p.Ready != q.Ready {
		return p.Ready
	}
	return p.URL < q.URL
}
