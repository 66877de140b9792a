package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// ReservedEnv are set by the worker for every run (the server's
// Policy.BaseEnv); a request cannot override them, so allowed_env must not
// name them (PATH or PYTHONPATH would let a caller change what the
// interpreter loads, LD_PRELOAD what the loader maps).
var ReservedEnv = map[string]bool{
	"PATH": true, "HOME": true, "MPLCONFIGDIR": true, "MPLBACKEND": true, "PYTHONDONTWRITEBYTECODE": true,
	"PYTHONUNBUFFERED": true, "OMP_NUM_THREADS": true, "OPENBLAS_NUM_THREADS": true,
	"MKL_NUM_THREADS": true, "PYTHONPATH": true, "PYTHONHOME": true, "PYTHONSTARTUP": true,
	"LD_PRELOAD": true, "LD_LIBRARY_PATH": true,
}

// MaxSocketPath bounds worker_socket: the kernel's sun_path is 108 bytes
// with its NUL. (server.ListenUnix binds it under a short name first.)
const MaxSocketPath = 108 - 1

// MinOutputInodes is the least room workspace_inodes must leave the code
// beyond the layout and max_input_files.
const MinOutputInodes = 64

// A check is one rule of Validate: it returns every problem it finds, each
// in the form "key must be ..., got: value".
type check struct {
	name string
	fn   func(Config) []error
}

// checks are Validate's rules, in the order of their messages.
var checks = []check{
	{"listen", listenCheck},
	{"paths", pathsCheck},
	{"cgroup_parent", cgroupParentCheck},
	{"python_image", pythonImageCheck},
	{"runtimes", runtimesCheck},
	{"minimums", minimumsCheck},
	{"cpus", cpusCheck},
	{"workspace", workspaceCheck},
	{"timeouts", timeoutsCheck},
	{"worker_socket", workerSocketCheck},
	{"results", resultsCheck},
	{"pool", poolCheck},
	{"allowed_env", allowedEnvCheck},
	{"sessions", sessionsCheck},
	{"worker_id", workerIDCheck},
	{"peers", peersCheck},
}

// Validate rejects values that cannot work, every problem at once, each in
// the form "key must be ..., got: value".
func (c Config) Validate() error {
	var errs []error
	for _, ch := range checks {
		errs = append(errs, ch.fn(c)...)
	}
	return errors.Join(errs...)
}

func listenCheck(c Config) (errs []error) {
	if c.WorkerHost == "" {
		errs = append(errs, errors.New("worker_host must not be empty"))
	}
	if c.WorkerPort < 1 || c.WorkerPort > 65535 {
		errs = append(errs, fmt.Errorf("worker_port must be in 1..65535, got: %d", c.WorkerPort))
	}
	if !isLoopbackHost(c.WorkerHost) && c.WorkerToken == "" {
		// Anything on the network could run code otherwise.
		errs = append(errs, fmt.Errorf("worker_token must be set when worker_host is not a loopback address, got host: %q", c.WorkerHost))
	}
	return errs
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(h, "[]"))
	return ip != nil && ip.IsLoopback()
}

func pathsCheck(c Config) (errs []error) {
	for _, p := range []struct{ key, v string }{
		{"work_root", c.WorkRoot}, {"rootfs_cache", c.RootfsCache}, {"state_root", c.StateRoot},
		{"results_dir", c.ResultsDir}, {"sessions_dir", c.SessionsDir},
	} {
		if !filepath.IsAbs(p.v) {
			errs = append(errs, fmt.Errorf("%s must be an absolute path, got: %q", p.key, p.v))
		} else if filepath.Clean(p.v) == "/" {
			// The orphan sweep deletes what it finds under work_root.
			errs = append(errs, fmt.Errorf("%s must not be /", p.key))
		}
	}
	return errs
}

func cgroupParentCheck(c Config) []error {
	if cp := c.CgroupParent; cp == "" || filepath.IsAbs(cp) || !filepath.IsLocal(cp) || filepath.Clean(cp) != cp {
		// Relative and below: the start-up sweep kills everything under it.
		return []error{fmt.Errorf("cgroup_parent must be a clean relative path below the worker's own cgroup, got: %q", cp)}
	}
	return nil
}

