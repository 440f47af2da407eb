// Package proc runs one container instance as a host process: its own
// process group, a pty or pipes for its standard streams, and attach
// sessions that see its live output.
package proc

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/identity"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
)

// drainTimeout bounds how long output is still read after the main process
// exited, for descendants that escaped the process group.
const drainTimeout = time.Second

// Spec describes one process.
type Spec struct {
	Path string   // absolute path of the program
	Argv []string // argv, argv[0] first
	Env  []string
	// Dir is the working directory when Mount is nil.
	Dir string
	// Mount, when set, runs the program through the mount helper Helper
	// in a new mount namespace; the working directory is then Mount's.
	Mount  *mountns.Spec
	Helper string
	// Identity, when set, is the user and groups the program runs as
	// (the caller must be root): the mount helper switches to it before
	// exec'ing, or the fork does (SysProcAttr.Credential) without one. A
	// pty is handed to that user, as a terminal login does.
	Identity *identity.Identity

	TTY       bool
	Stdin     bool // keep stdin open for attach sessions
	StdinOnce bool // close stdin after the first attach session's input ends
	Log       *slog.Logger
}

// Size is a terminal size in character cells.
type Size struct {
	Width  uint16
	Height uint16
}

// Exit is how a process ended.
type Exit struct {
	Code   int            // exit status, or 128+signal
	Signal syscall.Signal // 0 unless killed by a signal
	At     time.Time
}

// Process is a running or finished program. Its methods are safe for
// concurrent use.
type Process struct {
	spec    Spec
	cmd     *exec.Cmd
	started time.Time

	tty    *os.File // pty master, when spec.TTY
	stdout *fanout
	stderr *fanout // nil with a tty
	log    logRing // the last LogBytes of output, both streams (pods/log)

	stdin     chan []byte // to the stdin writer; nil without stdin
	stdinDone chan struct{}
	closeOnce sync.Once
	inputMu   sync.Mutex
	inputSeen bool // an attach session with stdin has ended (StdinOnce)

	wg   sync.WaitGroup // pumps and the stdin writer
	done chan struct{}
	exit Exit
}

// Start starts the process. The returned process is reaped by a goroutine
// of its own; Done is closed once it exited and its output was drained.
func Start(spec Spec) (*Process, error) {
	if spec.Log == nil {
		spec.Log = slog.New(slog.DiscardHandler)
	}
	cmd := &exec.Cmd{Path: spec.Path, Args: spec.Argv, Env: spec.Env, Dir: spec.Dir}
	p := &Process{spec: spec, cmd: cmd, stdout: newFanout(), done: make(chan struct{})}
	// Pdeathsig: a container does not outlive a kubelet that dies
	// without cleaning up.
	if spec.TTY {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL}
	} else {
		p.stderr = newFanout()
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	var finish func(error) error
	if spec.Mount != nil {
		cmd.Dir = ""
		m := *spec.Mount
		m.Identity = spec.Identity
		var err error
		if finish, err = mountns.Prepare(cmd, spec.Helper, m, spec.Argv); err != nil {
			return nil, err
		}
	} else if spec.Identity != nil {
		cmd.SysProcAttr.Credential = spec.Identity.Credential()
	}
	// The child's ends of its streams; closed here once it started.
	var childEnds []*os.File
	var readers []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			_ = f.Close()
		}
	}
	var stdinW *os.File
	if spec.TTY {
		master, slave, err := openPTY()
		if err != nil {
			return nil, err
		}
		if id := spec.Identity; id != nil && !id.Root() {
			if err := slave.Chown(int(id.UID), int(id.GID)); err != nil {
				_ = master.Close()
				_ = slave.Close()
				return nil, fmt.Errorf("hand pty to uid %d: %w", id.UID, err)
			}
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		childEnds = append(childEnds, slave)
		p.tty = master
	} else {
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("create stdout pipe: %w", err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{outR, outW})
			return nil, fmt.Errorf("create stderr pipe: %w", err)
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		childEnds = append(childEnds, outW, errW)
		readers = append(readers, outR, errR)
		if spec.Stdin {
			inR, inW, err := os.Pipe()
			if err != nil {
				closeAll(append(childEnds, readers...))
				return nil, fmt.Errorf("create stdin pipe: %w", err)
			}
			cmd.Stdin = inR
			childEnds = append(childEnds, inR)
			stdinW = inW
		}
	}

	err := cmd.Start()
	if finish != nil {
		err = finish(err)
	}
	closeAll(childEnds)
	if err != nil {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
		closeAll(readers)
		if stdinW != nil {
			_ = stdinW.Close()
		}
		if p.tty != nil {
			_ = p.tty.Close()
		}
		return nil, fmt.Errorf("start %s: %w", spec.Path, err)
	}
	p.started = time.Now()

	var pumps sync.WaitGroup
	if spec.TTY {
		pumps.Go(func() { pump(p.tty, p.stdout, &p.log) })
		if spec.Stdin {
			p.startStdin(p.tty)
		}
	} else {
		pumps.Go(func() { pump(readers[0], p.stdout, &p.log) })
		pumps.Go(func() { pump(readers[1], p.stderr, &p.log) })
		if stdinW != nil {
			p.startStdin(stdinW)
		}
	}
	p.wg.Go(func() { p.reap(&pumps, readers) })
	return p, nil
}

