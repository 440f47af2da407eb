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

func (o *owned) Running(endpoints []contract.Endpoint) {
	o.flush()
	if endpoints == nil {
		endpoints = []contract.Endpoint{}
	}
	_, err := o.store.SetStatus(context.Background(), o.id, contract.Status{Kind: contract.StatusRunning, Endpoints: endpoints}, nil)
	if err != nil && !errors.Is(err, session.ErrTerminal) {
		o.log.Error("set running", "err", err)
	}
}

func (o *owned) Output(app string, tag byte, p []byte) {
	if pump, ok := o.pumps[app]; ok {
		pump.Write(tag, p)
	}
}

func (o *owned) Debug(app string, frame json.RawMessage) {
	isEvent, err := o.proj.Feed(app, frame)
	if err != nil {
		o.log.Warn("project run", "app", app, "err", err)
	}
	if isEvent {
		o.enqueue(contract.Event{Type: contract.EventDebug, App: app, Frame: append(json.RawMessage(nil), frame...)})
	}
}

func (o *owned) RunEnded(app string, code *int, reason string) {
	o.proj.WorkloadEnded(app, code, reason)
}

func (o *owned) Reachability(app string, port int, state string) {
	o.enqueue(contract.Event{Type: contract.EventReachability, App: app, Port: port, State: state})
}
