// Command api-edge serves the /v1 runner contract against an external NATS
// JetStream (RUNNER_NATS_URL).
package main

import (
	"context"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/api-edge/edge"
)

func main() { run.Service("api-edge", edge.LoadConfig, serve) }

// serve runs the service on the standalone main's connections.
func serve(ctx context.Context, cfg edge.Config, env run.Env) error {
	return edge.Run(ctx, cfg, edge.Deps{NC: env.NC, Logger: env.Logger, Registry: env.Registry, Limits: env.Limits})
}
