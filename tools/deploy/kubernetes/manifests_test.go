// Package kubernetes holds sandboxd's Kubernetes manifests (README.md);
// this test keeps them consistent with the server they deploy.
package kubernetes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/server/config"
	"go.yaml.in/yaml/v3"
)

// serveShutdownExtra is what cmd/sandboxd/serve.go gives the HTTP server's
// Shutdown beyond shutdown_grace_ms (grace+15s) before it closes the
// connections: the pod's grace period must cover both.
const serveShutdownExtra = 15

// warmSandboxBytes is what one ready warm sandbox holds: ~62 MiB with the
// default preload (measured: server/README.md, "Why 2 per policy").
const warmSandboxBytes = 64 << 20

type kustomization struct {
	Namespace          string   `yaml:"namespace"`
	Resources          []string `yaml:"resources"`
	ConfigMapGenerator []struct {
		Name  string   `yaml:"name"`
		Files []string `yaml:"files"`
	} `yaml:"configMapGenerator"`
	Images []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
		Digest  string `yaml:"digest"`
	} `yaml:"images"`
}

type meta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type object struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   meta      `yaml:"metadata"`
	Spec       yaml.Node `yaml:"spec"`
	// A Role's, a RoleBinding's and a ServiceAccount's fields.
	Rules []struct {
		APIGroups []string `yaml:"apiGroups"`
		Resources []string `yaml:"resources"`
		Verbs     []string `yaml:"verbs"`
	} `yaml:"rules"`
	RoleRef struct {
		APIGroup string `yaml:"apiGroup"`
		Kind     string `yaml:"kind"`
		Name     string `yaml:"name"`
	} `yaml:"roleRef"`
	Subjects                     []subject `yaml:"subjects"`
	AutomountServiceAccountToken *bool     `yaml:"automountServiceAccountToken"`
}

type subject struct {
	Kind      string `yaml:"kind"`
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"`
}

type selector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type daemonSetSpec struct {
	Selector       selector `yaml:"selector"`
	UpdateStrategy struct {
		Type          string `yaml:"type"`
		RollingUpdate struct {
			MaxUnavailable int `yaml:"maxUnavailable"`
			MaxSurge       int `yaml:"maxSurge"`
		} `yaml:"rollingUpdate"`
	} `yaml:"updateStrategy"`
	Template struct {
		Metadata meta    `yaml:"metadata"`
		Spec     podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	NodeSelector map[string]string `yaml:"nodeSelector"`
	Tolerations  []struct {
		Key, Operator, Value, Effect string
	} `yaml:"tolerations"`
	ServiceAccountName            string      `yaml:"serviceAccountName"`
	AutomountServiceAccountToken  *bool       `yaml:"automountServiceAccountToken"`
	TerminationGracePeriodSeconds int         `yaml:"terminationGracePeriodSeconds"`
	Containers                    []container `yaml:"containers"`
	Volumes                       []volume    `yaml:"volumes"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct{ Name, Key string } `yaml:"secretKeyRef"`
			FieldRef     *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	SecurityContext struct {
		Privileged bool `yaml:"privileged"`
	} `yaml:"securityContext"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet struct {
		Path        string `yaml:"path"`
		Port        string `yaml:"port"`
		HTTPHeaders []struct {
			Name, Value string
		} `yaml:"httpHeaders"`
	} `yaml:"httpGet"`
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
}

type serviceSpec struct {
	Type      string            `yaml:"type"`
	ClusterIP string            `yaml:"clusterIP"`
	Selector  map[string]string `yaml:"selector"`
	Ports     []struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort string `yaml:"targetPort"`
	} `yaml:"ports"`
}

type pdbSpec struct {
	MaxUnavailable int      `yaml:"maxUnavailable"`
	Selector       selector `yaml:"selector"`
}

