// Command api-edge serves the /v1 runner contract against an external NATS
// JetStream (RUNNER_NATS_URL).
package main

import (
	"context"
	"os"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/api-edge/edge"
)

func main() {
	cfg, err := edge.LoadConfig(os.LookupEnv)
	run.Main("api-edge", err, func(ctx context.Context, env run.Env) error {
		return edge.Run(ctx, cfg, edge.Deps{NC: env.NC, Logger: env.Logger, Registry: env.Registry, Limits: env.Limits})
	})
}
