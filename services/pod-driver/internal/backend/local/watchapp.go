package local

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// entryPoll is how often a kernel waiting for its entry file looks
// (contract 10.1: the kernel starts only once the entry exists).
const entryPoll = 100 * time.Millisecond

// restartPolicy times the restart of a watch app's kernel that ended on
// its own (contract 19 item 16): the first restart comes after delay;
// while the kernel keeps dying within window of its start the delay
// doubles, up to max.
type restartPolicy struct {
	delay, max, window time.Duration
}

// defaultRestart is the policy of every Backend; tests shorten it.
var defaultRestart = restartPolicy{delay: 1 * time.Second, max: 30 * time.Second, window: 10 * time.Second}

// watchApp is one app of a watch session: the command it runs and its
// current kernel process, replaced on every restart.
type watchApp struct {
	app   backend.App
	entry string   // absolute path of the entry file in the workspace
	env   []string // exactly the kernel's environment
	tty   bool
	log   *slog.Logger
	first *proc // started by Start; handed to runApp by launch

	mu         sync.Mutex
	cur        *proc // nil while waiting for the entry, backing off, or after the end
	cols, rows int   // last Resize (0: none), applied to a restarted terminal
}

func (w *WatchWorkload) newApp(i int, app backend.App, sessionEnv map[string]string) *watchApp {
	tty := app.IO != contract.IOStreams
	home := filepath.Join(w.dir.home(), appHomeName(app.Name))
	env, dropped := kernelEnv(sessionEnv, home, contract.ModeWatch, tty)
	log := w.log.With("app", app.Name, "index", i)
	if len(dropped) > 0 {
		log.Warn("session env entries dropped", "names", dropped)
	}
	return &watchApp{
		app:   app,
		entry: filepath.Join(w.dir.workspace(), filepath.FromSlash(app.Entry)),
		env:   env,
		tty:   tty,
		log:   log,
	}
}

func (a *watchApp) current() *proc {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

func (a *watchApp) setCurrent(p *proc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cur = p
}

// startAppProc starts one kernel process of a (the entry must exist):
// `run --watch --inspect 127.0.0.1:<new port> --no-open <entry>` in the
// session directory, on a pty (tty) or pipes. Every process gets a port of
// its own: it is a new inspection server.
func (w *WatchWorkload) startAppProc(a *watchApp) (*proc, error) {
	port, err := w.pickPort()
	if err != nil {
		return nil, fmt.Errorf("start app %s: %w", a.app.Name, err)
	}
	p, err := startProc(watchArgv(w.b.kernel, a.entry, port), w.dir.root, a.env, a.app, a.tty, a.log, w.box())
	if err != nil {
		return nil, fmt.Errorf("start app %s: %w", a.app.Name, err)
	}
	if err := w.b.track(w.id, appHomeName(a.app.Name), p); err != nil {
		p.kill()
		return nil, fmt.Errorf("start app %s: %w", a.app.Name, err)
	}
	p.inspectPort = port
	a.mu.Lock()
	a.cur = p
	cols, rows := a.cols, a.rows
	a.mu.Unlock()
	if cols > 0 {
		if err := p.resize(cols, rows); err != nil {
			a.log.Warn("resize restarted terminal", "err", err)
		}
	}
	return p, nil
}

// runApp owns app a for the session's life: it waits for the entry file
// when there is no process yet, drives each kernel process with a fresh
// debug relay (a new inspection server, so a fresh de-dup state), reports
// a kernel that ended on its own once through RunEnded and restarts it
// after a backoff. It returns on a stop.
func (w *WatchWorkload) runApp(a *watchApp, p *proc) {
	policy := w.b.restart
	delay := policy.delay
	for {
		if p == nil {
			if !w.awaitEntry(a) {
				return
			}
			var err error
			if p, err = w.startAppProc(a); err != nil {
				a.log.Error("start app kernel", "err", err, "retry_in", delay)
				if !w.pause(delay) {
					return
				}
				delay = min(2*delay, policy.max)
				continue
			}
			w.logPIDs()
		}
		began := time.Now()
		r := w.b.newRelay(a.app.Name, p.inspectPort, w.sink, a.log)
		p.drive(w.stopCh, w.killCh, w.b.opts.StopGrace, w.sink, r)
		w.b.untrack(w.id, p)
		a.setCurrent(nil)
		if p.wasStopped() {
			return
		}
		code := p.code
		w.sink.RunEnded(a.app.Name, contract.IntPtr(code), endReason(code))
		if w.stopping() {
			return
		}
		w.logPIDs()
		if time.Since(began) >= policy.window {
			delay = policy.delay
		}
		a.log.Warn("app kernel exited on its own; restarting", "code", code, "delay", delay)
		w.sink.Progress(contract.PhaseBoot, fmt.Sprintf("Restarting app %s (exit code %d)", a.app.Name, code), false, a.app.Name)
		if !w.pause(delay) {
			return
		}
		delay = min(2*delay, policy.max)
		p = nil
	}
}

// awaitEntry waits until a's entry file exists; false on a stop.
func (w *WatchWorkload) awaitEntry(a *watchApp) bool {
	for !regularFile(a.entry) {
		if !w.pause(entryPoll) {
			return false
		}
	}
	return !w.stopping()
}

// logPIDs rewrites the pid file, logging a failure.
func (w *WatchWorkload) logPIDs() {
	if err := w.recordPIDs(); err != nil {
		w.log.Warn("record process groups", "err", err)
	}
}

func (w *WatchWorkload) app(name string) (*watchApp, error) {
	for _, a := range w.apps {
		if a.app.Name == name {
			return a, nil
		}
	}
	return nil, fmt.Errorf("session %s has no app %q", w.id, name)
}

// Stdin writes p to the terminal or stdin of app's current kernel. It is
// dropped while the app has no process (waiting for its entry, restarting,
// ended); an unknown app is an error.
func (w *WatchWorkload) Stdin(app string, p []byte) error {
	a, err := w.app(app)
	if err != nil {
		return err
	}
	if pr := a.current(); pr != nil {
		return pr.writeStdin(p)
	}
	return nil
}

// Resize sets the terminal size of app's current kernel (tty apps; a
// no-op for streams). The size is remembered for the kernel's next
// restart.
func (w *WatchWorkload) Resize(app string, cols, rows int) error {
	a, err := w.app(app)
	if err != nil {
		return err
	}
	if !a.tty {
		return nil
	}
	if cols < 1 || cols > 0xffff || rows < 1 || rows > 0xffff {
		return fmt.Errorf("resize app %s: size %dx%d out of range", app, cols, rows)
	}
	a.mu.Lock()
	a.cols, a.rows = cols, rows
	pr := a.cur
	a.mu.Unlock()
	if pr == nil {
		return nil
	}
	return pr.resize(cols, rows)
}
