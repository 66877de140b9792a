// Package config is the configuration of `sandboxd serve`: its keys and
// defaults, loading (a strict TOML file, then EXECUTION_* variables),
// printing with each value's source, and validation. It imports nothing of
// the server: the server and cmd/sandboxd depend on it.
package config

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// EnvPrefix starts every environment variable that overrides the config. The
// names are those of the Docker-based worker sandboxd replaces, so existing
// deployments keep their environment.
const EnvPrefix = "EXECUTION_"

// Config is the whole configuration of `sandboxd serve`. Every field has a
// TOML key; its environment override is EnvPrefix + the key in upper case
// (worker_port → EXECUTION_WORKER_PORT). Defaults are in Default.
type Config struct {
	// WorkerHost is the address to listen on. A non-loopback address needs
	// WorkerToken.
	WorkerHost string `toml:"worker_host" doc:"address to listen on"`
	// WorkerPort is the TCP port to listen on.
	WorkerPort int `toml:"worker_port" doc:"TCP port to listen on"`
	// WorkerToken, when set, must be sent as "Authorization: Bearer TOKEN".
	WorkerToken string `toml:"worker_token" doc:"bearer token required on every API call (empty: none)" secret:"true"`
	// AllowedHosts are the extra Host header values accepted besides
	// localhost, 127.0.0.1, [::1] and WorkerHost (DNS-rebinding defence).
	AllowedHosts []string `toml:"allowed_hosts" doc:"extra accepted Host header names (comma-separated in the env)"`
	// WorkerSocket, when set, serves the same API on a unix socket at this
	// path too (access on one host is then the file's group and mode).
	WorkerSocket string `toml:"worker_socket" doc:"unix socket path serving the API too (empty: none)"`
	// WorkerSocketGroup owns the socket (a group name or gid; empty: the
	// worker's own group).
	WorkerSocketGroup string `toml:"worker_socket_group" doc:"group of worker_socket (name or gid; empty: the worker's)"`
	// WorkerSocketMode is the socket's permission bits.
	WorkerSocketMode FileMode `toml:"worker_socket_mode" doc:"permission bits of worker_socket (octal)"`

	// WorkRoot holds one directory per execution, removed after the response.
	WorkRoot string `toml:"work_root" doc:"directory for per-execution workspaces"`
	// PythonImage is the default runtime's image reference (as in the
	// rootfs package): the old spelling of Runtimes["default"], kept for
	// existing deployments (EXECUTION_PYTHON_IMAGE). Load makes the two
	// agree; Validate refuses them different.
	PythonImage string `toml:"python_image" doc:"the default runtime's image reference (old spelling of runtimes.default)"`
	// Runtimes names the images a policy or a request may choose: name →
	// image reference. "default" is python_image when not set here. A
	// request names a runtime, never an image (SECURITY.md case 57).
	Runtimes map[string]string `toml:"runtimes" doc:"named runtimes: name = image reference (comma-separated name=ref in the env)"`
	// RootfsCache is where images are unpacked, read-only, by digest.
	RootfsCache string `toml:"rootfs_cache" doc:"content-addressed cache of unpacked images"`
	// StateRoot is the sandbox runner's state directory.
	StateRoot string `toml:"state_root" doc:"sandbox runner state directory"`
	// CgroupParent is where sandbox cgroups are created, relative to the
	// worker's own cgroup (never above it).
	CgroupParent string `toml:"cgroup_parent" doc:"sandboxes' parent cgroup, relative to the worker's own"`

	DynamicTimeoutMS int64   `toml:"dynamic_timeout_ms" doc:"dynamic policy: maximum and default timeout"`
	SkillTimeoutMS   int64   `toml:"skill_timeout_ms" doc:"skill policy: maximum and default timeout"`
	DynamicMemoryMB  int64   `toml:"dynamic_memory_mb" doc:"dynamic policy: memory limit (MiB)"`
	SkillMemoryMB    int64   `toml:"skill_memory_mb" doc:"skill policy: memory limit (MiB)"`
	DynamicCPUs      float64 `toml:"dynamic_cpus" doc:"dynamic policy: CPU bandwidth (cores)"`
	SkillCPUs        float64 `toml:"skill_cpus" doc:"skill policy: CPU bandwidth (cores)"`
	PidsLimit        int64   `toml:"pids_limit" doc:"tasks (processes+threads) per sandbox"`
	// DynamicRuntime and SkillRuntime are the runtimes each policy runs on
	// when a request names none.
	DynamicRuntime string `toml:"dynamic_runtime" doc:"dynamic policy: its runtime (a name in runtimes)"`
	SkillRuntime   string `toml:"skill_runtime" doc:"skill policy: its runtime (a name in runtimes)"`

	MaxCodeBytes  int64 `toml:"max_code_bytes" doc:"largest accepted code"`
	MaxInputBytes int64 `toml:"max_input_bytes" doc:"largest accepted input JSON plus decoded files"`

	MaxConcurrent int `toml:"max_concurrent" doc:"executions running at once (default: number of CPUs)"`
	MaxQueued     int `toml:"max_queued" doc:"executions waiting for a slot before 429"`

	MaxStdoutBytes    int64 `toml:"max_stdout_bytes" doc:"stdout kept per execution"`
	MaxStderrBytes    int64 `toml:"max_stderr_bytes" doc:"stderr kept per execution"`
	MaxResultBytes    int64 `toml:"max_result_bytes" doc:"largest output/result.json"`
	MaxArtifactBytes  int64 `toml:"max_artifact_bytes" doc:"largest single artifact"`
	MaxArtifactsBytes int64 `toml:"max_artifacts_bytes" doc:"total artifact bytes per execution"`
	MaxArtifacts      int   `toml:"max_artifacts" doc:"artifacts per execution"`

	// AllowedEnv are the variable names a request may set in `env`.
	AllowedEnv []string `toml:"allowed_env" doc:"env names a request may set (comma-separated in the env)"`

	// WorkspaceBytes sizes the tmpfs mounted on every workspace: code,
	// input and everything the run writes must fit (SECURITY.md case 3: filling
	// the workspace ends in ENOSPC, not in a full host disk).
	WorkspaceBytes int64 `toml:"workspace_bytes" doc:"size of each execution's /workspace tmpfs"`

	// PoolSize is the number of pre-started sandboxes kept ready per policy
	// (0 disables the warm pool).
	PoolSize int `toml:"pool_size" doc:"warm sandboxes kept ready per policy on its own runtime (0: off)"`
	// RuntimePoolSize is the number of warm sandboxes kept per policy on
	// each other runtime (absent: 0), so that a second image costs no
	// memory until an operator asks for it.
	RuntimePoolSize map[string]int `toml:"runtime_pool_size" doc:"warm sandboxes kept ready per policy on another runtime: name = count (comma-separated name=n in the env)"`
	// PoolMaxIdle retires a warm sandbox that waited this long.
	PoolMaxIdle Duration `toml:"pool_max_idle" doc:"retire a warm sandbox idle this long (Go duration)"`
	// PoolPreload are the modules a warm sandbox imports before hand-off.
	PoolPreload []string `toml:"pool_preload" doc:"modules imported by warm sandboxes (comma-separated in the env)"`
	// PoolTemplateForks makes each warm sandbox a copy-on-write fork of a
	// template process that imported pool_preload once per runtime (the
	// policies of one runtime share it when their environments agree:
	// server/warmpool/TEMPLATE.md), instead of a sandbox that imports it
	// itself (a zygote, false). On by default since the default suites
	// run on it (TEMPLATE.md step 8); cgroup v1 and v2.
	PoolTemplateForks bool `toml:"pool_template_forks" doc:"warm sandboxes are forks of a per-runtime template process (false: each imports pool_preload itself)"`
	// PoolTemplateMaxForks and PoolTemplateMaxAge rotate a template: what
	// its forks share with it (address-space layout, the str hash secret;
	// SECURITY.md case 64) is bounded by how many forks and how long one
	// template serves.
	PoolTemplateMaxForks int      `toml:"pool_template_max_forks" doc:"forks one template serves before a new one replaces it"`
	PoolTemplateMaxAge   Duration `toml:"pool_template_max_age" doc:"age at which a template is replaced (Go duration)"`

	// What one client may make the worker itself hold (SECURITY.md cases
	// 32 and 33): request files and workspace inodes, bodies being decoded
	// and answers being streamed at once, and how long a connection may
	// take to send or receive.
	MaxInputFiles     int      `toml:"max_input_files" doc:"files and directories a request's files create under input/"`
	WorkspaceInodes   int64    `toml:"workspace_inodes" doc:"inodes of each execution's /workspace tmpfs (nr_inodes)"`
	MaxDecoding       int      `toml:"max_decoding" doc:"request bodies read and decoded at once (429 beyond)"`
	MaxStreams        int      `toml:"max_streams" doc:"stored answers streamed at once to GET and retries (503 beyond); event streams attached at once (429 beyond)"`
	ReadHeaderTimeout Duration `toml:"read_header_timeout" doc:"time a client has to send a request's headers"`
	ReadTimeout       Duration `toml:"read_timeout" doc:"time a client has to send a whole request, body included"`
	WriteTimeout      Duration `toml:"write_timeout" doc:"time a response may take to write, from when it is ready"`
	IdleTimeout       Duration `toml:"idle_timeout" doc:"keep-alive connection idle this long is closed"`

	// ResultsDir holds the result store (server/results): finished results
	// on disk, so they survive a restart and never sit in memory.
	ResultsDir string `toml:"results_dir" doc:"directory of the result store"`
	// ResultsMaxBytes bounds the stored results' disk bytes (answers' JSON
	// and artifacts), oldest evicted first (SECURITY.md case 31).
	ResultsMaxBytes int64 `toml:"results_max_bytes" doc:"disk bytes of the finished results kept"`
	ResultsMax      int   `toml:"results_max" doc:"finished results kept for GET"`
	ResultsTTLMS    int64 `toml:"results_ttl_ms" doc:"how long a finished result is kept"`
	ShutdownGraceMS int64 `toml:"shutdown_grace_ms" doc:"SIGTERM: time in-flight runs get before they are cancelled"`

	// Sessions (server/session): one persistent workspace volume per
	// session under SessionsDir, each with a kernel-enforced quota of
	// SessionMaxBytes and SessionMaxFiles (server/volume), and a
	// long-lived Python kernel stopped after an idle time.
	SessionsDir      string   `toml:"sessions_dir" doc:"directory of the sessions' workspace volumes"`
	MaxSessions      int      `toml:"max_sessions" doc:"sessions at once (429 beyond)"`
	SessionRetention Duration `toml:"session_retention" doc:"a session unused this long is deleted with its files"`
	// SessionIdleTimeout is the default idle time after which a session's
	// kernel is stopped (its files stay); a request may ask for up to
	// SessionMaxIdleTimeout.
	SessionIdleTimeout    Duration `toml:"session_idle_timeout" doc:"default idle time before a session's kernel is stopped"`
	SessionMaxIdleTimeout Duration `toml:"session_max_idle_timeout" doc:"largest idle_timeout_ms a session may ask for"`
	// SessionIdleMemoryBytes bounds the memory all idle kernels hold,
	// host-wide: beyond it the longest-idle kernel is stopped.
	SessionIdleMemoryBytes int64 `toml:"session_idle_memory_bytes" doc:"memory of all idle session kernels (longest idle stopped beyond)"`
	SessionMaxBytes        int64 `toml:"session_max_bytes" doc:"bytes each session's workspace holds (kernel-enforced quota)"`
	SessionMaxFiles        int64 `toml:"session_max_files" doc:"files and directories each session's workspace holds (kernel-enforced)"`
	// SessionSpareVolumes empty workspace volumes are kept made and
	// mounted ahead of time, so that creating a session does not wait for
	// mkfs (server/session: spares).
	SessionSpareVolumes int `toml:"session_spare_volumes" doc:"empty session volumes kept ready so that a session's creation does not wait for mkfs (0: none)"`
	// SessionSpareKernels of the spare volumes also hold a kernel of the
	// default session type, handed off from a warm sandbox ahead of any
	// request, which a new session of that type adopts (server/session:
	// spares).
	SessionSpareKernels int `toml:"session_spare_kernels" doc:"spare volumes that also hold a default-type kernel ready for a new session (0: none; at most session_spare_volumes are used)"`

	// WorkerID names this worker among others (on Kubernetes: its node's
	// name, from the downward API); GET /v1/capacity reports it. Empty:
	// a worker alone.
	WorkerID string `toml:"worker_id" doc:"this worker's name among several, e.g. its node's (empty: none)"`

	// Session forwarding (server/README.md, "Session forwarding"): with
	// worker_id set, a session's id names its owner, and a request for a
	// session another worker owns is forwarded to it. PeersSource says
	// where the other workers are listed: "" none (no forwarding), static
	// (Peers), kubernetes (the EndpointSlices of PeersService, listed every
	// PeersRefresh through the in-cluster API).
	PeersSource string `toml:"peers_source" doc:"where the other workers are listed for session forwarding: empty (none), static (peers) or kubernetes (peers_service's EndpointSlices)"`
	// Peers are the workers by worker_id: their base URLs (this worker's
	// own entry may be there too, so that every worker gets one list).
	Peers map[string]string `toml:"peers" doc:"static peers: worker_id = base URL http://HOST:PORT (comma-separated id=url in the env)"`
	// PeersService is the headless Service of the workers (kubernetes).
	PeersService string `toml:"peers_service" doc:"kubernetes peers: the headless Service listing the workers"`
	// PeersNamespace is its namespace (empty: the pod's own, read from the
	// mounted service account).
	PeersNamespace string `toml:"peers_namespace" doc:"kubernetes peers: the Service's namespace (empty: the pod's)"`
	// PeersRefresh is how often the EndpointSlices are listed again.
	PeersRefresh Duration `toml:"peers_refresh" doc:"kubernetes peers: how often the EndpointSlices are listed (Go duration)"`
}

