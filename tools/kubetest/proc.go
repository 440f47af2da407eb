//go:build linux

package kubetest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// proc is a child process in its own process group whose output goes to a
// log file. One goroutine per proc waits for it; stop waits for that
// goroutine, so nothing outlives the stop.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited and err is set
	err     error
}

// startProc starts bin with args in dir, output to dir/<name>.log.
func startProc(dir, name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited, and how.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, SIGKILL after grace, and returns
// once the process has been reaped. Stragglers left in the group are killed.
func (p *proc) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	if ok, _ := p.exited(); !ok {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		timer := time.NewTimer(grace)
		select {
		case <-p.done:
		case <-timer.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
		timer.Stop()
	}
	// Stragglers: children that outlived the leader. ESRCH when there are none.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// tail returns the last n bytes of the process's log.
func (p *proc) tail(n int64) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return fmt.Sprintf("(read %s log: %v)", p.name, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// failure describes an early exit with the end of the log.
func (p *proc) failure(err error) string {
	return fmt.Sprintf("%s exited: %v\n--- %s log (tail) ---\n%s", p.name, err, p.name, p.tail(4096))
}
