// Command api-edge serves the /v1 runner contract against an external NATS
// JetStream (RUNNER_NATS_URL).
package main

import (
	"fmt"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/obs"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/api-edge/edge"
)

func main() {
	cfg, err := edge.LoadConfig(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	url := os.Getenv("RUNNER_NATS_URL")
	if url == "" {
		fmt.Fprintln(os.Stderr, "RUNNER_NATS_URL: required (use the telorunner all-in-one for an embedded server)")
		os.Exit(2)
	}
	ctx, stop := run.SignalContext()
	defer stop()
	log := obs.NewLogger(os.Stderr, cfg.LogLevel.String(), os.Getenv("LOG_FORMAT"))
	nc, err := nats.Connect(url, nats.Name("api-edge"), nats.MaxReconnects(-1))
	if err != nil {
		log.Error("connect nats", "err", err)
		os.Exit(1)
	}
	defer nc.Close()
	if err := edge.Run(ctx, cfg, edge.Deps{NC: nc, Logger: log}); err != nil {
		log.Error("api-edge stopped", "err", err)
		os.Exit(1)
	}
}