// Peer sources (PeersSource).
const (
	PeersStatic     = "static"
	PeersKubernetes = "kubernetes"
)

// DefaultRuntime is the runtime every configuration has: python_image's.
const DefaultRuntime = "default"

// RuntimeImages is the runtimes' image references by name: Runtimes, with
// "default" python_image's when Runtimes does not set it.
func (c Config) RuntimeImages() map[string]string {
	out := make(map[string]string, len(c.Runtimes)+1)
	for k, v := range c.Runtimes {
		out[k] = v
	}
	if _, ok := out[DefaultRuntime]; !ok {
		out[DefaultRuntime] = c.PythonImage
	}
	return out
}

// TemplateSize is the warm sandboxes kept of a policy whose own runtime is
// own on the runtime rt: pool_size on its own, runtime_pool_size.rt on
// another.
func (c Config) TemplateSize(own, rt string) int {
	if rt == own {
		return c.PoolSize
	}
	return c.RuntimePoolSize[rt]
}

// RuntimeNames are the runtimes' names, sorted.
func (c Config) RuntimeNames() []string {
	names := slices.Collect(maps.Keys(c.RuntimeImages()))
	sort.Strings(names)
	return names
}

// DefaultPreload is what a warm sandbox imports before it is handed code.
var DefaultPreload = []string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot"}

