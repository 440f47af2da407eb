// Command workspace-proxy relays workspace operations for watch sessions
// against an external NATS JetStream (RUNNER_NATS_URL).
package main

import (
	"context"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/workspace-proxy/proxy"
)

func main() {
	run.Main("workspace-proxy", nil, func(ctx context.Context, env run.Env) error {
		return proxy.Run(ctx, proxy.Config{}, proxy.Deps{NC: env.NC, Logger: env.Logger, Limits: env.Limits})
	})
}
