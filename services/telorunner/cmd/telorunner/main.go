// Command telorunner runs the whole runner in one process: embedded NATS
// JetStream (store under RUNNER_DATA_DIR) and every service, serving /v1
// on PORT (default 8062). Configuration errors exit with status 2;
// `telorunner version` prints the build's version.
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
	if version.Requested(os.Args[1:]) {
		version.Print(os.Stdout, "telorunner")
		return
	}
	cfg, err := allinone.LoadConfig(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := run.SignalContext()
	defer stop()
	log := obs.NewLogger(os.Stderr, cfg.Edge.LogLevel.String(), os.Getenv("LOG_FORMAT"))
	if err := allinone.Run(ctx, cfg, allinone.Deps{Logger: log}); err != nil {
		log.Error("telorunner stopped", "err", err)
		os.Exit(1)
	}
}
