package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/iopump"
	"github.com/telorunner/telorunner/services/pod-driver/internal/projection"
)

// owned is one session this driver owns, from claim to release.
type owned struct {
	d  *Driver
	id string
	// mode is the session's mode; it never changes, so any goroutine
	// reads it without a lock.
	mode string
	// rec is the record as this owner last wrote or read it; an app-set
	// change replaces it: read it through record(), write it under mu.
	rec   session.Record
	log   *slog.Logger
	store *session.Store

	ctx    context.Context // ends when the session is released
	cancel context.CancelFunc

	pumpMu      sync.Mutex
	pumps       map[string]*iopump.Pump
	pumpsClosed bool // the session ended: no new pump opens
	proj        *projection.Projection

	events  *evQueue // ordered emission queue
	evDone  chan struct{}
	flushMu sync.Mutex
	// evMu guards sends on events against its close: senders hold it
	// shared, the close exclusively, so nothing enqueues into a closed
	// session (an event after the end is dropped).
	evMu     sync.RWMutex
	evClosed bool

	// Control requests that may take long (stop, suspend, apps) run on
	// their own goroutines so they never hold up stdin, resize or each
	// other; ctlWG counts them and ctlClosed refuses new ones once the
	// session is ending (lock order: ctlMu before nothing).
	ctlMu     sync.Mutex
	ctlClosed bool
	ctlWG     sync.WaitGroup
	appsMu    sync.Mutex // one app-set change at a time

	mu sync.Mutex
	w  backend.Workload
	// starting: a workload is being started and w is not set yet — the
	// backend records `running` from inside Start, so a request can find
	// the session running before w is set. wReady (on mu) is broadcast
	// when w is set or the start ends without one.
	starting bool
	wReady   sync.Cond
	// changing: an app-set change was accepted and has not yet handed the
	// workload over to its recreate (or failed); another is refused.
	changing bool
	// recreate is what the workload being recreated by an app-set change
	// replaced, to undo if the new workload cannot start.
	recreate *appsUndo
	// failMsg is the failed status of intentFail.
	failMsg string
	// pendingPorts holds PortsResolved payloads per app that arrived
	// while no workload was set (it was starting).
	pendingPorts map[string]json.RawMessage
	portsMu      sync.Mutex // serializes port-set changes
	next         intent
	// finished is the code a run session's kernel reported for its one
	// generation (intentFinished).
	finished *int
	finishWG sync.WaitGroup // finishRun goroutines
	shutdown atomic.Bool    // driver shutting down: end as stopped
	lost     atomic.Bool    // another driver took the owner key
	ownerRev atomic.Uint64  // the owner key's revision as last written
	// adopting: the first workload is an existing one to re-attach to
	// (its driver died), not a new start.
	adopting bool
	// recovering: the previous workload was lost with its driver; the
	// first workload is a new one, recorded as a resume.
	recovering bool
	// keepWorkspace: the first workload serves the workspace directory
	// the lost one left on this machine instead of seeding.
	keepWorkspace bool
}

