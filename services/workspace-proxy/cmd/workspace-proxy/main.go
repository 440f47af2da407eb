// Command workspace-proxy relays workspace operations for watch sessions
// against an external NATS JetStream (RUNNER_NATS_URL).
package main

import (
	"context"
	"os"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/workspace-proxy/proxy"
)

func main() {
	run.Main("workspace-proxy", nil, func(ctx context.Context, env run.Env) error {
		cfg, err := proxy.LoadConfig(os.LookupEnv)
		if err != nil {
			return err
		}
		return proxy.Run(ctx, cfg, proxy.Deps{NC: env.NC, Logger: env.Logger, Limits: env.Limits})
	})
}
