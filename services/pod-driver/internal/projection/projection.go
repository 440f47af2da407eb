// Package projection derives run outcomes (contract section 10.5) from the
// kernel debug stream and workload ends: one `run` started event when an
// app's generation opens, at most one completed/failed outcome when it
// closes (19.13), and triggers consumed from pending expectations.
package projection

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Ledger persists generation counters and pending triggers.
type Ledger interface {
	// OpenGeneration increments app's generation, consumes its pending
	// trigger, and returns both (trigger "" means none was pending).
	OpenGeneration(app string) (generation int, trigger string, err error)
}

// Projection is one session's run projection. Safe for concurrent use;
// events are emitted in the order their causes were fed.
type Projection struct {
	ledger Ledger
	emit   func(contract.Event)
	now    func() time.Time

	mu   sync.Mutex
	apps map[string]*state
}

type state struct {
	generation int
	startedAt  *time.Time
	// started: Kernel.Started was seen for the open generation.
	started bool
	// pending is the completed outcome of a generation that stopped before
	// it started, held for BootFailureWindow: the real CLI tears a failed
	// boot down (Kernel.Stopped) before it reports Kernel.RunFailed
	// (10.5.5), and that RunFailed must fail this generation instead of
	// opening a new one (19.15).
	pending *pendingClose
}

type pendingClose struct {
	ev    contract.Event
	timer *time.Timer
}

// BootFailureWindow is how long the outcome of a generation that stopped
// without starting waits for a Kernel.RunFailed{phase:"start"}.
const BootFailureWindow = time.Second

// New returns a projection that records generations in ledger and hands
// run events to emit (called with the projection's lock held, so emit must
// not call back into the projection).
func New(ledger Ledger, emit func(contract.Event), now func() time.Time) *Projection {
	if now == nil {
		now = time.Now
	}
	return &Projection{ledger: ledger, emit: emit, now: now, apps: map[string]*state{}}
}

// Frame is the part of a debug-wire frame the projection reads.
type Frame struct {
	Kind    string          `json:"kind"`
	Event   string          `json:"event"`
	Payload json.RawMessage `json:"payload"`
}

// IsEvent reports whether a frame is an event frame (10.3): its kind is
// neither "log" nor "record".
func (f Frame) IsEvent() bool { return f.Kind != "log" && f.Kind != "record" }

