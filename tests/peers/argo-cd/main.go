// Argo CD's one command as upstream's cmd/main.go builds it, with the four commands the
// live tier runs only: argocd-application-controller, argocd-repo-server, argocd-server
// (its /api/webhook takes Gitea's pushes) and argocd-git-ask-pass, git's askpass, which
// the repo server runs as `argocd` with ARGOCD_BINARY_NAME set. Upstream's main also links
// the CLI, Dex, the ApplicationSet and notifications controllers (every notification
// service's client), which take no part here. It dispatches on the name it is called by,
// or ARGOCD_BINARY_NAME, as upstream's does.
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
	apiserver "github.com/argoproj/argo-cd/v3/cmd/argocd-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/grpc"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func init() {
	// as upstream's: klog at the configured log level and format
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

// disableSRVLookups is upstream's workaround for grpc's SRV lookups, which only grpc's
// grpclb balancer turns on: DisableSRVLookups turns them off, and panics when they are
// off already (nothing linked grpclb), which is all the workaround wants.
func disableSRVLookups() {
	defer func() { _ = recover() }()
	grpc.DisableSRVLookups()
}

func main() {
	disableSRVLookups()
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
	case common.CommandServer:
		command = apiserver.NewCommand()
	case common.CommandGitAskPass:
		command = gitaskpass.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "%s: this build runs only %s, %s, %s and %s\n", name,
			common.CommandApplicationController, common.CommandRepoServer, common.CommandServer,
			common.CommandGitAskPass)
		os.Exit(2)
	}
	// cobra has printed the error to stderr
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
