// Package inside is what code sees inside a sandbox: the user it runs as,
// the default PATH, where the workspace is bound and how it is laid out, and
// the rule a sandbox's id follows. It is the one source of these facts for
// nsjail, rootfs, the server, the tools and the tests, and imports only the
// standard library. A shell script that must repeat one (the runtime image's
// passwd line) has a test comparing it with the constant here.
package inside

import (
	"regexp"
	"sync"
)

// UID and GID are the ids the command runs as inside every sandbox (mapped
// to an unprivileged host id; the runtime image names them "sandbox").
const (
	UID = 10001
	GID = 10001
)

// DefaultPath is the PATH a sandbox gets when its environment sets none
// (the server always sets this one).
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// Workspace is where the execution's host directory is bound, read-write.
const Workspace = "/workspace"

// The workspace's layout, each name relative to its parent: the server
// creates code/main.py and input/request.json, the code writes output/.
const (
	CodeDir       = "code"         // in Workspace
	CodeName      = "main.py"      // in CodeDir
	InputDir      = "input"        // in Workspace: request.json and the request's files
	RequestName   = "request.json" // in InputDir: the request's input JSON
	OutputDir     = "output"       // in Workspace: what the code leaves for the answer
	ResultName    = "result.json"  // in OutputDir: the answer's result
	ArtifactsName = "artifacts"    // in OutputDir: the answer's files
)

// The same files and directories as paths relative to the workspace's root.
const (
	CodeFile     = CodeDir + "/" + CodeName
	RequestFile  = InputDir + "/" + RequestName
	ResultFile   = OutputDir + "/" + ResultName
	ArtifactsDir = OutputDir + "/" + ArtifactsName
)

// LayoutDirs are the layout's directories, parents first.
var LayoutDirs = []string{CodeDir, InputDir, OutputDir, ArtifactsDir}

// LayoutInodes are the inodes the layout takes in a workspace's tmpfs: its
// root, the LayoutDirs, CodeFile and RequestFile.
const LayoutInodes = 1 + 4 + 2

// Path is the absolute path inside the sandbox of rel, a path relative to
// the workspace's root.
func Path(rel string) string { return Workspace + "/" + rel }

// IDRule is what a sandbox id must look like, and so a client's execution
// id: it names a container, a cgroup and a state directory, and turns up in
// file names and logs.
const IDRule = `[A-Za-z0-9][A-Za-z0-9_.-]{0,63}`

// idPattern is compiled on first use, not when the package is initialised:
// every sandbox's init (this binary, re-executed by libcontainer) initialises
// this package before it hands over, and IDRule's {0,63} compiles to ~60 KiB
// in ~860 allocations that the init never uses.
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^` + IDRule + `$`) })

// ValidID tells whether id follows IDRule.
func ValidID(id string) bool { return idPattern().MatchString(id) }
