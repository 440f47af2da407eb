// Command supervisor runs the background policy against an external NATS
// JetStream (RUNNER_NATS_URL).
package main

import (
	"context"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/supervisor/supervisor"
)

func main() { run.Service("supervisor", supervisor.LoadConfig, serve) }

// serve runs the service on the standalone main's connections.
func serve(ctx context.Context, cfg supervisor.Config, env run.Env) error {
	return supervisor.Run(ctx, cfg, supervisor.Deps{NC: env.NC, Logger: env.Logger, Registry: env.Registry, Limits: env.Limits})
}
