// Package proxy is the workspace-proxy service's entry point: the
// runner-ws request/reply service (nats micro, queue group, so any number
// of replicas share the load) that relays a watch session's workspace
// operations to its workspace server, whose address it resolves from the
// session record.
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

// Config is the workspace-proxy configuration.
type Config struct {
	// MaxInFlight bounds concurrent workspace operations of this replica.
	MaxInFlight int
	// History is how many checkpoints of a session are kept
	// (RUNNER_CHECKPOINT_HISTORY; 0: checkpoint.DefaultHistory).
	History int
}

// LoadConfig reads the proxy's variables; unset or empty means the default.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) {
	var c Config
	e := envconf.New(lookup)
	e.Int("RUNNER_CHECKPOINT_HISTORY", 1, checkpoint.MaxHistory, &c.History)
	return c, e.Err()
}

// Deps are the proxy's connections.
type Deps struct {
	NC     *nats.Conn
	Logger *slog.Logger
	Limits bus.Limits
}

// Run serves runner-ws until ctx ends, then drains in-flight operations.
func Run(ctx context.Context, cfg Config, d Deps) error {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	log := run.ServiceLogger(d.Logger, "workspace-proxy")
	js, err := jetstream.New(d.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	var store *session.Store
	var cps *checkpoint.Store
	if err := bus.WaitProvisioned(ctx, js, log, time.Minute, func(ctx context.Context) (err error) {
		store, err = session.Open(ctx, js, bus.Limits.Defaults(d.Limits).ReplayBytes)
		return err
	}, func(ctx context.Context) (err error) {
		cps, err = newCheckpointStore(ctx, js, cfg.History)
		return err
	}); err != nil {
		return err
	}
	p := &proxy{store: store, ckpt: cps, log: log, sem: make(chan struct{}, cfg.MaxInFlight), hc: &http.Client{}, maxPayload: d.NC.MaxPayload()}
	svc, err := micro.AddService(d.NC, micro.Config{
		Name: bus.ServiceWS, Version: "0.1.0",
		Description: "Workspace operations of watch sessions",
	})
	if err != nil {
		return fmt.Errorf("add service %s: %w", bus.ServiceWS, err)
	}
	if err := svc.AddEndpoint("ws", micro.HandlerFunc(p.handle), micro.WithEndpointSubject(bus.WSSubjects)); err != nil {
		_ = svc.Stop()
		return fmt.Errorf("add endpoint: %w", err)
	}
	log.Info("workspace-proxy serving runner-ws")
	<-ctx.Done()
	err = svc.Stop()
	p.wg.Wait()
	return err
}

type proxy struct {
	store *session.Store
	ckpt  *checkpoint.Store
	log   *slog.Logger
	sem   chan struct{}
	wg    sync.WaitGroup
	hc    *http.Client
	// maxPayload is the bus's message bound, which every reply must fit.
	maxPayload int64
}

// handle runs each operation on its own goroutine (bounded), so one slow
// workspace never blocks the subscription.
func (p *proxy) handle(req micro.Request) {
	p.sem <- struct{}{}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { <-p.sem }()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout(req.Subject()))
		defer cancel()
		result, err := p.do(ctx, req)
		if f, ok := result.(framed); ok && err == nil {
			err = bus.ReplyFrame(req, f.result, f.data)
		} else if err == nil {
			err = bus.Reply(req, result)
		} else {
			err = bus.ReplyErrorLater(req, err, "workspace_error") // answered after the handler returned
		}
		if err != nil {
			p.log.Warn("respond", "subject", req.Subject(), "err", err)
		}
	}()
}

// opTimeout bounds one workspace operation: a checkpoint or a restore moves
// the whole workspace (a first checkpoint of a large one, everything), the
// others one request to the workspace server.
func opTimeout(subject string) time.Duration {
	if op := bus.Op(subject); op == bus.WSCheckpoint || op == bus.WSRestore {
		return 5 * time.Minute
	}
	return wsapi.Timeout + 5*time.Second
}

