package config

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// validateCases break one rule each; want is Validate's whole message,
// byte for byte (operators and tests match these strings).
var validateCases = []struct {
	name  string
	check string
	mod   func(*Config)
	want  string
}{
	{"empty host", "listen", func(c *Config) { c.WorkerHost = ""; c.WorkerToken = "t" }, "worker_host must not be empty"},
	{"port", "listen", func(c *Config) { c.WorkerPort = 70000 }, "worker_port must be in 1..65535, got: 70000"},
	{"open host without token", "listen", func(c *Config) { c.WorkerHost = "0.0.0.0" },
		`worker_token must be set when worker_host is not a loopback address, got host: "0.0.0.0"`},
	{"relative path", "paths", func(c *Config) { c.StateRoot = "state" }, `state_root must be an absolute path, got: "state"`},
	{"root path", "paths", func(c *Config) { c.RootfsCache = "/." }, "rootfs_cache must not be /"},
	{"cgroup parent", "cgroup_parent", func(c *Config) { c.CgroupParent = "a/../b" },
		`cgroup_parent must be a clean relative path below the worker's own cgroup, got: "a/../b"`},
	{"image", "python_image", func(c *Config) { c.PythonImage = "" }, "python_image must not be empty"},
	{"runtimes default differs", "runtimes", func(c *Config) { c.Runtimes = map[string]string{"default": "oci-layout:/a"} },
		`python_image and runtimes.default must not differ (python_image is the old spelling of runtimes.default: set one), got: "oci-layout:build/python-runtime.oci" and "oci-layout:/a"`},
	{"runtime name path", "runtimes", func(c *Config) { c.Runtimes = map[string]string{"../geo": "oci-layout:/g"} },
		`runtimes names must match [a-z][a-z0-9_-]{0,31}, got: "../geo"`},
	{"runtime name long", "runtimes", func(c *Config) { c.Runtimes = map[string]string{"g" + strings.Repeat("x", 32): "oci-layout:/g"} },
		`runtimes names must match [a-z][a-z0-9_-]{0,31}, got: "g` + strings.Repeat("x", 32) + `"`},
	{"runtime empty ref", "runtimes", func(c *Config) { c.Runtimes = map[string]string{"geo": ""} }, `runtimes.geo must be an image reference, got: ""`},
	{"policy runtime", "runtimes", func(c *Config) { c.SkillRuntime = "geo" }, `skill_runtime must name a runtime (one of [default]), got: "geo"`},
	{"runtime pool unknown", "runtimes", func(c *Config) { c.RuntimePoolSize = map[string]int{"geo": 1} },
		`runtime_pool_size keys must name a runtime (one of [default]), got: "geo"`},
	{"runtime pool negative", "runtimes", func(c *Config) {
		c.Runtimes = map[string]string{"geo": "oci-layout:/g"}
		c.RuntimePoolSize = map[string]int{"geo": -1}
		c.MaxConcurrent = 4
	}, "runtime_pool_size.geo must be in 0..68 (max_concurrent + max_sessions: more cannot be in use at once), got: -1"},
	{"runtime pool too big", "runtimes", func(c *Config) {
		c.Runtimes = map[string]string{"geo": "oci-layout:/g"}
		c.RuntimePoolSize = map[string]int{"geo": 10000}
		c.MaxConcurrent = 4
	}, "runtime_pool_size.geo must be in 0..68 (max_concurrent + max_sessions: more cannot be in use at once), got: 10000"},
	{"runtime pool of every policy's own", "runtimes", func(c *Config) { c.RuntimePoolSize = map[string]int{"default": 3} },
		"runtime_pool_size.default sizes nothing: every policy runs on default, where pool_size sizes its warm sandboxes"},
	{"minimum", "minimums", func(c *Config) { c.DynamicMemoryMB = 7 }, "dynamic_memory_mb must be >= 8, got: 7"},
	{"queue", "minimums", func(c *Config) { c.MaxQueued = -1 }, "max_queued must be >= 0, got: -1"},
	{"cpus", "cpus", func(c *Config) { c.SkillCPUs = 0.001 }, "skill_cpus must be in 0.01.." + strconv.Itoa(runtime.NumCPU()*64) + ", got: 0.001"},
	{"workspace bytes", "workspace", func(c *Config) { c.WorkspaceBytes = 2 << 20 },
		"workspace_bytes must be >= max_code_bytes + max_input_bytes + 1MiB (35651584), got: 2097152"},
	{"workspace inodes", "workspace", func(c *Config) { c.WorkspaceInodes = 100 },
		"workspace_inodes must be >= max_input_files + 71 (1071), got: 100"},
	{"timeout zero", "timeouts", func(c *Config) { c.IdleTimeout = 0 }, "idle_timeout must be > 0, got: 0s"},
	{"read timeout", "timeouts", func(c *Config) { c.ReadTimeout = Duration(time.Second) },
		"read_timeout must be >= read_header_timeout (10s), got: 1s"},
	{"socket relative", "worker_socket", func(c *Config) { c.WorkerSocket = "run/s.sock" },
		`worker_socket must be a clean absolute path, got: "run/s.sock"`},
	{"socket long", "worker_socket", func(c *Config) { c.WorkerSocket = "/" + strings.Repeat("s", 107) },
		"worker_socket must be at most 107 bytes (the kernel's sun_path), got: 108"},
	{"socket mode", "worker_socket", func(c *Config) { c.WorkerSocketMode = 0o1660 },
		"worker_socket_mode must be permission bits (at most 0777), got: 01660"},
	{"results bytes", "results", func(c *Config) { c.ResultsMaxBytes = 1 << 20 },
		"results_max_bytes must be >= the largest result, max_artifacts_bytes + 6×(max_stdout_bytes + max_stderr_bytes) + max_result_bytes + 1MiB (68157440), got: 1048576"},
	{"pool size", "pool", func(c *Config) { c.PoolSize, c.MaxConcurrent = 100, 4 },
		"pool_size must be <= max_concurrent + max_sessions (68: more cannot be in use at once), got: 100"},
	{"pool idle", "pool", func(c *Config) { c.PoolMaxIdle = Duration(time.Millisecond) }, "pool_max_idle must be >= 1s, got: 1ms"},
	{"template forks", "pool", func(c *Config) { c.PoolTemplateMaxForks = 0 }, "pool_template_max_forks must be >= 1, got: 0"},
	{"template age", "pool", func(c *Config) { c.PoolTemplateMaxAge = Duration(time.Second) }, "pool_template_max_age must be >= 1m, got: 1s"},
	{"pool preload", "pool", func(c *Config) { c.PoolPreload = []string{"a-b"} }, `pool_preload entries must be Python module names, got: "a-b"`},
	{"env name", "allowed_env", func(c *Config) { c.AllowedEnv = []string{"1X"} }, `allowed_env entries must be variable names, got: "1X"`},
	{"sessions dir", "paths", func(c *Config) { c.SessionsDir = "sessions" }, `sessions_dir must be an absolute path, got: "sessions"`},
	{"max sessions", "minimums", func(c *Config) { c.MaxSessions = 0 }, "max_sessions must be >= 1, got: 0"},
	{"worker id", "worker_id", func(c *Config) { c.WorkerID = "Node_1" },
		`worker_id must be empty or a DNS name (lower-case letters, digits, '-' and '.', at most 253), got: "Node_1"`},
	{"idle memory", "minimums", func(c *Config) { c.SessionIdleMemoryBytes = -1 }, "session_idle_memory_bytes must be >= 1, got: -1"},
	{"session bytes", "sessions", func(c *Config) { c.SessionMaxBytes = 1000 }, "session_max_bytes must be in 1048576..1099511627776, got: 1000"},
	{"session files", "sessions", func(c *Config) { c.SessionMaxFiles = 1 << 23 }, "session_max_files must be in 16..4194304, got: 8388608"},
	{"spare volumes negative", "sessions", func(c *Config) { c.SessionSpareVolumes = -1 }, "session_spare_volumes must be in 0..16, got: -1"},
	{"spare volumes many", "sessions", func(c *Config) { c.SessionSpareVolumes = 17 }, "session_spare_volumes must be in 0..16, got: 17"},
	{"spare kernels negative", "sessions", func(c *Config) { c.SessionSpareKernels = -1 }, "session_spare_kernels must be in 0..16, got: -1"},
	{"spare kernels many", "sessions", func(c *Config) { c.SessionSpareKernels = 17 }, "session_spare_kernels must be in 0..16, got: 17"},
	{"session retention", "sessions", func(c *Config) { c.SessionRetention = Duration(time.Millisecond) }, "session_retention must be >= 1s, got: 1ms"},
	{"session idle above max", "sessions", func(c *Config) { c.SessionIdleTimeout = Duration(3 * time.Hour) },
		"session_idle_timeout must be <= session_max_idle_timeout (2h0m0s), got: 3h0m0s"},
	{"peers source", "peers", func(c *Config) { c.PeersSource = "dns" }, `peers_source must be empty, "static" or "kubernetes", got: "dns"`},
	{"peers without source", "peers", func(c *Config) { c.Peers = map[string]string{"a": "http://10.0.0.1:3100"} },
		`peers is read only with peers_source = "static", got: peers_source = ""`},
	{"peers without worker id", "peers", func(c *Config) {
		c.PeersSource = "static"
		c.Peers = map[string]string{"a": "http://10.0.0.1:3100"}
	}, `worker_id must be set when peers_source is set, got: peers_source = "static" and no worker_id`},
	{"static peers empty", "peers", func(c *Config) { c.PeersSource, c.WorkerID = "static", "a" },
		`peers must list the workers (worker_id = "http://HOST:PORT") with peers_source = "static"`},
	{"static peer id", "peers", func(c *Config) {
		c.PeersSource, c.WorkerID = "static", "a"
		c.Peers = map[string]string{"Node_1": "http://10.0.0.1:3100"}
	}, `peers: "Node_1" must be a worker_id (a DNS name)`},
	{"static peer url path", "peers", func(c *Config) {
		c.PeersSource, c.WorkerID = "static", "a"
		c.Peers = map[string]string{"b": "http://10.0.0.2:3100/v1"}
	}, `peers.b: must be a base URL http://HOST:PORT (or https), got: "http://10.0.0.2:3100/v1"`},
	{"static peer url port", "peers", func(c *Config) {
		c.PeersSource, c.WorkerID = "static", "a"
		c.Peers = map[string]string{"b": "http://10.0.0.2"}
	}, `peers.b: must be a base URL http://HOST:PORT (or https), got: "http://10.0.0.2"`},
	{"static peer url port range", "peers", func(c *Config) {
		c.PeersSource, c.WorkerID = "static", "a"
		c.Peers = map[string]string{"b": "http://10.0.0.2:70000"}
	}, `peers.b: must be a base URL http://HOST:PORT (or https), got: "http://10.0.0.2:70000"`},
	{"kubernetes with peers", "peers", func(c *Config) {
		c.PeersSource, c.WorkerID = "kubernetes", "a"
		c.Peers = map[string]string{"b": "http://10.0.0.2:3100"}
	}, `peers must be empty with peers_source = "kubernetes" (the EndpointSlices list the workers)`},
	{"kubernetes service", "peers", func(c *Config) { c.PeersSource, c.WorkerID, c.PeersService = "kubernetes", "a", "Workers" },
		`peers_service must be a Service name (a DNS label), got: "Workers"`},
	{"kubernetes refresh", "peers", func(c *Config) {
		c.PeersSource, c.WorkerID, c.PeersRefresh = "kubernetes", "a", Duration(time.Millisecond)
	}, "peers_refresh must be >= 1s, got: 1ms"},
	{"env reserved", "allowed_env", func(c *Config) { c.AllowedEnv = []string{"LD_PRELOAD"} }, "allowed_env must not include LD_PRELOAD: the worker sets it"},
}