func pythonImageCheck(c Config) []error {
	if c.PythonImage == "" {
		return []error{errors.New("python_image must not be empty")}
	}
	return nil
}

// RuntimeNameRule is what a runtime's name must match: a short word, so
// that it is never a path or an image reference (SECURITY.md case 57).
const RuntimeNameRule = `[a-z][a-z0-9_-]{0,31}`

// The patterns of this file are compiled on first use (lazyPattern).
var runtimeNamePattern = lazyPattern(`^` + RuntimeNameRule + `$`)

// lazyPattern compiles expr on the first call of the function it returns,
// not when the package is initialised: sandboxd's every sandbox init (the
// binary re-executed by libcontainer) initialises this package before it
// hands over, and would pay for patterns it never uses (worker_id's {0,251}
// alone compiles to ~190 KiB in ~1,200 allocations).
func lazyPattern(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// ValidRuntimeName reports whether name matches RuntimeNameRule.
func ValidRuntimeName(name string) bool { return runtimeNamePattern().MatchString(name) }

func runtimesCheck(c Config) (errs []error) {
	if ref, ok := c.Runtimes[DefaultRuntime]; ok && ref != c.PythonImage {
		errs = append(errs, fmt.Errorf("python_image and runtimes.default must not differ (python_image is the old spelling of runtimes.default: set one), got: %q and %q", c.PythonImage, ref))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Runtimes)) {
		if !ValidRuntimeName(name) {
			errs = append(errs, fmt.Errorf("runtimes names must match %s, got: %q", RuntimeNameRule, name))
		} else if c.Runtimes[name] == "" {
			errs = append(errs, fmt.Errorf("runtimes.%s must be an image reference, got: \"\"", name))
		}
	}
	images := c.RuntimeImages()
	for _, p := range []struct{ key, v string }{{"dynamic_runtime", c.DynamicRuntime}, {"skill_runtime", c.SkillRuntime}} {
		if _, ok := images[p.v]; !ok {
			errs = append(errs, fmt.Errorf("%s must name a runtime (one of %v), got: %q", p.key, c.RuntimeNames(), p.v))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.RuntimePoolSize)) {
		if _, ok := images[name]; !ok {
			errs = append(errs, fmt.Errorf("runtime_pool_size keys must name a runtime (one of %v), got: %q", c.RuntimeNames(), name))
		} else if n := c.RuntimePoolSize[name]; n < 0 || n > c.maxTemplateSize() {
			errs = append(errs, fmt.Errorf("runtime_pool_size.%s must be in 0..%d (max_concurrent + max_sessions: more cannot be in use at once), got: %d",
				name, c.maxTemplateSize(), n))
		} else if name == c.DynamicRuntime && name == c.SkillRuntime {
			errs = append(errs, fmt.Errorf("runtime_pool_size.%s sizes nothing: every policy runs on %s, where pool_size sizes its warm sandboxes", name, name))
		}
	}
	return errs
}

func minimumsCheck(c Config) (errs []error) {
	for _, p := range []struct {
		key string
		v   int64
		min int64
	}{
		{"dynamic_timeout_ms", c.DynamicTimeoutMS, 1},
		{"skill_timeout_ms", c.SkillTimeoutMS, 1},
		{"dynamic_memory_mb", c.DynamicMemoryMB, 8},
		{"skill_memory_mb", c.SkillMemoryMB, 8},
		{"pids_limit", c.PidsLimit, 1},
		{"max_code_bytes", c.MaxCodeBytes, 1},
		{"max_input_bytes", c.MaxInputBytes, 1},
		{"max_concurrent", int64(c.MaxConcurrent), 1},
		{"max_input_files", int64(c.MaxInputFiles), 0},
		{"max_decoding", int64(c.MaxDecoding), 1},
		{"max_streams", int64(c.MaxStreams), 1},
		{"max_queued", int64(c.MaxQueued), 0},
		{"max_stdout_bytes", c.MaxStdoutBytes, 1},
		{"max_stderr_bytes", c.MaxStderrBytes, 1},
		{"max_result_bytes", c.MaxResultBytes, 1},
		{"max_artifact_bytes", c.MaxArtifactBytes, 0},
		{"max_artifacts_bytes", c.MaxArtifactsBytes, 0},
		{"max_artifacts", int64(c.MaxArtifacts), 0},
		{"workspace_bytes", c.WorkspaceBytes, 1 << 20},
		{"pool_size", int64(c.PoolSize), 0},
		{"results_max", int64(c.ResultsMax), 1},
		{"results_ttl_ms", c.ResultsTTLMS, 1},
		{"shutdown_grace_ms", c.ShutdownGraceMS, 0},
		{"max_sessions", int64(c.MaxSessions), 1},
		{"session_idle_memory_bytes", c.SessionIdleMemoryBytes, 1},
	} {
		if p.v < p.min {
			errs = append(errs, fmt.Errorf("%s must be >= %d, got: %d", p.key, p.min, p.v))
		}
	}
	return errs
}

