// Argo CD's one command as upstream's cmd/main.go builds it, with the three commands the
// live tier runs only: argocd-application-controller, argocd-repo-server, and
// argocd-git-ask-pass, git's askpass, which the repo server runs as `argocd` with
// ARGOCD_BINARY_NAME set. Upstream's main also links the API server, the CLI, Dex, the
// ApplicationSet and notifications controllers (every SCM provider's and notification
// service's client), which take no part here and were half of this peer's cold build.
// It dispatches on the name it is called by, or ARGOCD_BINARY_NAME, as upstream's does.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	gitaskpass "github.com/argoproj/argo-cd/v3/cmd/argocd-git-ask-pass/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func init() {
	// as upstream's: klog at the configured log level and format
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	// Upstream's calls grpc.DisableSRVLookups(), which panics unless grpc's SRV lookups are
	// on: only grpc's grpclb balancer turns them on, and nothing of these three commands
	// links it, so they are off already, as that workaround wants them.
	name := filepath.Base(os.Args[0])
	if value := os.Getenv("ARGOCD_BINARY_NAME"); value != "" {
		name = value
	}
	var command *cobra.Command
	switch name {
	case common.CommandApplicationController:
		command = appcontroller.NewCommand()
	case common.CommandRepoServer:
		command = reposerver.NewCommand()
	case common.CommandGitAskPass:
		command = gitaskpass.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "%s: this build runs only %s, %s and %s\n", name,
			common.CommandApplicationController, common.CommandRepoServer, common.CommandGitAskPass)
		os.Exit(2)
	}
	// cobra has printed the error to stderr
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
