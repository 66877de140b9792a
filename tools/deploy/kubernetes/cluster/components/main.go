// Command kube is Kubernetes' control plane, node agent and client in one
// binary (the old hyperkube pattern): it runs the command its name says,
// through a symlink (kube-apiserver, kubelet, ...) or as `kube NAME ARGS`.
// Each command is built exactly as its cmd/NAME/main.go in
// k8s.io/kubernetes (and k8s.io/kubectl) builds it, with the same blank
// imports, so one binary behaves as the six upstream ones; linking them
// together shares one copy of client-go, apimachinery and the API types
// (155 MB instead of ~514 MB for six binaries, and one link instead of six).
// README.md (Components) says how it is built.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // kube-apiserver, kube-controller-manager: CronJob time zones

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl: client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// commands are the programs this binary is, by name; each returns the
// process's exit code. A command is constructed only when it runs: their
// constructors register flags and read the environment.
var commands = map[string]func() int{
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":        func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kube-proxy":     func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubectl":        kubectl,
}

// kubectl is cmd/kubectl/kubectl.go's main.
func kubectl() int {
	// As upstream: the verbosity is set before the command is built (which
	// reads plugins and .kuberc and may log), not only when flags are parsed.
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err) // prints the error and exits non-zero
	}
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	run, ok := commands[name]
	if !ok && len(os.Args) > 1 {
		// `kube kubelet ARGS`: the command sees itself as `kubelet ARGS`
		// (cobra reads os.Args[1:], kubectl its plugins' names from os.Args).
		if run, ok = commands[os.Args[1]]; ok {
			os.Args = os.Args[1:]
		}
	}
	if !ok {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: %s COMMAND [ARGS], or run it through a symlink named COMMAND; COMMAND is one of: %s\n",
			name, strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(run())
}
