// Command telorunner runs the whole runner in one process: embedded NATS
// JetStream (store under RUNNER_DATA_DIR) and every service, serving /v1
// on PORT (default 8062). Configuration errors exit with status 2;
// `telorunner version` prints the build's version.
//
// Two subcommands serve standalone installs:
//
//	telorunner provision                   create/update every stream and bucket as the provisioner
//	                                       (RUNNER_NATS_URL, RUNNER_NATS_NKEY_FILE)
//	telorunner credentials generate <dir>  write <dir>/<role>.nk seeds, print "<role> <public key>"
package main

import (
	"fmt"
	"os"

	"github.com/telorunner/telorunner/pkg/obs"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/pkg/version"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

func main() {
	if version.Handled("telorunner") {
		return
	}
	if len(os.Args) >= 3 && os.Args[1] == "credentials" && os.Args[2] == "generate" {
		if len(os.Args) != 4 {
			fmt.Fprintln(os.Stderr, "usage: telorunner credentials generate <dir>")
			os.Exit(2)
		}
		if err := allinone.GenerateCredentials(os.Args[3], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] != "provision" {
		fmt.Fprintf(os.Stderr, "unknown command %q (want: provision, credentials generate <dir>, or none)\n", os.Args[1])
		os.Exit(2)
	}
	cfg, err := allinone.LoadConfig(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := run.SignalContext()
	defer stop()
	log := obs.NewLogger(os.Stderr, cfg.Edge.LogLevel.String(), os.Getenv("LOG_FORMAT"))
	if len(os.Args) > 1 { // provision
		if err := allinone.ProvisionBus(ctx, cfg, os.Getenv("RUNNER_NATS_URL"), os.Getenv("RUNNER_NATS_NKEY_FILE"), log); err != nil {
			log.Error("provision failed", "err", err)
			os.Exit(1)
		}
		log.Info("bus provisioned")
		return
	}
	if err := allinone.Run(ctx, cfg, allinone.Deps{Logger: log}); err != nil {
		log.Error("telorunner stopped", "err", err)
		os.Exit(1)
	}
}
