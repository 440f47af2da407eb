package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

const (
	// outputBufSize is the read size of an output pump: one reusable buffer
	// per stream (the driver chunks to 64 KiB frames, contract 7.6).
	outputBufSize = 64 << 10
	// drainTimeout bounds how long output pumps and the debug relay may keep
	// reading after the process ended. Only a descendant that left the
	// process group can hold a stream open that long.
	drainTimeout = 2 * time.Second
	// stdinTimeout bounds a stdin write to an app that does not read.
	stdinTimeout = 2 * time.Second
)

// Initial terminal size of a tty app, until the first Resize.
const initialCols, initialRows = 80, 24

// proc is one app process: the leader of its own process group (tty apps
// lead their own session too). It owns the files of its terminal or pipes.
//
// Lifecycle: startProc → (goroutines) wait, supervise, pump per stream →
// exited is closed once the leader is reaped; the workload then drains the
// pumps and closes the files.
type proc struct {
	app  backend.App
	cmd  *exec.Cmd
	pgid int
	log  *slog.Logger

	term    *os.File // pty master of a tty app; nil for streams
	stdinW  *os.File // write end of a streams app's stdin; nil for tty
	outputs []output // what the pumps read

	inspectPort int // 0: no debug relay

	cleanup func() // after the reap: removes the sandbox's host state

	mu      sync.Mutex
	reaped  bool // the leader is being reaped: pgid may be reused, never signal it
	stopped bool // a stop arrived while the process was alive

	exited  chan struct{} // closed once code/waitErr are set
	code    int
	waitErr error
}

type output struct {
	f   *os.File
	tag byte
}

// startProc starts argv in dir with exactly env, on a pty (tty) or on
// pipes, as the leader of a new process group; inside box's sandbox unless
// box is the zero value. In a sandbox cmd.Process is the sandbox's init,
// whose death ends the workload: its host pid is the group's id.
func startProc(argv []string, dir string, env []string, app backend.App, tty bool, log *slog.Logger, box sandboxBox) (*proc, error) {
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Dir: dir, Env: env}
	release, cleanup, err := box.sb.wrap(cmd, box.ps)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	defer release()
	p := &proc{app: app, cmd: cmd, log: log, exited: make(chan struct{}), cleanup: cleanup}
	if tty {
		err = p.startTTY()
	} else {
		err = p.startStreams()
	}
	if err != nil {
		if p.cmd.Process == nil {
			cleanup() // never started; a started one was cleaned by kill
		}
		return nil, err
	}
	p.pgid = cmd.Process.Pid
	return p, nil
}

func (p *proc) startTTY() error {
	attrs := p.cmd.SysProcAttr // the sandbox's clone flags, if any
	if attrs == nil {
		attrs = &syscall.SysProcAttr{}
	}
	attrs.Setsid, attrs.Setctty = true, true
	master, err := pty.StartWithAttrs(p.cmd,
		&pty.Winsize{Cols: initialCols, Rows: initialRows}, attrs)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.cmd.Path, err)
	}
	term, err := pollable(master)
	if err != nil {
		p.pgid = p.cmd.Process.Pid
		p.kill()
		return fmt.Errorf("start %s: %w", p.cmd.Path, err)
	}
	p.term = term
	p.outputs = []output{{term, contract.TagTTY}}
	return nil
}

// pollable returns a non-blocking duplicate of f, registered with the
// runtime poller, and closes f. creack/pty leaves the master in blocking
// mode; a blocking read could not be interrupted by Close, so a descendant
// holding the terminal open would pin the pump forever.
func pollable(f *os.File) (*os.File, error) {
	defer func() { _ = f.Close() }() // the duplicate lives on
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup pty master: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd) // our own fresh descriptor
		return nil, fmt.Errorf("dup pty master: %w", err)
	}
	return os.NewFile(uintptr(fd), "ptmx"), nil
}

func (p *proc) startStreams() error {
	var files []*os.File // every pipe end, for cleanup on failure
	closeAll := func() {
		for _, f := range files {
			_ = f.Close() // our own pipe ends
		}
	}
	pipe := func() (r, w *os.File, err error) {
		if r, w, err = os.Pipe(); err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return fmt.Errorf("create stdin pipe: %w", err)
	}
	outR, outW, err := pipe()
	if err != nil {
		closeAll()
		return fmt.Errorf("create stdout pipe: %w", err)
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll()
		return fmt.Errorf("create stderr pipe: %w", err)
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = inR, outW, errW
	if p.cmd.SysProcAttr == nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	p.cmd.SysProcAttr.Setpgid = true
	if err := p.cmd.Start(); err != nil {
		closeAll()
		return fmt.Errorf("start %s: %w", p.cmd.Path, err)
	}
	// The child has its ends; ours must go so EOF arrives when it exits.
	for _, f := range []*os.File{inR, outW, errW} {
		_ = f.Close()
	}
	p.stdinW = inW
	p.outputs = []output{{outR, contract.TagStdout}, {errR, contract.TagStderr}}
	return nil
}

// wait blocks until the leader exits, kills what is left of its process
// group while the leader is still an unreaped zombie (so the group id cannot
// have been reused), reaps it and records the exit. It closes exited.
func (p *proc) wait() {
	pid := p.cmd.Process.Pid
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			if err != nil {
				p.log.Warn("wait for app process", "pid", pid, "err", err)
			}
			break
		}
	}
	p.mu.Lock()
	_ = unix.Kill(-p.pgid, unix.SIGKILL) // stragglers; ESRCH when none is left
	p.reaped = true
	p.mu.Unlock()

	err := p.cmd.Wait()
	p.cleanup()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		p.waitErr = fmt.Errorf("wait for app %s: %w", p.app.Name, err)
	}
	if st := p.cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		} else {
			p.code = st.ExitCode()
		}
	}
	close(p.exited)
}