// Default is the configuration with nothing set.
func Default() Config {
	return Config{
		WorkerHost:           "127.0.0.1",
		WorkerPort:           3100,
		WorkRoot:             "/var/lib/sandboxd/work",
		PythonImage:          "oci-layout:build/python-runtime.oci",
		RootfsCache:          "/var/lib/sandboxd/rootfs",
		StateRoot:            "/run/sandboxd/state",
		CgroupParent:         "sandboxd",
		DynamicTimeoutMS:     30_000,
		SkillTimeoutMS:       120_000,
		DynamicMemoryMB:      1024,
		SkillMemoryMB:        2048,
		DynamicCPUs:          1,
		SkillCPUs:            1,
		PidsLimit:            128,
		DynamicRuntime:       DefaultRuntime,
		SkillRuntime:         DefaultRuntime,
		MaxCodeBytes:         1 << 20,
		MaxInputBytes:        32 << 20,
		MaxConcurrent:        runtime.NumCPU(),
		MaxQueued:            16,
		MaxStdoutBytes:       1 << 20,
		MaxStderrBytes:       1 << 20,
		MaxResultBytes:       4 << 20,
		MaxArtifactBytes:     16 << 20,
		MaxArtifactsBytes:    48 << 20,
		MaxArtifacts:         32,
		AllowedEnv:           []string{"LANG", "LC_ALL", "TZ", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONIOENCODING"},
		WorkspaceBytes:       256 << 20,
		PoolSize:             2,
		PoolMaxIdle:          Duration(10 * time.Minute),
		PoolTemplateForks:    true,
		PoolTemplateMaxForks: 1000,
		PoolTemplateMaxAge:   Duration(time.Hour),
		PoolPreload:          slices.Clone(DefaultPreload),
		WorkerSocketMode:     0o660,
		MaxInputFiles:        1000,
		WorkspaceInodes:      16384,
		MaxDecoding:          4,
		MaxStreams:           256,
		ReadHeaderTimeout:    Duration(10 * time.Second),
		ReadTimeout:          Duration(2 * time.Minute),
		WriteTimeout:         Duration(time.Minute),
		IdleTimeout:          Duration(time.Minute),
		ResultsDir:           "/var/lib/sandboxd/results",
		ResultsMaxBytes:      2 << 30,
		ResultsMax:           1000,
		ResultsTTLMS:         15 * 60 * 1000,
		ShutdownGraceMS:      30_000,

		SessionsDir:            "/var/lib/sandboxd/sessions",
		MaxSessions:            64,
		SessionRetention:       Duration(24 * time.Hour),
		SessionIdleTimeout:     Duration(20 * time.Minute),
		SessionMaxIdleTimeout:  Duration(2 * time.Hour),
		SessionIdleMemoryBytes: 4 << 30,
		SessionMaxBytes:        500 << 20,
		SessionMaxFiles:        10_000,
		SessionSpareVolumes:    2,
		SessionSpareKernels:    1,

		PeersService: "sandboxd-workers",
		PeersRefresh: Duration(5 * time.Second),
	}
}

// Source says where a config value came from.
type Source string

const (
	SourceDefault Source = "default"
	SourceFile    Source = "file"
	SourceEnv     Source = "env"
)

// Sources maps each TOML key to where its effective value came from.
type Sources map[string]Source

// configField is one Config field as the loader sees it.
type configField struct {
	key, env, doc string
	secret        bool
	index         int
}

func configFields() []configField {
	t := reflect.TypeFor[Config]()
	out := make([]configField, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		key := f.Tag.Get("toml")
		out = append(out, configField{
			key:    key,
			env:    EnvPrefix + strings.ToUpper(key),
			doc:    f.Tag.Get("doc"),
			secret: f.Tag.Get("secret") == "true",
			index:  i,
		})
	}
	return out
}

// Load builds the effective config: defaults, then the TOML file at
// path (if path is not empty), then EXECUTION_* variables from environ. The
// file is decoded strictly: an unknown key is an error, so a typo cannot be
// silently ignored. The result is not validated; call Validate.
func Load(path string, environ []string) (Config, Sources, error) {
	cfg := Default()
	src := Sources{}
	fields := configFields()
	for _, f := range fields {
		src[f.key] = SourceDefault
	}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, src, fmt.Errorf("config file: %w", err)
		}
		dec := toml.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return cfg, src, fmt.Errorf("config file %s: %s", path, describeTOMLError(err))
		}
		// A second, loose decode tells which keys the file set.
		var present map[string]any
		if err := toml.Unmarshal(data, &present); err != nil {
			return cfg, src, fmt.Errorf("config file %s: %w", path, err)
		}
		for k := range present {
			src[k] = SourceFile
		}
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, EnvPrefix) {
			env[k] = v
		}
	}
	var errs []error
	v := reflect.ValueOf(&cfg).Elem()
	for _, f := range fields {
		raw, ok := env[f.env]
		if !ok {
			continue
		}
		if err := setFromString(v.Field(f.index), raw); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", f.env, raw, err))
			continue
		}
		src[f.key] = SourceEnv
	}
	// python_image is the old spelling of runtimes.default: one set, the
	// other follows; both set and different, Validate says so.
	if ref, ok := cfg.Runtimes[DefaultRuntime]; ok && src["python_image"] == SourceDefault {
		cfg.PythonImage = ref
	}
	return cfg, src, errors.Join(errs...)
}