// reap waits for the main process, tears down what is left of its process
// group like a runtime tears down a container, drains output and closes
// everything.
func (p *Process) reap(pumps *sync.WaitGroup, readers []*os.File) {
	err := p.cmd.Wait()
	exit := Exit{At: time.Now()}
	var ws syscall.WaitStatus
	if st := p.cmd.ProcessState; st != nil {
		ws, _ = st.Sys().(syscall.WaitStatus)
	}
	switch {
	case ws.Signaled():
		exit.Signal = ws.Signal()
		exit.Code = 128 + int(ws.Signal())
	case p.cmd.ProcessState != nil:
		exit.Code = ws.ExitStatus()
	default:
		exit.Code = 128 + int(syscall.SIGKILL)
		p.spec.Log.Warn("wait for process", "pid", p.cmd.Process.Pid, "err", err)
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)

	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		// A descendant outside the group still holds the stream open.
		for _, r := range readers {
			_ = r.Close()
		}
		if p.tty != nil {
			_ = p.tty.Close()
		}
		<-drained
	}
	for _, r := range readers {
		_ = r.Close()
	}
	p.closeStdin()
	if p.tty != nil {
		_ = p.tty.Close()
	}
	p.stdout.close()
	if p.stderr != nil {
		p.stderr.close()
	}
	p.exit = exit
	close(p.done)
}

// pump publishes everything read from r until it ends (EOF, or EIO on a pty
// whose other side is gone), then closes f.
func pump(r *os.File, f *fanout, log *logRing) {
	defer f.close()
	for {
		buf := make([]byte, 32*1024)
		n, err := r.Read(buf)
		if n > 0 {
			log.write(buf[:n])
			f.publish(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// startStdin starts the single writer to the process's stdin. Attach
// sessions hand it chunks; a nil chunk closes stdin.
func (p *Process) startStdin(w *os.File) {
	p.stdin = make(chan []byte, 16)
	p.stdinDone = make(chan struct{})
	p.wg.Go(func() {
		for {
			select {
			case b := <-p.stdin:
				if b == nil {
					if p.tty == nil {
						_ = w.Close()
					} else {
						// A pty has no half-close: send EOF (^D).
						_, _ = w.Write([]byte{4})
					}
					continue
				}
				if _, err := w.Write(b); err != nil && !errors.Is(err, os.ErrClosed) {
					p.spec.Log.Debug("write stdin", "err", err)
				}
			case <-p.stdinDone:
				if p.tty == nil {
					_ = w.Close()
				}
				return
			}
		}
	})
}

func (p *Process) closeStdin() {
	if p.stdinDone != nil {
		p.closeOnce.Do(func() { close(p.stdinDone) })
	}
}

// Log returns the last LogBytes of the process's output, stdout and
// stderr interleaved as read (a container log).
func (p *Process) Log() []byte { return p.log.bytes() }

// Pid returns the process id, which is also its process group id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// StartedAt returns when the process started.
func (p *Process) StartedAt() time.Time { return p.started }

// Done is closed when the process exited and its output was drained.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exit returns how the process ended. It blocks until Done is closed.
func (p *Process) Exit() Exit {
	<-p.done
	p.wg.Wait()
	return p.exit
}

// Signal sends sig to the process group. It is a no-op once the process
// exited.
func (p *Process) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.spec.Log.Debug("signal process group", "pid", p.cmd.Process.Pid, "signal", sig, "err", err)
	}
}
