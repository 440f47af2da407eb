// Command workspace-proxy relays workspace operations for watch sessions
// against an external NATS JetStream (RUNNER_NATS_URL).
package main

import (
	"fmt"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/obs"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/workspace-proxy/proxy"
)

func main() {
	url := os.Getenv("RUNNER_NATS_URL")
	if url == "" {
		fmt.Fprintln(os.Stderr, "RUNNER_NATS_URL: required")
		os.Exit(2)
	}
	ctx, stop := run.SignalContext()
	defer stop()
	log := obs.NewLogger(os.Stderr, os.Getenv("LOG_LEVEL"), os.Getenv("LOG_FORMAT"))
	nc, err := nats.Connect(url, nats.Name("workspace-proxy"), nats.MaxReconnects(-1))
	if err != nil {
		log.Error("connect nats", "err", err)
		os.Exit(1)
	}
	defer nc.Close()
	if err := proxy.Run(ctx, proxy.Config{}, proxy.Deps{NC: nc, Logger: log}); err != nil {
		log.Error("workspace-proxy stopped", "err", err)
		os.Exit(1)
	}
}
