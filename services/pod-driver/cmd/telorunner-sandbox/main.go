// Command telorunner-sandbox is the init of the local backend's sandbox:
// the runner starts it for every sandboxed process, and it builds the
// namespaces and execs the workload (package sandboxinit, whose init does
// the work). It links nothing else, so a start costs a small exec rather
// than one of the whole runner. Install it beside telorunner or pod-driver
// (make build does); it is not meant to be run by hand.
package main

import (
	"fmt"
	"os"

	_ "github.com/telorunner/telorunner/services/pod-driver/internal/backend/local/sandboxinit"
)

func main() {
	// sandboxinit's init ran a stage and exited when started by a runner.
	fmt.Fprintln(os.Stderr, "telorunner-sandbox: started by the runner's local backend only")
	os.Exit(2)
}
