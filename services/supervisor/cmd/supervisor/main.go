// Command supervisor runs the background policy against an external NATS
// JetStream (RUNNER_NATS_URL).
package main

import (
	"context"
	"os"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/supervisor/supervisor"
)

func main() {
	cfg, err := supervisor.LoadConfig(os.LookupEnv)
	run.Main("supervisor", err, func(ctx context.Context, env run.Env) error {
		return supervisor.Run(ctx, cfg, supervisor.Deps{NC: env.NC, Logger: env.Logger, Registry: env.Registry, Limits: env.Limits})
	})
}
