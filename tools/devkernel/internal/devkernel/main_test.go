package devkernel

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// kernelBin is the devkernel binary built once by TestMain.
var kernelBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "devkernel-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "make temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildKernel(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if code == 0 && !noLeakedGoroutines() {
		code = 1
	}
	return code
}

// buildKernel compiles ./cmd/devkernel of this module into dir.
func buildKernel(dir string) error {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return fmt.Errorf("locate test source")
	}
	modDir := filepath.Join(filepath.Dir(file), "..", "..")
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	kernelBin = filepath.Join(dir, "devkernel")
	args := []string{"build", "-o", kernelBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goTool, append(args, "./cmd/devkernel")...)
	cmd.Dir = modDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build devkernel: %w\n%s", err, out)
	}
	return nil
}

// noLeakedGoroutines waits (bounded) until no goroutine started by the tests
// is left, and dumps the stragglers if some are.
func noLeakedGoroutines() bool {
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		left := leftoverGoroutines()
		if len(left) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", strings.Join(left, "\n\n"))
			return false
		}
		<-tick.C
	}
}

// leftoverGoroutines lists the stacks of goroutines other than this one and
// the runtime's and testing package's own.
func leftoverGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		g = strings.TrimSpace(g)
		switch {
		case g == "",
			strings.Contains(g, "leftoverGoroutines"),
			strings.Contains(g, "testing.Main("),
			strings.Contains(g, "testing.(*M)."),
			strings.Contains(g, "os/signal.signal_recv"),
			strings.Contains(g, "runtime.ensureSigM"):
			continue
		}
		left = append(left, g)
	}
	return left
}
