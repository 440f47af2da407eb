package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/services/workspace-proxy/internal/wsserver"
)

// Config is the workspace server's whole configuration.
type Config struct {
	Dir     string   // WORKSPACE_DIR, default /workspace; must be a directory.
	Port    int      // PORT, default 8099.
	Bind    string   // WORKSPACE_BIND, default $POD_IP, else 0.0.0.0; an IP literal.
	Exclude []string // WORKSPACE_EXCLUDE, a JSON array of names; nil = defaults.
}

// loadConfig applies defaults, parses the environment and validates it;
// an error names the offending variable.
func loadConfig(getenv func(string) string) (Config, error) {
	cfg := Config{Dir: "/workspace", Port: 8099, Bind: "0.0.0.0"}
	e := envconf.NewGetenv(getenv)
	e.Text("WORKSPACE_DIR", &cfg.Dir)
	e.Int("PORT", 1, 65535, &cfg.Port)
	if err := e.Err(); err != nil {
		return Config{}, err
	}
	// POD_IP (when the platform sets it) narrows the wildcard: pods that
	// share one host network, like the stand-in kubelet's, never collide.
	if v := getenv("POD_IP"); v != "" {
		if net.ParseIP(v) == nil {
			return Config{}, fmt.Errorf("POD_IP: %q is not an IP address", v)
		}
		cfg.Bind = v
	}
	if v := getenv("WORKSPACE_BIND"); v != "" {
		cfg.Bind = v
	}
	if net.ParseIP(cfg.Bind) == nil {
		return Config{}, fmt.Errorf("WORKSPACE_BIND: %q is not an IP address", cfg.Bind)
	}
	if v := getenv("WORKSPACE_EXCLUDE"); v != "" {
		if err := json.Unmarshal([]byte(v), &cfg.Exclude); err != nil || cfg.Exclude == nil {
			return Config{}, fmt.Errorf("WORKSPACE_EXCLUDE: want a JSON array of names, got %q", v)
		}
	}
	opts := wsserver.Options{Dir: cfg.Dir, Exclude: cfg.Exclude}
	if err := opts.Validate(); err != nil {
		return Config{}, fmt.Errorf("WORKSPACE_EXCLUDE: %w", err)
	}
	if fi, err := os.Stat(cfg.Dir); err != nil || !fi.IsDir() {
		return Config{}, fmt.Errorf("WORKSPACE_DIR: %q is not a directory", cfg.Dir)
	}
	return cfg, nil
}

// Run serves the workspace on cfg's address until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	srv, err := wsserver.New(wsserver.Options{Dir: cfg.Dir, Exclude: cfg.Exclude, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = srv.Close() }() // Read-only handle.
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Bind, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("workspace-server listening", "addr", ln.Addr().String(), "dir", cfg.Dir)
	err = srv.Serve(ctx, ln)
	log.Info("workspace-server stopped")
	return err
}
