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
}

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
		return true, p.openLocked(app)
	case "Kernel.Stopped":
		var pl struct {
			ExitCode any `json:"exitCode"`
		}
		_ = json.Unmarshal(f.Payload, &pl)
		code := 0
		if n, ok := pl.ExitCode.(float64); ok {
			code = int(n)
		}
		p.closeLocked(app, &code, "")
	case "Kernel.RunFailed":
		var pl struct {
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
	s.generation, s.startedAt = gen, &now
	p.emit(contract.Event{Type: contract.EventRun, App: app, Generation: gen, Phase: "started", Trigger: trigger})
	return nil
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
	for _, s := range p.apps {
		s.startedAt = nil
	}
}

// Forget drops an app removed from the session.
func (p *Projection) Forget(app string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.apps, app)
}
