package driver

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

// serveCtl answers runner.ctl.<id>.* while the session is owned.
func (o *owned) serveCtl() (micro.Service, error) {
	svc, err := micro.AddService(o.d.o.NC, micro.Config{
		Name: bus.ServiceCtl, Version: "0.1.0",
		Description: "Control of the sessions a pod-driver owns",
		Metadata:    map[string]string{"session": o.id, "driver": o.d.o.ID},
	})
	if err != nil {
		return nil, err
	}
	err = svc.AddEndpoint("ctl", micro.HandlerFunc(o.handleCtl), micro.WithEndpointSubject(bus.CtlSubjects(o.id)))
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

// handleCtl answers one control request. stdin and resize are quick and
// stay in order on the subscription's goroutine; stop, suspend and apps
// may take long (a checkpoint, a workload's stop) and run on their own, so
// a DELETE or keystrokes never wait behind a PUT apps. A request that
// arrives while the session is ending gets a clean answer.
func (o *owned) handleCtl(req micro.Request) {
	verb := bus.Op(req.Subject())
	switch verb {
	case bus.CtlStdin, bus.CtlResize:
		o.handleIO(req, verb)
		return
	}
	o.ctlMu.Lock()
	if o.ctlClosed {
		o.ctlMu.Unlock()
		o.answerEnded(req, verb)
		return
	}
	o.ctlWG.Add(1)
	o.ctlMu.Unlock()
	go func() {
		defer o.ctlWG.Done()
		o.handleSlow(req, verb)
	}()
}

func (o *owned) handleIO(req micro.Request, verb string) {
	app := req.Headers().Get(bus.HeaderApp)
	o.mu.Lock()
	w := o.w
	o.mu.Unlock()
	if w == nil {
		return
	}
	switch verb {
	case bus.CtlStdin:
		_ = w.Stdin(app, req.Data())
	case bus.CtlResize:
		var sz struct{ Cols, Rows int }
		if json.Unmarshal(req.Data(), &sz) == nil {
			_ = w.Resize(app, sz.Cols, sz.Rows)
		}
	}
}

// answerEnded answers a request for a session that is ending: a stop is
// done (the session ends anyway), anything else finds no live workload.
func (o *owned) answerEnded(req micro.Request, verb string) {
	switch verb {
	case bus.CtlStop:
		respondOK(req)
	default: // on the handler's goroutine: counted in runner-ctl's stats
		_ = bus.ReplyError(req, &contract.Error{Code: "not_running", Message: "the session has no live workload"})
	}
}

func (o *owned) handleSlow(req micro.Request, verb string) {
	switch verb {
	case bus.CtlStop:
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := o.requestStop(ctx); err != nil {
			respondErr(req, "stop_failed", err.Error())
			return
		}
		respondOK(req)
	case bus.CtlSuspend:
		// The supervisor took a checkpoint first; the workspace is frozen
		// and checkpointed once more (what changed since), then the
		// workload goes, the record stays (13.4).
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		if o.mode == contract.ModeWatch {
			if err := o.finalCheckpoint(ctx); err != nil {
				respondErr(req, "suspend_failed", err.Error())
				return
			}
		}
		if err := o.end(ctx, intentSuspend); err != nil {
			o.thaw()
			respondErr(req, "suspend_failed", err.Error())
			return
		}
		respondOK(req)
	case bus.CtlApps:
		// Answered as soon as the change is taken (the edge answers 202,
		// contract 4.12); the outcome is the session's status.
		var change session.AppsChange
		if err := json.Unmarshal(req.Data(), &change); err != nil || len(change.Apps) == 0 {
			respondErr(req, "invalid_request", "undecodable app set")
			return
		}
		if bus.Expired(req.Headers(), time.Now()) {
			// The edge stopped waiting and answered that nothing changed.
			respondErr(req, "set_apps_failed", "the change arrived after the edge stopped waiting for it; the app set is unchanged")
			return
		}
		if !o.beginAppsChange() {
			respondErr(req, "not_running", errNotLive.Error())
			return
		}
		respondOK(req)
		o.changeApps(change)
	default:
		respondErr(req, "invalid_request", "unknown control verb")
	}
}

func respondOK(req micro.Request) {
	_ = bus.Reply(req, nil)
}

// respondErr answers a slow verb's failure (after the handler returned).
func respondErr(req micro.Request, code, msg string) {
	_ = bus.ReplyErrorLater(req, &contract.Error{Code: code, Message: msg}, code)
}
