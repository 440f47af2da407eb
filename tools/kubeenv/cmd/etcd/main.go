// Command etcd runs a single-member etcd for tests: loopback client and peer
// URLs, a throwaway data directory and no fsync. It prints "etcd ready" on
// stdout once the member serves clients and stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		slog.Error("etcd stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory (required)")
	clientURL := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL, also advertised")
	peerURL := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL, also advertised")
	logLevel := fs.String("log-level", "error", "debug, info, warn or error")
	timeout := fs.Duration("ready-timeout", time.Minute, "how long to wait for the member to serve")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dataDir == "" {
		return errors.New("parse flags: --data-dir is required")
	}
	cu, err := loopbackURL(*clientURL)
	if err != nil {
		return fmt.Errorf("parse --listen-client-url: %w", err)
	}
	pu, err := loopbackURL(*peerURL)
	if err != nil {
		return fmt.Errorf("parse --listen-peer-url: %w", err)
	}

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(*timeout):
		return fmt.Errorf("wait for etcd: not ready after %s", *timeout)
	case <-ctx.Done():
		return nil
	}
	fmt.Println("etcd ready")

	select {
	case err := <-e.Err():
		return fmt.Errorf("serve etcd: %w", err)
	case <-ctx.Done():
		return nil
	}
}

// loopbackURL parses raw and refuses anything that is not http on a loopback host.
func loopbackURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
		return nil, fmt.Errorf("%q: want http://127.0.0.1:<port>", raw)
	}
	return u, nil
}
