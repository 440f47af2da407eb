package bench

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// proc is one process the bench started (startProcess).
type proc struct {
	name string
	url  string // a telorunner's base URL (startProc)
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// readyWithin is how long a started process has to answer its ready URL.
const readyWithin = 60 * time.Second

// startProcess is every bench process's start: bin with env only (nothing
// inherited), stdout and stderr in <name>.log, stopped with SIGTERM when tb
// ends (SIGKILL after 60 s; the log's last 4 KiB printed when tb failed),
// and waited for until GET ready answers 200. It fails tb, with the log's
// tail, when the process exits first or does not answer within readyWithin.
func startProcess(tb testing.TB, name, bin string, env []string, ready string) *proc {
	tb.Helper()
	p := &proc{name: name, cmd: exec.Command(bin), done: make(chan struct{}), log: filepath.Join(tb.TempDir(), name+".log")}
	p.cmd.Env = env
	logf, err := os.Create(p.log)
	if err != nil {
		tb.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.done) }()
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("%s log (last 4 KiB):\n%s", name, p.tail())
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(60 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	answered := testkit.Poll(ctx, readyWithin, func() bool {
		resp, err := http.Get(ready)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !answered {
		select {
		case <-p.done:
			tb.Fatalf("%s exited before answering %s (%v):\n%s", name, ready, p.cmd.ProcessState, p.tail())
		default:
		}
		tb.Fatalf("%s did not answer %s with 200 within %v:\n%s", name, ready, readyWithin, p.tail())
	}
	return p
}

// tail is the last 4 KiB of the process's log.
func (p *proc) tail() string {
	log, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return string(log[max(0, len(log)-4096):])
}

// freeAddr is a loopback address with a port free when asked (the process
// given it binds it a moment later).
func freeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// freePort is freeAddr's port.
func freePort(tb testing.TB) string {
	tb.Helper()
	_, port, _ := net.SplitHostPort(freeAddr(tb))
	return port
}
