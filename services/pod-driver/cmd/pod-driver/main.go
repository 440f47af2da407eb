// Command pod-driver owns sessions and runs their workloads, against an
// external NATS JetStream (RUNNER_NATS_URL).
package main

import (
	"context"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/pod-driver/driver"
)

func main() { run.Service("pod-driver", driver.LoadConfig, serve) }

// serve runs the service on the standalone main's connections.
func serve(ctx context.Context, cfg driver.Config, env run.Env) error {
	return driver.Run(ctx, cfg, driver.Deps{NC: env.NC, Logger: env.Logger, Registry: env.Registry, Limits: env.Limits})
}