func cpusCheck(c Config) (errs []error) {
	most := runtime.NumCPU() * 64
	for _, p := range []struct {
		key string
		v   float64
	}{{"dynamic_cpus", c.DynamicCPUs}, {"skill_cpus", c.SkillCPUs}} {
		if p.v < 0.01 || p.v > float64(most) {
			errs = append(errs, fmt.Errorf("%s must be in 0.01..%d, got: %g", p.key, most, p.v))
		}
	}
	return errs
}

func workspaceCheck(c Config) (errs []error) {
	if need := c.MaxCodeBytes + c.MaxInputBytes + 1<<20; c.WorkspaceBytes >= 1<<20 && c.WorkspaceBytes < need {
		// The request files alone would not fit in the workspace.
		errs = append(errs, fmt.Errorf("workspace_bytes must be >= max_code_bytes + max_input_bytes + 1MiB (%d), got: %d", need, c.WorkspaceBytes))
	}
	if need := int64(c.MaxInputFiles) + inside.LayoutInodes + MinOutputInodes; c.WorkspaceInodes < need {
		// The server's own files must fit, and leave the code some room.
		errs = append(errs, fmt.Errorf("workspace_inodes must be >= max_input_files + %d (%d), got: %d", inside.LayoutInodes+MinOutputInodes, need, c.WorkspaceInodes))
	}
	return errs
}

func timeoutsCheck(c Config) (errs []error) {
	for _, p := range []struct {
		key string
		v   Duration
	}{
		{"read_header_timeout", c.ReadHeaderTimeout}, {"read_timeout", c.ReadTimeout},
		{"write_timeout", c.WriteTimeout}, {"idle_timeout", c.IdleTimeout},
	} {
		if p.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be > 0, got: %s", p.key, time.Duration(p.v)))
		}
	}
	if c.ReadTimeout < c.ReadHeaderTimeout {
		errs = append(errs, fmt.Errorf("read_timeout must be >= read_header_timeout (%s), got: %s", time.Duration(c.ReadHeaderTimeout), time.Duration(c.ReadTimeout)))
	}
	return errs
}

func workerSocketCheck(c Config) (errs []error) {
	if sock := c.WorkerSocket; sock != "" {
		switch {
		case !filepath.IsAbs(sock) || filepath.Clean(sock) != sock:
			errs = append(errs, fmt.Errorf("worker_socket must be a clean absolute path, got: %q", sock))
		case len(sock) > MaxSocketPath:
			errs = append(errs, fmt.Errorf("worker_socket must be at most %d bytes (the kernel's sun_path), got: %d", MaxSocketPath, len(sock)))
		}
	}
	if c.WorkerSocketMode&^0o777 != 0 {
		errs = append(errs, fmt.Errorf("worker_socket_mode must be permission bits (at most 0777), got: %#o", uint32(c.WorkerSocketMode)))
	}
	return errs
}

func resultsCheck(c Config) []error {
	if need := c.maxResultBytes(); c.ResultsMaxBytes < need {
		// The newest result must fit, or it would evict itself.
		return []error{fmt.Errorf("results_max_bytes must be >= the largest result, max_artifacts_bytes + 6×(max_stdout_bytes + max_stderr_bytes) + max_result_bytes + 1MiB (%d), got: %d", need, c.ResultsMaxBytes)}
	}
	return nil
}

