package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// Workload is a running run session: one process per app in its session
// directory. It implements backend.Workload.
//
// Exit reports Code as the first app's exit status (128+signal for a
// signal death); when Stop (or Close) ended the workload, Stopped is set
// and Code is nil. Err is set when the process could not be waited for.
type Workload struct {
	lifecycle
	b     *Backend
	dir   sessionDir
	sink  backend.Sink
	log   *slog.Logger
	procs []*proc
	ceil  Ceilings // run or app session ceilings
}

var _ backend.Workload = (*Workload)(nil)

func newWorkload(b *Backend, id string, sink backend.Sink) *Workload {
	return &Workload{
		lifecycle: newLifecycle(id),
		b:         b,
		sink:      sink,
		log:       b.log.With("session", id),
	}
}

// Stdin writes p to app's terminal or stdin. It is dropped once the app
// has exited; an unknown app is an error.
func (w *Workload) Stdin(app string, p []byte) error {
	pr, err := w.proc(app)
	if err != nil {
		return err
	}
	return pr.writeStdin(p)
}

// Resize sets app's terminal size (tty apps; a no-op for streams).
func (w *Workload) Resize(app string, cols, rows int) error {
	pr, err := w.proc(app)
	if err != nil {
		return err
	}
	return pr.resize(cols, rows)
}

func (w *Workload) proc(app string) (*proc, error) {
	for _, p := range w.procs {
		if p.app.Name == app {
			return p, nil
		}
	}
	return nil, fmt.Errorf("session %s has no app %q", w.id, app)
}

// launch starts the goroutines of every process and the one that finishes
// the workload. Goroutines are owned by the backend's wait group.
func (w *Workload) launch() {
	var procs sync.WaitGroup
	for _, p := range w.procs {
		procs.Go(func() { w.runProc(p) })
	}
	w.b.wg.Go(func() {
		procs.Wait()
		w.finish()
	})
	w.armDeadline(w.b, w.ceil.TTL)
}

// runProc owns one process until it has ended and everything attached to
// it has stopped, then reports an end it did not ask for.
func (w *Workload) runProc(p *proc) {
	ctx, cancel := context.WithCancel(context.Background())
	var watchers sync.WaitGroup
	tm := w.b.reachTiming()
	for _, port := range p.app.Ports {
		if port.Protocol == "udp" {
			continue // never watched (11.7)
		}
		watchers.Go(func() { kernelwire.WatchReachability(ctx, "127.0.0.1", port.Port, p.app.Name, w.sink, tm) })
	}
	var r relayFunc
	if p.inspectPort != 0 {
		r = w.b.newRelay(p.app.Name, p.inspectPort, w.sink, p.log)
	}
	p.drive(w.stopCh, w.killCh, w.b.opts.StopGrace, w.sink, r)
	w.b.untrack(w.id, p)
	cancel()
	watchers.Wait()

	if !p.wasStopped() {
		w.sink.RunEnded(p.app.Name, contract.IntPtr(p.code), endReason(p.code))
	}
}

// endReason is the RunEnded reason of an app process that ended on its
// own: empty for a clean exit, so the projection closes an open
// generation as completed (10.5.4).
func endReason(code int) string {
	switch {
	case code == 0:
		return ""
	case code > 128:
		return fmt.Sprintf("application process killed by signal %d (exit code %d)", code-128, code)
	default:
		return fmt.Sprintf("application process exited (code %d)", code)
	}
}

// finish records the exit, removes the session directory and closes done.
func (w *Workload) finish() {
	first := w.procs[0]
	w.exit = backend.Exit{Err: first.waitErr}
	for _, p := range w.procs {
		w.exit.Stopped = w.exit.Stopped || p.wasStopped()
	}
	if !w.exit.Stopped && first.waitErr == nil {
		w.exit.Code = contract.IntPtr(first.code)
	}
	if w.expired.Load() {
		w.exit = backend.Exit{Err: errRunTimeLimit}
	}
	if err := w.dir.removeIfOurs(w.b.opts.Owner); err != nil {
		w.log.Warn("remove session directory", "err", err)
	}
	w.b.unregister(&w.lifecycle)
	close(w.done)
}

// abort undoes a failed Start: it kills the processes started so far,
// removes the session directory and ends the workload.
func (w *Workload) abort() {
	for _, p := range w.procs {
		p.kill()
		w.b.untrack(w.id, p)
	}
	if w.dir.root != "" {
		if err := w.dir.remove(); err != nil {
			w.log.Warn("remove session directory", "err", err)
		}
	}
	w.exit = backend.Exit{Err: errors.New("start failed")}
	w.b.unregister(&w.lifecycle)
	close(w.done)
}
