package config

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLoadConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(file, []byte(`worker_port = 4000
dynamic_timeout_ms = 5000
pool_max_idle = "90s"
pool_preload = ["numpy"]
worker_token = "from-file"
session_retention = "48h"
max_sessions = 8
`), 0o600)
	cfg, src, err := Load(file, []string{"EXECUTION_SESSION_MAX_FILES=500", "EXECUTION_SESSIONS_DIR=/srv/sessions", "EXECUTION_WORKER_PORT=4100", "EXECUTION_ALLOWED_ENV=TZ, LANG", "EXECUTION_POOL_SIZE=0", "OTHER=1"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.WorkerPort != 4100 || src["worker_port"] != SourceEnv {
		t.Errorf("env must win: %d %s", cfg.WorkerPort, src["worker_port"])
	}
	if cfg.DynamicTimeoutMS != 5000 || src["dynamic_timeout_ms"] != SourceFile {
		t.Errorf("file value: %d %s", cfg.DynamicTimeoutMS, src["dynamic_timeout_ms"])
	}
	if time.Duration(cfg.PoolMaxIdle) != 90*time.Second || !slices.Equal(cfg.PoolPreload, []string{"numpy"}) || cfg.PoolSize != 0 {
		t.Errorf("pool settings: %v %v %d", cfg.PoolMaxIdle, cfg.PoolPreload, cfg.PoolSize)
	}
	if !slices.Equal(cfg.AllowedEnv, []string{"TZ", "LANG"}) {
		t.Errorf("env list: %q", cfg.AllowedEnv)
	}
	if cfg.SkillMemoryMB != 2048 || src["skill_memory_mb"] != SourceDefault {
		t.Errorf("default: %d %s", cfg.SkillMemoryMB, src["skill_memory_mb"])
	}
	if time.Duration(cfg.SessionRetention) != 48*time.Hour || cfg.MaxSessions != 8 || src["max_sessions"] != SourceFile ||
		cfg.SessionMaxFiles != 500 || cfg.SessionsDir != "/srv/sessions" || src["sessions_dir"] != SourceEnv ||
		cfg.SessionMaxBytes != 500<<20 || src["session_max_bytes"] != SourceDefault ||
		time.Duration(cfg.SessionIdleTimeout) != 20*time.Minute || time.Duration(cfg.SessionMaxIdleTimeout) != 2*time.Hour ||
		cfg.SessionIdleMemoryBytes != 4<<30 {
		t.Errorf("session settings: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg.Print(&out, src)
	if strings.Contains(out.String(), "from-file") || !strings.Contains(out.String(), "<redacted>") ||
		!strings.Contains(out.String(), "EXECUTION_POOL_MAX_IDLE") || !strings.Contains(out.String(), "'1m30s'") ||
		!strings.Contains(out.String(), "EXECUTION_SESSION_IDLE_MEMORY_BYTES") || !strings.Contains(out.String(), "'48h0m0s'") {
		t.Errorf("print:\n%s", out.String())
	}
	if u := UnknownEnv([]string{"EXECUTION_WORKER_PORT=1", "EXECUTION_WROKER_PORT=2", "PATH=/"}); !slices.Equal(u, []string{"EXECUTION_WROKER_PORT"}) {
		t.Errorf("unknown env: %v", u)
	}
}

func TestConfigErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(file, []byte("worker_prot = 1\n"), 0o600)
	if _, _, err := Load(file, nil); err == nil || !strings.Contains(err.Error(), "unknown key(s): worker_prot") {
		t.Errorf("unknown key: %v", err)
	}
	_, _, err := Load("", []string{"EXECUTION_POOL_MAX_IDLE=soon", "EXECUTION_DYNAMIC_CPUS=one"})
	if err == nil || !strings.Contains(err.Error(), "EXECUTION_POOL_MAX_IDLE") || !strings.Contains(err.Error(), "EXECUTION_DYNAMIC_CPUS") {
		t.Errorf("bad env values: %v", err)
	}
	c := Default()
	c.WorkspaceBytes = 2 << 20
	c.PoolSize = -1
	c.PoolMaxIdle = Duration(time.Millisecond)
	c.CgroupParent = "../escape"
	c.WorkRoot = "/"
	c.AllowedEnv = []string{"PATH"}
	c.PoolPreload = []string{"os; import x"}
	err = c.Validate()
	for _, want := range []string{"workspace_bytes must be >=", "pool_size must be >= 0", "pool_max_idle must be >= 1s",
		"cgroup_parent must be a clean relative path", "work_root must not be /", "allowed_env must not include PATH", "pool_preload entries"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate lacks %q: %v", want, err)
		}
	}
}

// The limits, timeouts and unix socket settings: parsed from the env and
// TOML, printed, and validated with clear messages.
func TestLimitsConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(file, []byte("worker_socket_mode = \"0640\"\nread_timeout = \"3m\"\n"), 0o600)
	cfg, src, err := Load(file, []string{"EXECUTION_WORKER_SOCKET=/run/sandboxd/api.sock", "EXECUTION_WORKER_SOCKET_GROUP=sandboxd",
		"EXECUTION_MAX_INPUT_FILES=10", "EXECUTION_WORKSPACE_INODES=500", "EXECUTION_IDLE_TIMEOUT=5s"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.WorkerSocketMode != 0o640 || time.Duration(cfg.ReadTimeout) != 3*time.Minute || src["read_timeout"] != SourceFile ||
		cfg.WorkerSocket != "/run/sandboxd/api.sock" || cfg.MaxInputFiles != 10 || cfg.WorkspaceInodes != 500 || time.Duration(cfg.IdleTimeout) != 5*time.Second {
		t.Errorf("loaded: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg.Print(&out, src)
	for _, want := range []string{"worker_socket_mode   = '0640'", "EXECUTION_WORKER_SOCKET_GROUP", "max_decoding         = 4 ", "write_timeout        = '1m0s'"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("print lacks %q:\n%s", want, out.String())
		}
	}
	if _, _, err := Load("", []string{"EXECUTION_WORKER_SOCKET_MODE=0999"}); err == nil || !strings.Contains(err.Error(), "octal") {
		t.Errorf("bad mode: %v", err)
	}

	c := Default()
	c.MaxInputFiles = 1000
	c.WorkspaceInodes = 1000
	c.MaxDecoding = 0
	c.ReadHeaderTimeout = Duration(time.Minute)
	c.ReadTimeout = Duration(time.Second)
	c.WriteTimeout = 0
	c.WorkerSocket = "run/api.sock"
	c.WorkerSocketMode = 0o4660
	err = c.Validate()
	for _, want := range []string{"workspace_inodes must be >= max_input_files + 71 (1071), got: 1000", "max_decoding must be >= 1",
		"read_timeout must be >= read_header_timeout (1m0s), got: 1s", "write_timeout must be > 0", "worker_socket must be a clean absolute path",
		"worker_socket_mode must be permission bits"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate lacks %q: %v", want, err)
		}
	}
	c = Default()
	c.WorkerSocket = "/" + strings.Repeat("s", 110)
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "worker_socket must be at most 107 bytes") {
		t.Errorf("long socket path: %v", err)
	}
}

func TestConfigResultsStore(t *testing.T) {
	cfg, src, err := Load("", []string{"EXECUTION_RESULTS_DIR=/srv/results", "EXECUTION_RESULTS_MAX_BYTES=1073741824"})
	if err != nil || cfg.ResultsDir != "/srv/results" || cfg.ResultsMaxBytes != 1<<30 || src["results_max_bytes"] != SourceEnv {
		t.Fatalf("env: %v %q %d %s", err, cfg.ResultsDir, cfg.ResultsMaxBytes, src["results_max_bytes"])
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.ResultsDir = "results"
	cfg.ResultsMaxBytes = 64 << 20 // below one result of the default limits (65 MiB)
	err = cfg.Validate()
	for _, want := range []string{`results_dir must be an absolute path, got: "results"`, "results_max_bytes must be >= the largest result"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate lacks %q: %v", want, err)
		}
	}
}

// Named runtimes: a [runtimes] table, or EXECUTION_RUNTIMES=name=ref,...;
// python_image is the old spelling of runtimes.default (either sets it;
// both, different, is refused); policies name theirs; the pool sizes of
// the other runtimes are a table too.
func TestRuntimesConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(file, []byte(`skill_runtime = "geo"
[runtimes]
default = "oci-layout:/srv/py.oci"
geo = "oci-layout:/srv/geo.oci:v1"
[runtime_pool_size]
geo = 1
`), 0o600)
	cfg, src, err := Load(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"default": "oci-layout:/srv/py.oci", "geo": "oci-layout:/srv/geo.oci:v1"}
	if !maps.Equal(cfg.RuntimeImages(), want) || cfg.PythonImage != "oci-layout:/srv/py.oci" || src["runtimes"] != SourceFile ||
		cfg.SkillRuntime != "geo" || cfg.DynamicRuntime != "default" || cfg.RuntimePoolSize["geo"] != 1 {
		t.Errorf("from the file: %v %q %s %q %q %v", cfg.RuntimeImages(), cfg.PythonImage, src["runtimes"], cfg.SkillRuntime, cfg.DynamicRuntime, cfg.RuntimePoolSize)
	}
	var out bytes.Buffer
	cfg.Print(&out, src)
	if !strings.Contains(out.String(), `{default = 'oci-layout:/srv/py.oci', geo = 'oci-layout:/srv/geo.oci:v1'}`) ||
		!strings.Contains(out.String(), "{geo = 1}") {
		t.Errorf("print:\n%s", out.String())
	}

	// The environment: pairs; python_image alone is the default runtime.
	cfg, _, err = Load("", []string{"EXECUTION_PYTHON_IMAGE=oci-layout:/old", "EXECUTION_RUNTIMES=geo=oci-layout:/g, ml = oci-layout:/m", "EXECUTION_RUNTIME_POOL_SIZE=ml=2"})
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]string{"default": "oci-layout:/old", "geo": "oci-layout:/g", "ml": "oci-layout:/m"}
	if err := cfg.Validate(); err != nil || !maps.Equal(cfg.RuntimeImages(), want) || cfg.RuntimePoolSize["ml"] != 2 ||
		!slices.Equal(cfg.RuntimeNames(), []string{"default", "geo", "ml"}) {
		t.Errorf("from the env: %v %v %v", err, cfg.RuntimeImages(), cfg.RuntimePoolSize)
	}
	if _, _, err := Load("", []string{"EXECUTION_RUNTIMES=geo"}); err == nil || !strings.Contains(err.Error(), `EXECUTION_RUNTIMES="geo": want name=value pairs`) {
		t.Errorf("a pair without =: %v", err)
	}
	if _, _, err := Load("", []string{"EXECUTION_RUNTIME_POOL_SIZE=geo=two"}); err == nil || !strings.Contains(err.Error(), "geo: not an integer") {
		t.Errorf("a count that is no number: %v", err)
	}
	if _, _, err := Load("", []string{"EXECUTION_RUNTIMES=geo=oci-layout:/a, geo =oci-layout:/b"}); err == nil || !strings.Contains(err.Error(), "geo given twice") {
		t.Errorf("a name given twice: %v", err)
	}
	// The env's table replaces the file's whole (not merged into it).
	cfg, _, err = Load(file, []string{"EXECUTION_RUNTIMES=default=oci-layout:/srv/py.oci,ml=oci-layout:/m", "EXECUTION_SKILL_RUNTIME=ml", "EXECUTION_RUNTIME_POOL_SIZE="})
	if err != nil || !slices.Equal(cfg.RuntimeNames(), []string{"default", "ml"}) {
		t.Errorf("the env's runtimes over the file's: %v %v", err, cfg.RuntimeNames())
	}

	// Both spellings, different: refused, naming both.
	cfg, _, err = Load(file, []string{"EXECUTION_PYTHON_IMAGE=oci-layout:/other"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `python_image and runtimes.default must not differ`) ||
		!strings.Contains(err.Error(), `"oci-layout:/other" and "oci-layout:/srv/py.oci"`) {
		t.Errorf("python_image against runtimes.default: %v", err)
	}
	// Both, the same: fine.
	cfg, _, _ = Load(file, []string{"EXECUTION_PYTHON_IMAGE=oci-layout:/srv/py.oci"})
	if err := cfg.Validate(); err != nil {
		t.Errorf("python_image equal to runtimes.default: %v", err)
	}
}
