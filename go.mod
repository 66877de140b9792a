module github.com/sandboxd/sandboxd

go 1.26.0

require (
	github.com/containerd/cgroups/v3 v3.1.3 // cgroup mode detection, /proc/self/cgroup parsing
	github.com/google/go-containerregistry v0.22.1 // OCI layouts, docker-archives, registry pulls
	github.com/julienschmidt/httprouter v1.3.0 // HTTP routing
	github.com/klauspost/compress v1.20.1 // zstd image layers
	github.com/moby/sys/mountinfo v0.7.2 // finding cgroup mounts (also used by libcontainer)
	github.com/modelcontextprotocol/go-sdk v1.8.0 // MCP server (server/mcp): the protocol's official Go SDK
	github.com/opencontainers/cgroups v0.1.0 // libcontainer cgroup types and device rules
	github.com/opencontainers/runc v1.5.3 // libcontainer: the sandbox itself
	github.com/pelletier/go-toml/v2 v2.4.3 // strict TOML config
	github.com/prometheus/client_golang v1.25.0 // /metrics
	github.com/seccomp/libseccomp-golang v0.12.0 // seccomp compile/export (the version runc 1.5 needs)
	go.etcd.io/bbolt v1.5.0 // the result store's records (server/results)
	go.yaml.in/yaml/v3 v3.0.5 // the Kubernetes manifests' test (tools/deploy/kubernetes); already required by prometheus/common
	golang.org/x/sys v0.50.0 // raw syscalls
)

require (
	cyphar.com/go-pathrs v0.2.6 // indirect
	github.com/aperturerobotics/protobuf-go-lite v0.14.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/checkpoint-restore/go-criu/v8 v8.3.0 // indirect
	github.com/cilium/ebpf v0.17.3 // indirect
	github.com/containerd/console v1.0.5 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/cyphar/filepath-securejoin v0.7.0 // indirect
	github.com/docker/cli v29.7.2+incompatible // indirect
	github.com/docker/docker-credential-helpers v0.9.3 // indirect
	github.com/godbus/dbus/v5 v5.2.2 // indirect
	github.com/google/jsonschema-go v0.4.3 // indirect
	github.com/moby/sys/capability v0.5.0 // indirect
	github.com/moby/sys/user v0.4.0 // indirect
	github.com/moby/sys/userns v0.2.1 // indirect
	github.com/mrunalp/fileutils v0.5.1 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	github.com/opencontainers/selinux v1.13.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/segmentio/asm v1.1.3 // indirect
	github.com/segmentio/encoding v0.5.4 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	github.com/yosida95/uritemplate/v3 v3.0.2 // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/oauth2 v0.37.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/time v0.15.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gotest.tools/v3 v3.5.2 // indirect
)