// run drives the session from start to its terminal status.
func (o *owned) run(ownerRev uint64) {
	defer o.cancel()
	o.ownerRev.Store(ownerRev)
	go o.emitLoop()
	renewDone := make(chan struct{})
	go func() {
		defer close(renewDone)
		o.renew(ownerRev)
	}()
	for _, a := range o.record().Apps {
		o.pumps[a.Name] = iopump.New(o.store.IO(), bus.IOSubject(o.id, a.Name), 0, o.log)
	}
	o.proj = projection.New(ledger{o}, o.emitRun, nil)
	svc, err := o.serveCtl()
	if err != nil {
		o.log.Error("serve control", "err", err)
	}
	if o.recovering {
		if err := o.recoverStatus(o.ctx); err != nil {
			o.log.Error("record recovery", "err", err)
		}
		from := "its last checkpoint"
		if o.keepWorkspace {
			from = "its workspace directory"
		}
		o.log.Info("recovering a watch session whose driver died", "from", from)
		o.Progress(contract.PhaseProvision, "Recovering the session from "+from+" (its driver stopped)", false, "")
	}

	final := o.lifecycle()
	o.finishWG.Wait()

	// Control requests still running end with the session's context and
	// answer (new ones are refused), so nothing they report can follow
	// the terminal status.
	o.ctlMu.Lock()
	o.ctlClosed = true
	o.ctlMu.Unlock()
	o.cancel()
	o.ctlWG.Wait()

	// Everything the workload wrote and reported lands before the
	// terminal status.
	o.pumpMu.Lock()
	o.pumpsClosed = true
	for _, p := range o.pumps {
		p.Close()
	}
	o.pumpMu.Unlock()
	// Close the event queue and let it drain: nothing this owner reports
	// can follow the terminal status.
	o.closeEvents()
	<-o.evDone
	if final != nil && !o.lost.Load() {
		var mark func(*session.Record) error
		if final.Kind == contract.StatusSuspended {
			mark = func(r *session.Record) error {
				now := time.Now().UTC()
				r.SuspendedAt, r.Workspace = &now, ""
				return nil
			}
		}
		if _, err := o.store.SetStatus(context.Background(), o.id, *final, mark); err != nil && !errors.Is(err, session.ErrTerminal) {
			o.log.Error("set final status", "err", err)
		}
	}
	if svc != nil {
		_ = svc.Stop()
	}
	<-renewDone
	if !o.lost.Load() {
		_ = o.store.ReleaseOwner(context.Background(), o.id, o.ownerRev.Load())
	}
	// Nothing more is written for this session here: what the edge serves
	// of it later comes from JetStream.
	o.store.Release(o.id)
}

// adopter is a backend that can re-attach to a workload whose driver died
// (the kubernetes backend finds the session's pod by label).
type adopter interface {
	Adopt(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Workload, error)
}

// intent is what the session should do when its workload next ends.
type intent int

const (
	intentNone     intent = iota
	intentStop            // DELETE or driver shutdown: end as stopped
	intentSuspend         // idle: end as suspended, record kept
	intentRecreate        // app-set change: start again with the new set
	intentFail            // app-set change failed: end as failed with failMsg
	// intentFinished: a run session's generation ended (its debug stream
	// said so) while the kernel, held open by --inspect, still runs; it
	// ends as exited with the generation's code (19.29).
	intentFinished
)

// lifecycle runs workloads until the session ends and returns the status
// to record: one workload, or several when the app set changes.
func (o *owned) lifecycle() *contract.Status {
	for {
		if st := o.runOnce(); st != nil {
			return st
		}
	}
}

// spec builds the launch spec from the record. A watch session with a
// checkpoint starts from it (resume, app-set change); otherwise from the
// bundle.
//
// keep serves the workspace directory a lost workload left (local
// recovery): no bundle is loaded.
func (o *owned) spec(keep bool) (backend.Spec, error) {
	rec := o.record()
	var bundle contract.Bundle
	var restore *backend.Restore
	if !keep {
		var err error
		if bundle, restore, err = o.workspace(rec); err != nil {
			return backend.Spec{}, err
		}
	}
	env := rec.Launch.Env
	if name := rec.Launch.OperatorApp; name != "" {
		op, err := o.operatorEnv(name)
		if err != nil {
			return backend.Spec{}, err
		}
		env = maps.Clone(env)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, op)
		delete(env, "TELO_CACHE_DIR") // as the edge shapes session env
	}
	spec := backend.Spec{
		SessionID: o.id, Mode: rec.Mode, Bundle: bundle, Restore: restore, KeepWorkspace: keep, Env: env,
		Config: rec.Launch.Config, Inspect: rec.Launch.Inspect, SelfContained: rec.Launch.SelfContained,
	}
	for _, a := range rec.Apps {
		spec.Apps = append(spec.Apps, backend.App{Name: a.Name, Entry: a.Entry, Ports: a.Ports, IO: a.IO})
	}
	if a := rec.Launch.AgentSpec; a != nil && rec.Mode == contract.ModeWatch {
		op, err := o.operatorEnv(a.Name)
		if err != nil {
			return backend.Spec{}, err
		}
		spec.Agent = &backend.Agent{Name: a.Name, Image: a.Image, Env: op, PullPolicy: a.PullPolicy, Port: a.Port}
	}
	return spec, nil
}