func TestValidateMessages(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("the defaults must be valid: %v", err)
	}
	// Spare volumes turned off keep a valid config: the default spare
	// kernel is then simply not kept (the server uses at most that many).
	noSpares := Default()
	noSpares.SessionSpareVolumes = 0
	if err := noSpares.Validate(); err != nil {
		t.Fatalf("session_spare_volumes 0 with the default session_spare_kernels: %v", err)
	}
	for _, tc := range validateCases {
		c := Default()
		tc.mod(&c)
		err := c.Validate()
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: got %v\nwant %s", tc.name, err, tc.want)
		}
	}
}

// Each rule is its own named check: a broken value is reported by its check
// alone, and the defaults pass every check.
func TestChecksAreSeparate(t *testing.T) {
	names := map[string]bool{}
	for _, ch := range checks {
		if names[ch.name] {
			t.Errorf("check %q twice", ch.name)
		}
		names[ch.name] = true
		if errs := ch.fn(Default()); len(errs) != 0 {
			t.Errorf("check %q rejects the defaults: %v", ch.name, errs)
		}
	}
	for _, tc := range validateCases {
		if !names[tc.check] {
			t.Errorf("%s: no check named %q", tc.name, tc.check)
		}
		c := Default()
		tc.mod(&c)
		for _, ch := range checks {
			errs := ch.fn(c)
			switch {
			case ch.name == tc.check && (len(errs) != 1 || errs[0].Error() != tc.want):
				t.Errorf("%s: check %q: got %v, want %q", tc.name, ch.name, errs, tc.want)
			case ch.name != tc.check && len(errs) != 0:
				t.Errorf("%s: check %q reports it too: %v", tc.name, ch.name, errs)
			}
		}
	}
}