// do resolves the session's workspace and performs one operation.
func (p *proxy) do(ctx context.Context, req micro.Request) (any, error) {
	id, op, ok := bus.SessionOp(req.Subject())
	if !ok {
		return nil, contract.Errorf("invalid_request", "bad subject %q", req.Subject())
	}
	rec, _, err := p.store.Get(ctx, id)
	if errors.Is(err, session.ErrNotFound) {
		return nil, contract.Errorf("not_found", "session '%s' not in registry", id)
	}
	if err != nil {
		return nil, err
	}
	if rec.Mode != contract.ModeWatch {
		return nil, contract.Errorf("not_a_watch_session", "session '%s' is not a watch session", id)
	}
	if rec.Workspace == "" || rec.Status.Kind != contract.StatusRunning {
		return nil, contract.Errorf("not_running", "session '%s' has no live workspace", id)
	}
	c := wsapi.New(rec.Workspace, p.hc)
	var res any
	if op == bus.WSRestore {
		res, err = p.restoreTo(ctx, c, rec, req.Data())
	} else {
		res, err = p.op(ctx, c, id, op, req.Data())
	}
	if err != nil {
		return nil, mapErr(err)
	}
	return res, nil
}

func (p *proxy) op(ctx context.Context, c *wsapi.Client, id, op string, data []byte) (any, error) {
	switch op {
	case bus.WSCheckpoint:
		return p.checkpointOp(ctx, c, id, data)
	case bus.WSTree:
		return c.Tree(ctx)
	case bus.WSRead:
		var r contract.WSRead
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, contract.Errorf("invalid_request", "read: %v", err)
		}
		return c.Read(ctx, r.Path, r.Encoding)
	case bus.WSApply:
		var cs wsapi.ChangeSet
		if err := json.Unmarshal(data, &cs); err != nil {
			return nil, contract.Errorf("invalid_request", "apply: %v", err)
		}
		if err := normalizeChangeSet(&cs); err != nil {
			return nil, err
		}
		return c.Apply(ctx, cs)
	case bus.WSFreeze:
		var f struct {
			Frozen *bool `json:"frozen"`
		}
		if err := json.Unmarshal(data, &f); err != nil || f.Frozen == nil {
			return nil, contract.Errorf("invalid_request", "freeze: want {\"frozen\": true|false}")
		}
		return map[string]bool{"frozen": *f.Frozen}, c.Freeze(ctx, *f.Frozen)
	case bus.WSTreePage, bus.WSReadRange, bus.WSStage:
		return p.paged(ctx, c, op, data)
	case bus.WSTouch:
		var t contract.WSTouch
		if err := json.Unmarshal(data, &t); err != nil {
			return nil, contract.Errorf("invalid_request", "touch: %v", err)
		}
		n, err := c.Touch(ctx, t.Paths)
		return map[string]int{"touched": n}, err
	}
	return nil, contract.Errorf("invalid_request", "unknown workspace operation %q", op)
}

// normalizeChangeSet re-normalizes every path: the proxy never trusts its
// caller to have done so (19.17). A mode is dropped: the /v1 change set
// has none (only a checkpoint restore sets one).
func normalizeChangeSet(cs *wsapi.ChangeSet) error {
	for i, w := range cs.Write {
		p, err := contract.NormalizePath(w.Path)
		if err != nil {
			return contract.Errorf("invalid_path", "%v", err)
		}
		cs.Write[i].Path, cs.Write[i].Mode = p, 0
	}
	for i, d := range cs.Delete {
		p, err := contract.NormalizePath(d)
		if err != nil {
			return contract.Errorf("invalid_path", "%v", err)
		}
		cs.Delete[i] = p
	}
	return nil
}

// mapErr turns workspace server failures into contract errors: a missing
// file is 404 file_not_found, a refused path 400 invalid_path, anything else
// (including no answer at all) 502 workspace_error.
func mapErr(err error) error {
	var we *wsapi.Error
	if errors.As(err, &we) {
		switch we.Code {
		case wsapi.CodeFileNotFound:
			return contract.Errorf("file_not_found", "%s", we.Message)
		case wsapi.CodeInvalidPath:
			return contract.Errorf("invalid_path", "%s", we.Message)
		case wsapi.CodeFrozen:
			return contract.Errorf("not_running", "%s", we.Message)
		case wsapi.CodeFileChanged:
			return contract.Errorf("file_changed", "%s", we.Message)
		}
		return contract.Errorf("workspace_error", "%v", err)
	}
	var ce *contract.Error
	if errors.As(err, &ce) {
		return ce
	}
	return contract.Errorf("workspace_error", "workspace does not answer: %v", err)
}
