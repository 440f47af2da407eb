// Package proxy is the workspace-proxy service's entry point. It will
// serve the runner-ws request/reply service (tree, read, apply, touch,
// checkpoint, restore) for watch sessions; until watch sessions land it
// only provisions the bus and waits, and says so in its log.
package proxy

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Config is the workspace-proxy configuration.
type Config struct{}

// Deps are the proxy's connections.
type Deps struct {
	NC     *nats.Conn
	Logger *slog.Logger
	Limits bus.Limits
}

// Run provisions the bus and waits until ctx ends.
func Run(ctx context.Context, _ Config, d Deps) error {
	js, err := jetstream.New(d.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := bus.Provision(ctx, js, d.Limits); err != nil {
		return err
	}
	log := d.Logger
	if log == nil {
		log = slog.Default()
	}
	log.Info("workspace-proxy ready; workspace operations arrive with watch sessions", "service", "workspace-proxy")
	<-ctx.Done()
	return nil
}
