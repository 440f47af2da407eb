// Command pod-driver owns sessions and runs their workloads, against an
// external NATS JetStream (RUNNER_NATS_URL).
package main

import (
	"context"
	"os"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/pod-driver/driver"
)

func main() {
	cfg, err := driver.LoadConfig(os.LookupEnv)
	run.Main("pod-driver", err, func(ctx context.Context, env run.Env) error {
		return driver.Run(ctx, cfg, driver.Deps{NC: env.NC, Logger: env.Logger, Registry: env.Registry, Limits: env.Limits})
	})
}