// operatorEnv is the env of the RUNNER_APPS entry name, from the driver's
// own configuration.
func (o *owned) operatorEnv(name string) (map[string]string, error) {
	env, ok := o.d.o.OperatorEnv[name]
	if !ok {
		return nil, fmt.Errorf("RUNNER_APPS of this driver has no entry %q (the driver needs the same RUNNER_APPS as the edge)", name)
	}
	return maps.Clone(env), nil
}

// workspace is what the workload starts from: a watch session with a
// checkpoint restores it (its manifest only: the backend streams the
// blobs while seeding, each distinct one fetched once), otherwise the
// session's bundle.
func (o *owned) workspace(rec session.Record) (contract.Bundle, *backend.Restore, error) {
	if rec.Mode == contract.ModeWatch && o.d.o.Checkpoints != nil {
		t0 := time.Now()
		m, ok, err := o.d.o.Checkpoints.Load(o.ctx, o.id)
		if err != nil {
			return contract.Bundle{}, nil, fmt.Errorf("load checkpoint: %w", err)
		}
		if ok {
			entry := "telo.yaml"
			if len(rec.Apps) > 0 {
				entry = rec.Apps[0].Entry
			}
			r := &backend.Restore{Files: make([]backend.RestoreFile, 0, len(m.Files)), Fetch: o.d.o.Checkpoints.Blob}
			var size int64
			for _, p := range slices.Sorted(maps.Keys(m.Files)) {
				e := m.Files[p]
				r.Files = append(r.Files, backend.RestoreFile{Path: p, Hash: e.Hash, Size: e.Size, Mode: e.Mode})
				size += e.Size
			}
			o.log.Info("checkpoint manifest loaded", "checkpoint", m.ID, "files", len(m.Files), "bytes", size, "took", time.Since(t0))
			return contract.Bundle{EntryRelativePath: entry}, r, nil
		}
	}
	b, err := o.store.GetBundle(o.ctx, o.id)
	if err != nil {
		return b, nil, fmt.Errorf("get bundle: %w", err)
	}
	return b, nil, nil
}

// runOnce starts one workload and waits for it to end. It returns the
// status to record, or nil when the session goes on with a new workload.
func (o *owned) runOnce() *contract.Status {
	keep := o.keepWorkspace
	o.keepWorkspace = false
	o.mu.Lock()
	undo := o.recreate
	o.recreate = nil
	o.mu.Unlock()
	spec, err := o.spec(keep)
	if err != nil {
		if undo != nil {
			return o.recreateFailed(undo, "start: "+err.Error())
		}
		return &contract.Status{Kind: contract.StatusFailed, Message: "start: " + err.Error()}
	}
	o.d.m.started.Inc()
	app := ""
	if spec.Mode == contract.ModeRun {
		app = spec.Apps[0].Name
	}
	var w backend.Workload
	o.mu.Lock()
	o.starting = true
	o.mu.Unlock()
	if a, ok := o.d.o.Backend.(adopter); ok && o.adopting {
		o.adopting = false
		w, err = a.Adopt(o.ctx, spec, o)
	} else {
		o.Progress(contract.PhaseProvision, "Starting workload", false, app)
		w, err = o.d.o.Backend.Start(o.ctx, spec, o)
	}
	if err != nil {
		o.mu.Lock()
		o.starting = false
		o.wReady.Broadcast()
		o.mu.Unlock()
		o.d.m.failed.Inc()
		if in := o.intent(); in == intentStop || in == intentSuspend {
			return o.endStatus(in, backend.Exit{Stopped: true})
		}
		if undo != nil {
			return o.recreateFailed(undo, err.Error())
		}
		return &contract.Status{Kind: contract.StatusFailed, Message: err.Error()}
	}
	o.mu.Lock()
	o.w = w
	o.starting = false
	o.wReady.Broadcast()
	in := o.next
	o.mu.Unlock()
	if in != intentNone || o.userStopped() {
		// DELETE (or suspend, or a change) arrived while starting (4.4.4):
		// stop the new workload now.
		_ = w.Stop(context.Background())
	} else {
		o.applyPendingPorts()
	}
	<-w.Done()
	o.mu.Lock()
	o.w = nil
	o.pendingPorts = nil
	in = o.next
	if in == intentRecreate {
		o.next = intentNone
	}
	o.mu.Unlock()
	// The workload's processes are gone: open generations end with them
	// (the next kernel opens the next generation).
	o.proj.Reset()
	if in == intentRecreate {
		return nil
	}
	return o.endStatus(in, w.Exit())
}