// manifests reads kustomization.yaml and every document of its resources.
func manifests(t *testing.T) (kustomization, []object) {
	t.Helper()
	var k kustomization
	decodeFile(t, "kustomization.yaml", &k)
	var objs []object
	for _, r := range k.Resources {
		data, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var o object
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", r, err)
			}
			if o.Kind == "" || o.APIVersion == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: a document without kind, apiVersion or name: %+v", r, o)
			}
			objs = append(objs, o)
		}
	}
	return k, objs
}

func decodeFile(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func find(t *testing.T, objs []object, kind, name string, spec any) object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			if err := o.Spec.Decode(spec); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return o
		}
	}
	t.Fatalf("no %s %s in the manifests", kind, name)
	return object{}
}

// subset: every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// podEnv is the container's environment as the kubelet would give it, with
// stand-ins for the Secret and the downward API.
func podEnv(t *testing.T, c container) []string {
	t.Helper()
	fields := map[string]string{"spec.nodeName": "node-1.example", "status.podIP": "10.244.1.5", "metadata.namespace": "sandboxd"}
	vars := map[string]string{}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			v = "secret-" + e.ValueFrom.SecretKeyRef.Name + "-" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			var ok bool
			if v, ok = fields[e.ValueFrom.FieldRef.FieldPath]; !ok {
				t.Fatalf("env %s: field %s has no stand-in here", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		default:
			// $(VAR) refers to a variable defined earlier in the list.
			for name, val := range vars {
				v = strings.ReplaceAll(v, "$("+name+")", val)
			}
			if strings.Contains(v, "$(") {
				t.Fatalf("env %s: %q refers to a variable not defined before it", e.Name, e.Value)
			}
		}
		vars[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env
}

// quantity parses the resource quantities used here: plain numbers,
// millicores and binary suffixes.
func quantity(t *testing.T, s string) float64 {
	t.Helper()
	mult := 1.0
	for suf, m := range map[string]float64{"m": 1e-3, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40} {
		if strings.HasSuffix(s, suf) {
			s, mult = strings.TrimSuffix(s, suf), m
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("quantity %q: %v", s, err)
	}
	return v * mult
}

// openPaths are the GET paths of server/openapi.json that need no token
// (security: []), and all its GET paths.
func openAPIPaths(t *testing.T) (open, all map[string]bool) {
	t.Helper()
	data, err := os.ReadFile("../../../server/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Security *[]any `json:"security"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	open, all = map[string]bool{}, map[string]bool{}
	for p, ops := range doc.Paths {
		if op, ok := ops["get"]; ok {
			all[p] = true
			open[p] = op.Security != nil && len(*op.Security) == 0
		}
	}
	return open, all
}

func TestManifests(t *testing.T) {
	k, objs := manifests(t)
	if k.Namespace == "" {
		t.Error("kustomization sets no namespace")
	}
	var ds daemonSetSpec
	find(t, objs, "DaemonSet", "sandboxd", &ds)
	pod := ds.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want the worker alone", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The config: the generated ConfigMap's TOML, mounted where --config
	// reads it, decoded strictly by server/config with the pod's
	// environment on top, and valid.
	if len(k.ConfigMapGenerator) != 1 || !slices.Equal(k.ConfigMapGenerator[0].Files, []string{"sandboxd.toml"}) {
		t.Fatalf("configMapGenerator %+v, want one with sandboxd.toml", k.ConfigMapGenerator)
	}
	mountOf := func(name string) string {
		for _, m := range c.VolumeMounts {
			if m.Name == name {
				return m.MountPath
			}
		}
		return ""
	}
	vols := map[string]volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	var configPath string
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == k.ConfigMapGenerator[0].Name {
			configPath = filepath.Join(mountOf(v.Name), "sandboxd.toml")
		}
	}
	// pid 1 is the supervisor, serve its child (SECURITY.md case 60).
	if i := slices.Index(c.Args, "--config"); configPath == "" || i != 2 || len(c.Args) != 4 || c.Args[i+1] != configPath ||
		!slices.Equal(c.Args[:2], []string{"supervise", "serve"}) {
		t.Fatalf("args %v, want supervise serve --config %s (the ConfigMap's file)", c.Args, configPath)
	}
	env := podEnv(t, c)
	if unknown := config.UnknownEnv(env); len(unknown) > 0 {
		t.Errorf("EXECUTION_* variables no config key reads: %v", unknown)
	}
	cfg, src, err := config.Load("sandboxd.toml", env)
	if err != nil {
		t.Fatalf("sandboxd.toml with the pod's environment: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the pod's config is invalid: %v", err)
	}
	// The token comes from the Secret, never from the ConfigMap.
	if src["worker_token"] != config.SourceEnv || !strings.HasPrefix(cfg.WorkerToken, "secret-") {
		t.Errorf("worker_token from %s (%q), want EXECUTION_WORKER_TOKEN from a secretKeyRef", src["worker_token"], cfg.WorkerToken)
	}
	if cfg.WorkerID != "node-1.example" {
		t.Errorf("worker_id = %q, want the node's name", cfg.WorkerID)
	}
	// The guard accepts the Host of the probes, of Prometheus and of a
	// peer (the pod's IP) and of the Service's clients.
	for _, h := range []string{"10.244.1.5", "sandboxd", "sandboxd.sandboxd.svc.cluster.local"} {
		if !slices.Contains(cfg.AllowedHosts, h) {
			t.Errorf("allowed_hosts %v lacks %s", cfg.AllowedHosts, h)
		}
	}

	// Ports: the one worker_port, named http everywhere.
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != cfg.WorkerPort {
		t.Errorf("container ports %+v, want http = worker_port %d", c.Ports, cfg.WorkerPort)
	}
	ann := ds.Template.Metadata.Annotations
	open, all := openAPIPaths(t)
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(cfg.WorkerPort) || !all[ann["prometheus.io/path"]] {
		t.Errorf("prometheus annotations %v: want scrape, port %d and a served path", ann, cfg.WorkerPort)
	}

	// Probes: the two paths the guard serves without the token, on the
	// http port, with a Host the guard accepts.
	for _, p := range []struct {
		name string
		pr   *probe
		path string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.pr == nil {
			t.Errorf("no %s probe", p.name)
			continue
		}
		g := p.pr.HTTPGet
		if g.Path != p.path || g.Port != "http" || !open[g.Path] {
			t.Errorf("%s probe %+v: want GET %s on port http, open without the token in openapi.json", p.name, g, p.path)
		}
		host := ""
		for _, h := range g.HTTPHeaders {
			if h.Name == "Host" {
				host = h.Value
			}
		}
		if host != "localhost" && !slices.Contains(cfg.AllowedHosts, host) {
			t.Errorf("%s probe sends Host %q, which the guard refuses", p.name, host)
		}
	}

	// Privileged (README.md), requests = limits, sized from the config.
	if !c.SecurityContext.Privileged {
		t.Error("the worker is not privileged (README.md: why it must be)")
	}
	req, lim := c.Resources.Requests, c.Resources.Limits
	if len(req) == 0 || fmt.Sprint(req) != fmt.Sprint(lim) || req["cpu"] == "" || req["memory"] == "" {
		t.Errorf("requests %v, limits %v: want both cpu and memory, equal", req, lim)
	}
	// The warm sandboxes' cgroups are nested under the pod's too: every
	// template (each policy on each runtime) keeps its size ready.
	warm := 0
	for _, own := range []string{cfg.DynamicRuntime, cfg.SkillRuntime} {
		for _, rt := range cfg.RuntimeNames() {
			warm += cfg.TemplateSize(own, rt)
		}
	}
	if warm == 0 {
		t.Error("no warm sandboxes: the sizing below would not count them")
	}
	policyMem := float64(max(cfg.DynamicMemoryMB, cfg.SkillMemoryMB)) * (1 << 20)
	needMem := float64(cfg.MaxConcurrent)*(policyMem+float64(cfg.WorkspaceBytes)) + float64(cfg.SessionIdleMemoryBytes) +
		float64(warm)*warmSandboxBytes + 512<<20
	if got := quantity(t, lim["memory"]); got < needMem {
		t.Errorf("memory limit %s < max_concurrent x (policy memory + workspace_bytes) + session_idle_memory_bytes + %d warm sandboxes x 64Mi + 512Mi = %.0f MiB",
			lim["memory"], warm, needMem/(1<<20))
	}
	if got, need := quantity(t, lim["cpu"]), float64(cfg.MaxConcurrent)*max(cfg.DynamicCPUs, cfg.SkillCPUs); got < need {
		t.Errorf("cpu limit %s < max_concurrent x policy cpus = %v", lim["cpu"], need)
	}

	// SIGTERM drains within the grace period.
	stop := c.Lifecycle.PreStop.Sleep.Seconds
	if need := stop + int(cfg.ShutdownGraceMS/1000) + serveShutdownExtra; stop <= 0 || pod.TerminationGracePeriodSeconds < need {
		t.Errorf("terminationGracePeriodSeconds %d, preStop sleep %d: want a sleep and a period >= sleep + shutdown_grace_ms + %ds = %d",
			pod.TerminationGracePeriodSeconds, stop, serveShutdownExtra, need)
	}

	// Every directory the worker keeps is on the host (it outlives the pod:
	// the sweep, the interrupted results, the sessions), and the runtime
	// image comes from the node.
	layoutPath, _ := strings.CutPrefix(cfg.PythonImage, "oci-layout:")
	for _, p := range []struct{ key, path string }{
		{"state_root", cfg.StateRoot}, {"work_root", cfg.WorkRoot}, {"rootfs_cache", cfg.RootfsCache},
		{"results_dir", cfg.ResultsDir}, {"sessions_dir", cfg.SessionsDir}, {"python_image", layoutPath},
	} {
		ok := false
		for _, m := range c.VolumeMounts {
			if rel, err := filepath.Rel(m.MountPath, p.path); err == nil && filepath.IsLocal(rel) && vols[m.Name].HostPath != nil {
				ok = true
			}
		}
		if !ok {
			t.Errorf("%s %s is not on a hostPath volume", p.key, p.path)
		}
	}
	if mountOf("dev") != "/dev" || vols["dev"].HostPath == nil || vols["dev"].HostPath.Path != "/dev" {
		t.Error("the host's /dev is not mounted (a session's loop device would be missing)")
	}

	// The node pool: selected by a label, its taint tolerated.
	if len(pod.NodeSelector) == 0 {
		t.Error("no nodeSelector: the workers would run on every node")
	}
	for key := range pod.NodeSelector {
		if !slices.ContainsFunc(pod.Tolerations, func(tl struct{ Key, Operator, Value, Effect string }) bool {
			return tl.Key == key && tl.Effect == "NoSchedule"
		}) {
			t.Errorf("the pool's taint %s:NoSchedule is not tolerated", key)
		}
	}

	// Selectors: the DaemonSet's, the Services' and the PDB's match the pods.
	labels := ds.Template.Metadata.Labels
	if !subset(ds.Selector.MatchLabels, labels) {
		t.Errorf("DaemonSet selector %v does not match the pod labels %v", ds.Selector.MatchLabels, labels)
	}
	if ds.UpdateStrategy.Type != "RollingUpdate" || ds.UpdateStrategy.RollingUpdate.MaxUnavailable != 1 {
		t.Errorf("update strategy %+v, want RollingUpdate one node at a time", ds.UpdateStrategy)
	}
	for _, name := range []string{"sandboxd", "sandboxd-workers"} {
		var svc serviceSpec
		find(t, objs, "Service", name, &svc)
		if !subset(svc.Selector, labels) || len(svc.Ports) != 1 || svc.Ports[0].Port != cfg.WorkerPort || svc.Ports[0].TargetPort != "http" {
			t.Errorf("Service %s: %+v", name, svc)
		}
		if headless := svc.ClusterIP == "None"; headless != (name == "sandboxd-workers") {
			t.Errorf("Service %s: clusterIP %q", name, svc.ClusterIP)
		}
	}
	var pdb pdbSpec
	find(t, objs, "PodDisruptionBudget", "sandboxd", &pdb)
	if !subset(pdb.Selector.MatchLabels, labels) || pdb.MaxUnavailable != 1 {
		t.Errorf("PodDisruptionBudget %+v", pdb)
	}
	checkPeers(t, objs, cfg, pod)

	// The image is pinned by digest, never a tag: with IfNotPresent a node
	// keeps whichever build of a tag it pulled first.
	if len(k.Images) != 1 || k.Images[0].Name != c.Image || strings.ContainsAny(c.Image, ":@") {
		t.Errorf("kustomization images %+v do not name the container's image %q (untagged)", k.Images, c.Image)
	} else if img := k.Images[0]; img.NewTag != "" || !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(img.Digest) {
		t.Errorf("kustomization image %+v: want a digest (sha256:…), no tag", img)
	}
}

// checkPeers: with peers_source = "kubernetes" the workers list the
// EndpointSlices of the headless Service (server/peers): the pod runs as a
// ServiceAccount whose token it mounts, bound to a Role that grants list
// on endpointslices (the one call server/peers makes) and nothing else;
// peers_service is the
// headless Service, whose port is named http (the port the workers take).
func checkPeers(t *testing.T, objs []object, cfg config.Config, pod podSpec) {
	t.Helper()
	if cfg.PeersSource != config.PeersKubernetes {
		t.Fatalf("peers_source = %q, want %q (README.md, Session forwarding)", cfg.PeersSource, config.PeersKubernetes)
	}
	var svc serviceSpec
	find(t, objs, "Service", cfg.PeersService, &svc)
	if svc.ClusterIP != "None" || len(svc.Ports) != 1 || svc.Ports[0].Name != "http" {
		t.Errorf("peers_service %s: %+v, want headless with one port named http", cfg.PeersService, svc)
	}
	if pod.ServiceAccountName == "" || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Fatalf("the pod's serviceAccountName %q, automountServiceAccountToken %v: want an account and its token mounted",
			pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	find(t, objs, "ServiceAccount", pod.ServiceAccountName, &struct{}{})
	granted := false
	for _, rb := range objs {
		if rb.Kind != "RoleBinding" || !slices.ContainsFunc(rb.Subjects, func(s subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == pod.ServiceAccountName
		}) {
			continue
		}
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.APIGroup != "rbac.authorization.k8s.io" {
			t.Errorf("RoleBinding %s binds %+v: want a Role of the namespace, never a ClusterRole", rb.Metadata.Name, rb.RoleRef)
			continue
		}
		role := find(t, objs, "Role", rb.RoleRef.Name, &struct{}{})
		for _, r := range role.Rules {
			if !slices.Equal(r.APIGroups, []string{"discovery.k8s.io"}) || !slices.Equal(r.Resources, []string{"endpointslices"}) {
				t.Errorf("Role %s grants %v on %v: want endpointslices of discovery.k8s.io only", role.Metadata.Name, r.Verbs, r.Resources)
				continue
			}
			if !slices.Equal(r.Verbs, []string{"list"}) {
				t.Errorf("Role %s grants %v on endpointslices: want list only, the one call server/peers makes", role.Metadata.Name, r.Verbs)
			}
			granted = granted || slices.Contains(r.Verbs, "list")
		}
	}
	if !granted {
		t.Errorf("no RoleBinding gives ServiceAccount %s list on endpointslices", pod.ServiceAccountName)
	}
}