// signal sends sig to the process group unless the leader is being reaped.
func (p *proc) signal(sig unix.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return
	}
	if err := unix.Kill(-p.pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		p.log.Warn("signal app process group", "pgid", p.pgid, "signal", sig.String(), "err", err)
	}
}

// supervise turns a stop request into SIGTERM and, after grace or a kill
// request, SIGKILL. It returns once the process has exited.
func (p *proc) supervise(stop, kill <-chan struct{}, grace time.Duration) {
	select {
	case <-p.exited:
		return
	case <-stop:
	case <-kill:
	}
	p.mu.Lock()
	p.stopped = !p.reaped
	p.mu.Unlock()
	p.signal(unix.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return
	case <-t.C:
	case <-kill:
	}
	p.signal(unix.SIGKILL)
	<-p.exited
}

// wasStopped reports whether a stop ended the process.
func (p *proc) wasStopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

// kill ends a process that never got its goroutines (a failed Start):
// SIGKILL the group, reap, close the files.
func (p *proc) kill() {
	_ = unix.Kill(-p.pgid, unix.SIGKILL) // the leader is unreaped: pgid is ours
	_ = p.cmd.Wait()                     // reaping only; the exit is not reported
	p.cleanup()
	p.closeFiles()
}

// outputSink receives what a process writes: the session's sink for app
// processes, the logger for the workspace server and the agent.
type outputSink interface {
	Output(app string, tag byte, p []byte)
}

// drive owns p from its start until it has ended and everything attached
// to it has stopped: it reaps the process, turns stop and kill requests
// into signals, pumps its output to out and, when r is not nil, relays its
// debug wire. After the exit the pumps and the relay get drainTimeout to
// deliver what is left.
func (p *proc) drive(stop, kill <-chan struct{}, grace time.Duration, out outputSink, r relayFunc) {
	var wg sync.WaitGroup
	wg.Go(p.wait)
	wg.Go(func() { p.supervise(stop, kill, grace) })

	pumped := make(chan struct{}, len(p.outputs))
	for _, o := range p.outputs {
		wg.Go(func() {
			defer func() { pumped <- struct{}{} }()
			p.pump(o, out)
		})
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relayed := make(chan struct{})
	if r != nil {
		wg.Go(func() {
			defer close(relayed)
			r(ctx, p.exited)
		})
	} else {
		close(relayed)
	}

	<-p.exited
	drain, stopDrain := context.WithTimeout(context.Background(), drainTimeout)
	defer stopDrain()
	for range p.outputs {
		select {
		case <-pumped:
		case <-drain.Done():
			p.log.Warn("process output still open after exit; closing it")
			p.closeFiles() // unblocks the remaining pumps
			<-pumped
		}
	}
	p.closeFiles()
	select {
	case <-relayed:
	case <-drain.Done():
	}
	cancel() // a relay still reading
	wg.Wait()
}

// pump copies one output stream to out until EOF (pipes), EIO (a pty
// whose every slave is closed) or Close.
func (p *proc) pump(o output, sink outputSink) {
	buf := make([]byte, outputBufSize)
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			sink.Output(p.app.Name, o.tag, buf[:n])
		}
		if err != nil {
			if !endOfOutput(err) {
				p.log.Warn("read app output", "err", err)
			}
			return
		}
	}
}

func endOfOutput(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, unix.EIO) || errors.Is(err, os.ErrClosed)
}

// closeFiles closes the terminal or pipes; a pump blocked on one returns.
func (p *proc) closeFiles() {
	for _, f := range []*os.File{p.term, p.stdinW} {
		if f != nil {
			_ = f.Close() // ours; a second close is harmless
		}
	}
	for _, o := range p.outputs {
		_ = o.f.Close()
	}
}

// writeStdin writes b to the app's terminal or stdin pipe. Writes to an
// app that has exited are dropped; a write the app does not take within
// stdinTimeout fails.
func (p *proc) writeStdin(b []byte) error {
	f := p.term
	if f == nil {
		f = p.stdinW
	}
	if f == nil || p.hasExited() {
		return nil
	}
	_ = f.SetWriteDeadline(time.Now().Add(stdinTimeout)) // ErrNoDeadline: write blocks instead
	if _, err := f.Write(b); err != nil {
		if p.hasExited() || errors.Is(err, os.ErrClosed) || errors.Is(err, unix.EPIPE) || errors.Is(err, unix.EIO) {
			return nil
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("write stdin of app %s: app is not reading", p.app.Name)
		}
		return fmt.Errorf("write stdin of app %s: %w", p.app.Name, err)
	}
	return nil
}

// resize sets the terminal size of a tty app; a no-op for streams and
// after exit.
func (p *proc) resize(cols, rows int) error {
	if p.term == nil {
		return nil
	}
	if cols < 1 || cols > 0xffff || rows < 1 || rows > 0xffff {
		return fmt.Errorf("resize app %s: size %dx%d out of range", p.app.Name, cols, rows)
	}
	rc, err := p.term.SyscallConn()
	if err != nil {
		return nil // closed: the app is gone
	}
	var ioctlErr error
	err = rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	})
	if err != nil || p.hasExited() {
		return nil // closed, or the terminal is going away with the app
	}
	if ioctlErr != nil {
		return fmt.Errorf("resize app %s: %w", p.app.Name, ioctlErr)
	}
	return nil
}

func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}