// UnknownEnv returns the EXECUTION_* names in environ that no config key
// reads. They are warned about, not refused: deployments of the Docker-based
// worker carry variables of its own (a typo still shows up in the warning).
func UnknownEnv(environ []string) []string {
	known := map[string]bool{}
	for _, f := range configFields() {
		known[f.env] = true
	}
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, EnvPrefix) && !known[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func describeTOMLError(err error) string {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var keys []string
		for _, e := range strict.Errors {
			keys = append(keys, strings.Join(e.Key(), "."))
		}
		return "unknown key(s): " + strings.Join(keys, ", ")
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		return fmt.Sprintf("line %d column %d: %s", row, col, de.Error())
	}
	return err.Error()
}

// Duration is a time.Duration written as a Go duration string ("10m") in
// TOML and in the environment.
type Duration time.Duration

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("not a duration (want e.g. 90s, 10m): %q", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// FileMode is a file's permission bits, written in octal ("0660") in TOML
// and in the environment.
type FileMode os.FileMode

// UnmarshalText parses octal permission bits.
func (m *FileMode) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 8, 32)
	if err != nil || v > 0o777 {
		return fmt.Errorf("not octal permission bits (want e.g. 0660): %q", b)
	}
	*m = FileMode(v)
	return nil
}

// MarshalText writes the bits in octal with a leading 0.
func (m FileMode) MarshalText() ([]byte, error) { return fmt.Appendf(nil, "%#o", uint32(m)), nil }

