// Command devkernel is a test double for the Telo CLI: it speaks the
// kernel's runner-facing contract (docs/devkernel.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/telorunner/telorunner/tools/devkernel/internal/devkernel"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := devkernel.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
