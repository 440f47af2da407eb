// Command workspace-proxy relays workspace operations for watch sessions
// against an external NATS JetStream (RUNNER_NATS_URL).
package main

import (
	"context"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/workspace-proxy/proxy"
)

func main() { run.Service("workspace-proxy", proxy.LoadConfig, serve) }

// serve runs the service on the standalone main's connections.
func serve(ctx context.Context, cfg proxy.Config, env run.Env) error {
	return proxy.Run(ctx, cfg, proxy.Deps{NC: env.NC, Logger: env.Logger, Limits: env.Limits})
}