func setFromString(v reflect.Value, raw string) error {
	raw = strings.TrimSpace(raw)
	if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok {
		return u.UnmarshalText([]byte(raw))
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(raw)
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return fmt.Errorf("not a boolean (true or false)")
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		v.SetInt(n)
	case reflect.Float64:
		n, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return fmt.Errorf("not a number")
		}
		v.SetFloat(n)
	case reflect.Slice:
		var list []string
		for _, s := range strings.Split(raw, ",") {
			if s = strings.TrimSpace(s); s != "" {
				list = append(list, s)
			}
		}
		v.Set(reflect.ValueOf(list))
	case reflect.Map:
		// name=value,name=value: a TOML table in the environment, which
		// replaces the file's table whole. A name given twice is an
		// error, not the last one silently kept.
		m := reflect.MakeMap(v.Type())
		for _, s := range strings.Split(raw, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			k, val, ok := strings.Cut(s, "=")
			if !ok {
				return fmt.Errorf("want name=value pairs, got: %q", s)
			}
			k = strings.TrimSpace(k)
			if m.MapIndex(reflect.ValueOf(k)).IsValid() {
				return fmt.Errorf("%s given twice", k)
			}
			elem := reflect.New(v.Type().Elem()).Elem()
			if err := setFromString(elem, val); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			m.SetMapIndex(reflect.ValueOf(k), elem)
		}
		v.Set(m)
	default:
		return fmt.Errorf("unsupported kind %s", v.Kind())
	}
	return nil
}