// Feed projects one debug frame of app. It reports whether the frame is
// an event frame (the ones relayed as `debug` events).
func (p *Projection) Feed(app string, raw json.RawMessage) (isEvent bool, err error) {
	var f Frame
	if err := json.Unmarshal(raw, &f); err != nil {
		return false, nil
	}
	if !f.IsEvent() {
		return false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch f.Event {
	case "Kernel.Starting":
		p.flushLocked(app)
		return true, p.openLocked(app)
	case "Kernel.Started":
		if s := p.state(app); s.startedAt != nil {
			s.started = true
		}
	case "Kernel.Stopped":
		var pl struct {
			ExitCode any `json:"exitCode"`
		}
		_ = json.Unmarshal(f.Payload, &pl)
		code := 0
		if n, ok := pl.ExitCode.(float64); ok {
			code = int(n)
		}
		p.stoppedLocked(app, code)
	case "Kernel.RunFailed":
		var pl struct {
			Phase   any `json:"phase"`
			Code    any `json:"code"`
			Message any `json:"message"`
		}
		_ = json.Unmarshal(f.Payload, &pl)
		reason := "run failed"
		if s, ok := pl.Message.(string); ok && s != "" {
			reason = s
		}
		if s, ok := pl.Code.(string); ok && s != "" {
			reason = s
		}
		if s := p.state(app); s.pending != nil && pl.Phase == "start" {
			// The boot failure of the generation that just stopped: its
			// one outcome is this failure (19.15, the CLI's order).
			s.pending.timer.Stop()
			ev := s.pending.ev
			s.pending = nil
			ev.Phase, ev.Reason, ev.Code, ev.DurationMs = "failed", reason, nil, nil
			p.emit(ev)
			return true, nil
		}
		p.flushLocked(app)
		if err := p.openLocked(app); err != nil {
			return true, err
		}
		p.closeLocked(app, nil, reason)
	}
	return true, nil
}

// WorkloadEnded closes app's open generation after its workload ended
// without a kernel event (10.5.4): completed with code when only a code is
// known, else failed with reason (default "workload ended").
func (p *Projection) WorkloadEnded(app string, code *int, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushLocked(app)
	if code != nil && reason == "" {
		p.closeLocked(app, code, "")
		return
	}
	if reason == "" {
		reason = "workload ended"
	}
	p.closeLocked(app, nil, reason)
}

// Generation returns app's current generation as this projection knows it.
func (p *Projection) Generation(app string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.apps[app]; ok {
		return s.generation
	}
	return 0
}

func (p *Projection) state(app string) *state {
	s, ok := p.apps[app]
	if !ok {
		s = &state{}
		p.apps[app] = s
	}
	return s
}

func (p *Projection) openLocked(app string) error {
	s := p.state(app)
	if s.startedAt != nil {
		return nil
	}
	gen, trigger, err := p.ledger.OpenGeneration(app)
	if err != nil {
		return err
	}
	if trigger == "" {
		trigger = contract.TriggerWatch
	}
	now := p.now()
	s.generation, s.startedAt, s.started = gen, &now, false
	p.emit(contract.Event{Type: contract.EventRun, App: app, Generation: gen, Phase: "started", Trigger: trigger})
	return nil
}

// stoppedLocked closes the open generation on Kernel.Stopped: completed at
// once when it had started, else held for BootFailureWindow (see
// state.pending).
func (p *Projection) stoppedLocked(app string, code int) {
	s := p.state(app)
	if s.startedAt == nil || s.generation == 0 {
		return
	}
	if s.started {
		p.closeLocked(app, &code, "")
		return
	}
	ms := p.now().Sub(*s.startedAt).Milliseconds()
	ev := contract.Event{Type: contract.EventRun, App: app, Generation: s.generation, Phase: "completed", Code: &code, DurationMs: &ms}
	s.startedAt = nil
	pc := &pendingClose{ev: ev}
	pc.timer = time.AfterFunc(BootFailureWindow, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if cur, ok := p.apps[app]; ok && cur.pending == pc {
			p.flushLocked(app)
		}
	})
	s.pending = pc
}

// flushLocked emits app's held outcome, if any.
func (p *Projection) flushLocked(app string) {
	s, ok := p.apps[app]
	if !ok || s.pending == nil {
		return
	}
	s.pending.timer.Stop()
	ev := s.pending.ev
	s.pending = nil
	p.emit(ev)
}

// Flush emits every held outcome now (see BootFailureWindow).
func (p *Projection) Flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for app := range p.apps {
		p.flushLocked(app)
	}
}

// closeLocked closes the open generation once; a close with none open is
// ignored (at most one outcome per generation).
func (p *Projection) closeLocked(app string, code *int, reason string) {
	s := p.state(app)
	if s.startedAt == nil || s.generation == 0 {
		return
	}
	ev := contract.Event{Type: contract.EventRun, App: app, Generation: s.generation}
	if reason != "" {
		ev.Phase, ev.Reason = "failed", reason
	} else {
		ms := p.now().Sub(*s.startedAt).Milliseconds()
		ev.Phase, ev.Code, ev.DurationMs = "completed", code, &ms
	}
	s.startedAt = nil
	p.emit(ev)
}

// Reset forgets every open generation without an outcome: the workload
// that ran them is gone (suspend, app-set change), and the next kernel's
// Kernel.Starting opens the next generation.
func (p *Projection) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for app, s := range p.apps {
		p.flushLocked(app)
		s.startedAt = nil
	}
}

// Forget drops an app removed from the session.
func (p *Projection) Forget(app string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.apps[app]; ok && s.pending != nil {
		s.pending.timer.Stop()
	}
	delete(p.apps, app)
}
