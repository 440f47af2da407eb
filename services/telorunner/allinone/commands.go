package allinone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// ProvisionBus is `telorunner provision`: the init step (Helm hook) of a
// standalone install. It connects to url as the provisioner role (seed
// from nkeyFile, RUNNER_NATS_NKEY_FILE; empty = anonymous) and creates or
// updates every stream, bucket, object store and the drivers' consumer
// with the limits cfg configures. It is idempotent.
func ProvisionBus(ctx context.Context, cfg Config, url, nkeyFile string, log *slog.Logger) error {
	if url == "" {
		return errors.New("RUNNER_NATS_URL: required")
	}
	opts, err := bus.SeedFileOptions(bus.RoleProvisioner, nkeyFile, log)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, append(opts, nats.Name("provisioner"))...)
	if err != nil {
		return fmt.Errorf("connect nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return bus.Provision(ctx, js, ProvisionLimits(cfg))
}

// GenerateCredentials is `telorunner credentials generate <dir>`: it makes
// sure dir holds an nkey seed per role (<role>.nk, 0600; existing seeds are
// kept) and its public key (<role>.pub, the layout of the chart's
// credentials Secret), and writes one "<role> <public key>" line per role
// to w.
func GenerateCredentials(dir string, w io.Writer) error {
	pubs, err := bus.EnsureCredentials(dir)
	if err != nil {
		return err
	}
	for _, role := range bus.Roles {
		if err := os.WriteFile(filepath.Join(dir, role+".pub"), []byte(pubs[role]+"\n"), 0o644); err != nil {
			return fmt.Errorf("write public key: %w", err)
		}
		if _, err := fmt.Fprintf(w, "%s %s\n", role, pubs[role]); err != nil {
			return err
		}
	}
	return nil
}