// Print writes the effective config as TOML, each value followed by its
// environment name and its source; secrets are redacted.
func (c Config) Print(w io.Writer, src Sources) {
	v := reflect.ValueOf(c)
	for _, f := range configFields() {
		val := v.Field(f.index).Interface()
		var s string
		if f.secret && v.Field(f.index).String() != "" {
			s = `"<redacted>"`
		} else if fv := v.Field(f.index); fv.Kind() == reflect.Map {
			s = inlineTable(fv)
		} else {
			b, err := toml.Marshal(map[string]any{"v": val})
			if err != nil {
				s = fmt.Sprint(val)
			} else {
				s = strings.TrimSpace(strings.TrimPrefix(string(b), "v = "))
			}
		}
		fmt.Fprintf(w, "%-20s = %-40s # %-7s %s: %s\n", f.key, s, src[f.key], f.env, f.doc)
	}
}

// inlineTable writes a map as a TOML inline table, keys sorted.
func inlineTable(m reflect.Value) string {
	keys := m.MapKeys()
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	var parts []string
	for _, k := range keys {
		b, err := toml.Marshal(map[string]any{k.String(): m.MapIndex(k).Interface()})
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s = %v", k, m.MapIndex(k)))
			continue
		}
		parts = append(parts, strings.TrimSpace(string(b)))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
