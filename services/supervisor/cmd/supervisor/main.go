// Command supervisor runs the background policy against an external NATS
// JetStream (RUNNER_NATS_URL).
package main

import (
	"fmt"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/obs"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/supervisor/supervisor"
)

func main() {
	cfg, err := supervisor.LoadConfig(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	url := os.Getenv("RUNNER_NATS_URL")
	if url == "" {
		fmt.Fprintln(os.Stderr, "RUNNER_NATS_URL: required")
		os.Exit(2)
	}
	ctx, stop := run.SignalContext()
	defer stop()
	log := obs.NewLogger(os.Stderr, os.Getenv("LOG_LEVEL"), os.Getenv("LOG_FORMAT"))
	nc, err := nats.Connect(url, nats.Name("supervisor"), nats.MaxReconnects(-1))
	if err != nil {
		log.Error("connect nats", "err", err)
		os.Exit(1)
	}
	defer nc.Close()
	reg := obs.NewRegistry()
	go func() { _ = obs.Serve(ctx, os.Getenv("RUNNER_OPS_ADDR"), reg, nil) }()
	if err := supervisor.Run(ctx, cfg, supervisor.Deps{NC: nc, Logger: log, Registry: reg}); err != nil {
		log.Error("supervisor stopped", "err", err)
		os.Exit(1)
	}
}
