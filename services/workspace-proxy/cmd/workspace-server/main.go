// Command workspace-server is the in-pod workspace file service of a watch
// session (contract 9.2, 9.3): it serves the workspace directory over HTTP
// and holds no credentials. It reads only WORKSPACE_DIR, PORT,
// WORKSPACE_BIND and WORKSPACE_EXCLUDE; a bad value exits 2 naming the
// variable, a runtime failure exits 1, SIGTERM shuts down gracefully.
// `workspace-server version` prints the build's version.
package main

import (
	"log/slog"
	"os"

	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/pkg/version"
)

func main() {
	if version.Handled("workspace-server") {
		return
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		log.Error("invalid configuration", "err", err)
		os.Exit(2)
	}
	ctx, stop := run.SignalContext()
	err = Run(ctx, cfg, log)
	stop()
	if err != nil {
		log.Error("workspace-server stopped", "err", err)
		os.Exit(1)
	}
}
