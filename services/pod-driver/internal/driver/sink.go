package driver

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

// The owned session is the backend's Sink.

func (o *owned) Progress(phase, message string, done bool, app string) {
	o.enqueue(contract.Event{Type: contract.EventProgress, Phase: phase, Message: message, Done: done, App: app})
}

func (o *owned) Running(endpoints []contract.Endpoint, agent *contract.Endpoint) {
	o.flush()
	if endpoints == nil {
		endpoints = []contract.Endpoint{}
	}
	st := contract.Status{Kind: contract.StatusRunning, Endpoints: endpoints, Agent: agent}
	_, err := o.store.SetStatus(context.Background(), o.id, st, nil)
	if err != nil && !errors.Is(err, session.ErrTerminal) {
		o.log.Error("set running", "err", err)
	}
}

func (o *owned) Output(app string, tag byte, p []byte) {
	o.pumpMu.Lock()
	pump, ok := o.pumps[app]
	o.pumpMu.Unlock()
	if ok {
		pump.Write(tag, p)
	}
}

func (o *owned) Debug(app string, frame json.RawMessage) {
	var f struct {
		Kind    string          `json:"kind"`
		Event   string          `json:"event"`
		Payload json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(frame, &f) != nil || f.Kind == "log" || f.Kind == "record" {
		return // only event frames are relayed and projected (10.3)
	}
	o.enqueue(contract.Event{Type: contract.EventDebug, App: app, Frame: append(json.RawMessage(nil), frame...)})
	if _, err := o.proj.Feed(app, frame); err != nil {
		o.log.Warn("project run", "app", app, "err", err)
	}
	if f.Event == "Kernel.PortsResolved" {
		o.portsResolved(app, f.Payload)
	}
}

func (o *owned) RunEnded(app string, code *int, reason string) {
	o.proj.WorkloadEnded(app, code, reason)
}

func (o *owned) Reachability(app string, port int, state string) {
	o.enqueue(contract.Event{Type: contract.EventReachability, App: app, Port: port, State: state})
}

func (o *owned) WorkspaceReady(url string) {
	if _, err := o.store.Update(context.Background(), o.id, func(r *session.Record) error {
		r.Workspace, r.Driver = url, o.d.o.ID
		return nil
	}); err != nil {
		o.log.Error("record workspace address", "err", err)
	}
}