// maxResultBytes bounds one stored result: its artifacts, its JSON (stdout
// and stderr at most 6 bytes per byte once escaped as \uXXXX, result.json
// compacted) and room for the rest.
func (c Config) maxResultBytes() int64 {
	return c.MaxArtifactsBytes + 6*(c.MaxStdoutBytes+c.MaxStderrBytes) + c.MaxResultBytes + 1<<20
}

var pythonModulePattern = lazyPattern(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

// maxTemplateSize bounds a warm template's size: executions and session
// kernels in use at once. More would only hold memory.
func (c Config) maxTemplateSize() int { return c.MaxConcurrent + c.MaxSessions }

func poolCheck(c Config) (errs []error) {
	if c.PoolSize > c.maxTemplateSize() {
		errs = append(errs, fmt.Errorf("pool_size must be <= max_concurrent + max_sessions (%d: more cannot be in use at once), got: %d",
			c.maxTemplateSize(), c.PoolSize))
	}
	if c.PoolTemplateMaxForks < 1 {
		errs = append(errs, fmt.Errorf("pool_template_max_forks must be >= 1, got: %d", c.PoolTemplateMaxForks))
	}
	if time.Duration(c.PoolTemplateMaxAge) < time.Minute {
		errs = append(errs, fmt.Errorf("pool_template_max_age must be >= 1m, got: %s", time.Duration(c.PoolTemplateMaxAge)))
	}
	if time.Duration(c.PoolMaxIdle) < time.Second {
		errs = append(errs, fmt.Errorf("pool_max_idle must be >= 1s, got: %s", time.Duration(c.PoolMaxIdle)))
	}
	for _, m := range c.PoolPreload {
		if !pythonModulePattern().MatchString(m) {
			errs = append(errs, fmt.Errorf("pool_preload entries must be Python module names, got: %q", m))
		}
	}
	return errs
}

func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func allowedEnvCheck(c Config) (errs []error) {
	for _, n := range c.AllowedEnv {
		if !isEnvName(n) {
			errs = append(errs, fmt.Errorf("allowed_env entries must be variable names, got: %q", n))
		} else if ReservedEnv[n] {
			errs = append(errs, fmt.Errorf("allowed_env must not include %s: the worker sets it", n))
		}
	}
	return errs
}

// The bounds of a session volume's quota: those of package server/volume
// (MinBytes, MaxBytesLimit, MinFiles, MaxFilesLimit; config imports
// nothing of the server, and a server test checks that they agree).
const (
	SessionMinBytes = 1 << 20
	SessionMaxBytes = 1 << 40
	SessionMinFiles = 16
	SessionMaxFiles = 1 << 22
	// MaxSpareVolumes bounds session_spare_volumes: each spare holds a
	// loop device and a mount, and a few absorb any burst of creations
	// the refill (~13 ms a volume) cannot follow anyway.
	MaxSpareVolumes = 16
)

func sessionsCheck(c Config) (errs []error) {
	if c.SessionMaxBytes < SessionMinBytes || c.SessionMaxBytes > SessionMaxBytes {
		errs = append(errs, fmt.Errorf("session_max_bytes must be in %d..%d, got: %d", int64(SessionMinBytes), int64(SessionMaxBytes), c.SessionMaxBytes))
	}
	if c.SessionMaxFiles < SessionMinFiles || c.SessionMaxFiles > SessionMaxFiles {
		errs = append(errs, fmt.Errorf("session_max_files must be in %d..%d, got: %d", SessionMinFiles, SessionMaxFiles, c.SessionMaxFiles))
	}
	if c.SessionSpareVolumes < 0 || c.SessionSpareVolumes > MaxSpareVolumes {
		errs = append(errs, fmt.Errorf("session_spare_volumes must be in 0..%d, got: %d", MaxSpareVolumes, c.SessionSpareVolumes))
	}
	// Not checked against session_spare_volumes: a config that turns the
	// spare volumes off (0) keeps working, with no spare kernel.
	if c.SessionSpareKernels < 0 || c.SessionSpareKernels > MaxSpareVolumes {
		errs = append(errs, fmt.Errorf("session_spare_kernels must be in 0..%d, got: %d", MaxSpareVolumes, c.SessionSpareKernels))
	}
	for _, p := range []struct {
		key string
		v   Duration
	}{
		{"session_retention", c.SessionRetention}, {"session_idle_timeout", c.SessionIdleTimeout},
		{"session_max_idle_timeout", c.SessionMaxIdleTimeout},
	} {
		if time.Duration(p.v) < time.Second {
			errs = append(errs, fmt.Errorf("%s must be >= 1s, got: %s", p.key, time.Duration(p.v)))
		}
	}
	if c.SessionIdleTimeout > c.SessionMaxIdleTimeout && time.Duration(c.SessionIdleTimeout) >= time.Second {
		// The default must be a value a request could ask for.
		errs = append(errs, fmt.Errorf("session_idle_timeout must be <= session_max_idle_timeout (%s), got: %s",
			time.Duration(c.SessionMaxIdleTimeout), time.Duration(c.SessionIdleTimeout)))
	}
	return errs
}

// workerIDPattern is a DNS subdomain (RFC 1123), what Kubernetes allows
// for a node's name: worker_id is meant to be one, and is then safe to put
// in a log line, a header or a host name.
var workerIDPattern = lazyPattern(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)

func workerIDCheck(c Config) []error {
	if c.WorkerID != "" && !workerIDPattern().MatchString(c.WorkerID) {
		return []error{fmt.Errorf("worker_id must be empty or a DNS name (lower-case letters, digits, '-' and '.', at most 253), got: %q", c.WorkerID)}
	}
	return nil
}

// ValidWorkerID tells whether id is a worker_id (workerIDPattern).
func ValidWorkerID(id string) bool { return workerIDPattern().MatchString(id) }

// dnsLabel is a Service's name (RFC 1123 label).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func peersCheck(c Config) (errs []error) {
	switch c.PeersSource {
	case "":
		if len(c.Peers) > 0 {
			errs = append(errs, errors.New("peers is read only with peers_source = \"static\", got: peers_source = \"\""))
		}
		return errs
	case PeersStatic, PeersKubernetes:
	default:
		return []error{fmt.Errorf("peers_source must be empty, %q or %q, got: %q", PeersStatic, PeersKubernetes, c.PeersSource)}
	}
	if c.WorkerID == "" {
		// The ids name their owner by worker_id's token.
		errs = append(errs, fmt.Errorf("worker_id must be set when peers_source is set, got: peers_source = %q and no worker_id", c.PeersSource))
	}
	if c.PeersSource == PeersKubernetes {
		if len(c.Peers) > 0 {
			errs = append(errs, errors.New("peers must be empty with peers_source = \"kubernetes\" (the EndpointSlices list the workers)"))
		}
		if !dnsLabel.MatchString(c.PeersService) {
			errs = append(errs, fmt.Errorf("peers_service must be a Service name (a DNS label), got: %q", c.PeersService))
		}
		if c.PeersNamespace != "" && !dnsLabel.MatchString(c.PeersNamespace) {
			errs = append(errs, fmt.Errorf("peers_namespace must be empty or a namespace name (a DNS label), got: %q", c.PeersNamespace))
		}
		if time.Duration(c.PeersRefresh) < time.Second {
			errs = append(errs, fmt.Errorf("peers_refresh must be >= 1s, got: %s", time.Duration(c.PeersRefresh)))
		}
		return errs
	}
	if len(c.Peers) == 0 {
		errs = append(errs, errors.New("peers must list the workers (worker_id = \"http://HOST:PORT\") with peers_source = \"static\""))
	}
	for _, id := range slices.Sorted(maps.Keys(c.Peers)) {
		if !ValidWorkerID(id) {
			errs = append(errs, fmt.Errorf("peers: %q must be a worker_id (a DNS name)", id))
		}
		if err := CheckPeerURL(c.Peers[id]); err != nil {
			errs = append(errs, fmt.Errorf("peers.%s: %w", id, err))
		}
	}
	return errs
}

// CheckPeerURL accepts a worker's base URL: http or https, a host and a
// port (1-65535), nothing else (no path, query, fragment or user: the
// forwarded request's path is the client's: SECURITY.md case 58).
func CheckPeerURL(raw string) error {
	bad := fmt.Errorf("must be a base URL http://HOST:PORT (or https), got: %q", raw)
	u, err := url.Parse(raw)
	if err != nil {
		return bad
	}
	if port, _ := strconv.Atoi(u.Port()); (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || port < 1 || port > 65535 ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
		return bad
	}
	return nil
}