// endStatus maps how a workload ended to the session's status.
func (o *owned) endStatus(in intent, exit backend.Exit) *contract.Status {
	switch {
	case in == intentSuspend:
		return &contract.Status{Kind: contract.StatusSuspended}
	case in == intentFail:
		o.mu.Lock()
		msg := o.failMsg
		o.mu.Unlock()
		return &contract.Status{Kind: contract.StatusFailed, Message: msg}
	case in == intentFinished && exit.Stopped && !o.shutdown.Load() && !o.userStopped():
		// Stopped because its generation ended; a workload that ended on
		// its own first maps as any other below.
		o.mu.Lock()
		code := *o.finished
		o.mu.Unlock()
		return &contract.Status{Kind: contract.StatusExited, Code: &code}
	case exit.Stopped || in == intentStop || o.shutdown.Load() || o.userStopped():
		return &contract.Status{Kind: contract.StatusStopped}
	case exit.Err != nil:
		return &contract.Status{Kind: contract.StatusFailed, Message: exit.Err.Error()}
	case o.mode == contract.ModeWatch:
		return &contract.Status{Kind: contract.StatusFailed, Message: "session workload ended"}
	default:
		code := 0
		if exit.Code != nil {
			code = *exit.Code
		}
		return &contract.Status{Kind: contract.StatusExited, Code: &code}
	}
}

func (o *owned) intent() intent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next
}

// record is the session record as this owner last wrote or read it.
func (o *owned) record() session.Record {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.rec
}

func (o *owned) userStopped() bool {
	rec, _, err := o.store.Get(context.Background(), o.id)
	return err == nil && rec.UserStopped
}

// end asks the workload to end with intent in (or, when it is still
// starting, makes the start stop it as soon as it runs).
func (o *owned) end(ctx context.Context, in intent) error {
	o.mu.Lock()
	if o.next == intentNone || in == intentStop {
		o.next = in
	}
	w := o.w
	o.mu.Unlock()
	if w == nil {
		if in == intentStop {
			o.cancel() // abort the start; the workload never runs
		}
		return nil
	}
	return w.Stop(ctx)
}

// requestStop stops the workload (or the start in progress).
func (o *owned) requestStop(ctx context.Context) error { return o.end(ctx, intentStop) }

// shutdownStop is the driver's clean exit. Run sessions stop (contract
// 5.8). Watch sessions are suspended with a final checkpoint instead, so
// no work is lost and they resume after the restart (19.1–19.3); if the
// checkpoint cannot be taken they stop like run sessions.
func (o *owned) shutdownStop() {
	o.ctlMu.Lock()
	ended := o.ctlClosed
	o.ctlMu.Unlock()
	if ended {
		return // its workload is gone and its final status on the way
	}
	if o.mode == contract.ModeWatch && o.intent() == intentNone {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := o.finalCheckpoint(ctx)
		if err == nil {
			err = o.end(ctx, intentSuspend)
		}
		cancel()
		if err == nil {
			return
		}
		o.log.Warn("final checkpoint failed; stopping the watch session", "err", err)
	}
	o.shutdown.Store(true)
	_, _ = o.store.Update(context.Background(), o.id, func(r *session.Record) error {
		// A session that already ended or suspended keeps its record as
		// it is: the flag would stop it at its next resume.
		if r.UserStopped || r.Status.Terminal() || r.Status.Kind == contract.StatusSuspended {
			return bus.ErrNoChange
		}
		r.UserStopped = true
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = o.requestStop(ctx)
}
