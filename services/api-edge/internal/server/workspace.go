package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/api-edge/internal/decode"
)

// wsTimeout bounds one workspace operation (9.4: 30 s per request).
var wsTimeout = 35 * time.Second

// watchSession loads a session for a watch-only route: 404 not_found,
// 409 not_a_watch_session.
func (s *Server) watchSession(c *gin.Context) (session.Record, bool) {
	id := c.Param("id")
	rec, _, err := s.store.Get(c.Request.Context(), id)
	if errors.Is(err, session.ErrNotFound) {
		s.fail(c, notFound(id))
		return rec, false
	}
	if err != nil {
		s.fail(c, err)
		return rec, false
	}
	if rec.Mode != contract.ModeWatch {
		s.fail(c, contract.Errorf("not_a_watch_session", "session '%s' is not a watch session", id))
		return rec, false
	}
	return rec, true
}

// liveWatchSession is watchSession for a route that needs the live
// workspace: 409 not_running when the session has none.
func (s *Server) liveWatchSession(c *gin.Context) (session.Record, bool) {
	rec, ok := s.watchSession(c)
	if ok && !live(rec) {
		s.fail(c, notRunning(rec))
		return rec, false
	}
	return rec, ok
}

func live(rec session.Record) bool {
	return rec.Status.Kind == contract.StatusRunning && rec.Workspace != ""
}

func notRunning(rec session.Record) *contract.Error {
	return contract.Errorf("not_running", "session '%s' has no live workload (%s)", rec.ID, rec.Status.Kind)
}

// chargeReload admits one request against the session's reload budget
// (13.5): a sliding 60 s window of admitted requests, shared by every edge
// through a CAS on the record. Rejected requests are not recorded.
func (s *Server) chargeReload(c *gin.Context, id string) bool {
	limit := s.cfg.Watch.ReloadLimitPerMinute
	var retry time.Duration
	_, err := s.store.Update(c.Request.Context(), id, func(r *session.Record) error {
		now := s.now()
		kept := r.Reloads[:0:0]
		for _, t := range r.Reloads {
			if now.Sub(t) < time.Minute {
				kept = append(kept, t)
			}
		}
		if len(kept) >= limit {
			retry = time.Minute - now.Sub(kept[0])
			return contract.Errorf("reload_rate_limited", "session '%s' reached its reload budget of %d per minute", id, limit)
		}
		r.Reloads = append(kept, now)
		return nil
	})
	if err != nil {
		var ce *contract.Error
		if errors.As(err, &ce) && ce.Code == "reload_rate_limited" {
			c.Header("Retry-After", strconv.Itoa(int(retry.Seconds())+1))
		}
		s.fail(c, err)
		return false
	}
	return true
}

// wsCall sends a workspace operation to runner-ws and decodes its result.
func (s *Server) wsCall(ctx context.Context, id, op string, req, result any) error {
	var data []byte
	if req != nil {
		var err error
		if data, err = json.Marshal(req); err != nil {
			return err
		}
	}
	_, err := s.wsExchange(ctx, id, op, data, result)
	return err
}

// wsExchange sends body to runner-ws, decodes the reply's envelope into
// result and returns the raw bytes that follow the envelope in a framed
// reply (contract.SplitFrame; nil for a plain one).
func (s *Server) wsExchange(ctx context.Context, id, op string, body []byte, result any) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, wsTimeout)
	defer cancel()
	raw, data, err := bus.Call(ctx, s.nc, &nats.Msg{Subject: bus.WSSubject(id, op), Data: body})
	var ce *contract.Error
	switch {
	case errors.As(err, &ce):
		return nil, ce
	case errors.Is(err, nats.ErrNoResponders):
		return nil, contract.Errorf("workspace_error", "no workspace-proxy is running")
	case err != nil:
		return nil, contract.Errorf("workspace_error", "workspace %s: %v", op, err)
	}
	if result != nil {
		if err := json.Unmarshal(raw, result); err != nil {
			return nil, contract.Errorf("workspace_error", "workspace %s: undecodable result", op)
		}
	}
	return data, nil
}

// getWorkspace is GET /v1/sessions/:id/workspace (4.8).
func (s *Server) getWorkspace(c *gin.Context) {
	rec, ok := s.liveWatchSession(c)
	if !ok {
		return
	}
	s.streamTree(c, rec.ID)
}

// postWorkspace is POST /v1/sessions/:id/workspace (4.9): the normalized
// paths, never the raw ones, reach the workspace (19.17).
func (s *Server) postWorkspace(c *gin.Context) {
	data, ok := s.readWorkspaceBody(c)
	if !ok {
		return
	}
	cs, err := parseChangeSet(data)
	if err == nil {
		err = checkContents(cs)
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	rec, ok := s.watchSession(c)
	if !ok {
		return
	}
	if !s.chargeReload(c, rec.ID) {
		return
	}
	if !live(rec) {
		s.fail(c, notRunning(rec))
		return
	}
	for i, w := range cs.Write {
		p, err := contract.NormalizePath(w.Path)
		if err != nil {
			s.fail(c, contract.Errorf("invalid_path", "%v", err))
			return
		}
		cs.Write[i].Path = p
	}
	for i, d := range cs.Delete {
		p, err := contract.NormalizePath(d)
		if err != nil {
			s.fail(c, contract.Errorf("invalid_path", "%v", err))
			return
		}
		cs.Delete[i] = p
	}
	if err := s.forwardChangeSet(c, rec.ID, cs); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, contract.ApplyResult{Written: len(cs.Write), Deleted: len(cs.Delete)})
}

func parseChangeSet(data []byte) (contract.ChangeSet, error) {
	var cs contract.ChangeSet
	body, err := decode.Parse(data, "body")
	if err != nil {
		return cs, err
	}
	writes, _, err := body.Array("write", false)
	if err != nil {
		return cs, err
	}
	for i, w := range writes {
		o, err := decode.AsObject(w, fmt.Sprintf("body/write/%d", i))
		if err != nil {
			return cs, err
		}
		var op contract.WriteOp
		if op.Path, _, err = o.Str("path", true, 1); err != nil {
			return cs, err
		}
		if op.Content, _, err = o.Str("content", true, 0); err != nil {
			return cs, err
		}
		if op.Encoding, _, err = o.Enum("encoding", false, "utf8", "base64"); err != nil {
			return cs, err
		}
		cs.Write = append(cs.Write, op)
	}
	deletes, _, err := body.Array("delete", false)
	if err != nil {
		return cs, err
	}
	for i, d := range deletes {
		p, ok := d.(string)
		if !ok || p == "" {
			return cs, decode.Errorf("body/delete/%d must be a non-empty string", i)
		}
		cs.Delete = append(cs.Delete, p)
	}
	return cs, nil
}

// getWorkspaceFile is GET /v1/sessions/:id/workspace/file (4.10).
func (s *Server) getWorkspaceFile(c *gin.Context) {
	rec, ok := s.liveWatchSession(c)
	if !ok {
		return
	}
	raw := strings.TrimSpace(c.Query("path"))
	if raw == "" {
		s.fail(c, contract.Errorf("invalid_path", "?path= is required"))
		return
	}
	p, err := contract.NormalizePath(raw)
	if err != nil {
		s.fail(c, contract.Errorf("invalid_path", "%v", err))
		return
	}
	enc := c.Query("encoding")
	if enc != "" && enc != "utf8" && enc != "base64" {
		s.fail(c, contract.Errorf("invalid_request", "encoding must be utf8 or base64"))
		return
	}
	s.streamFile(c, rec.ID, p, enc)
}

// reload is POST /v1/sessions/:id/reload[?app=] (4.11): the targets'
// next generations are marked manual, then their entry manifests touched.
func (s *Server) reload(c *gin.Context) {
	rec, ok := s.liveWatchSession(c)
	if !ok {
		return
	}
	if !s.chargeReload(c, rec.ID) {
		return
	}
	var targets []session.App
	if name := strings.TrimSpace(c.Query("app")); name != "" {
		a, ok := rec.App(name)
		if !ok {
			s.fail(c, contract.Errorf("unknown_app", "session runs no app named '%s'", name))
			return
		}
		targets = []session.App{*a}
	} else {
		targets = rec.Apps
	}
	names := make([]string, 0, len(targets))
	paths := make([]string, 0, len(targets))
	for _, a := range targets {
		names = append(names, a.Name)
		paths = append(paths, a.Entry)
	}
	ctx := c.Request.Context()
	if _, err := s.store.Update(ctx, rec.ID, func(r *session.Record) error {
		for _, n := range names {
			if a, ok := r.App(n); ok {
				a.Trigger = contract.TriggerManual
			}
		}
		return nil
	}); err != nil {
		s.fail(c, err)
		return
	}
	if err := s.wsCall(ctx, rec.ID, bus.WSTouch, contract.WSTouch{Paths: paths}, nil); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusAccepted, gin.H{"reloaded": names})
}

// resume is POST /v1/sessions/:id/resume (4.13): the suspended session
// starts again under the same id, its workspace restored from the
// checkpoint before any app's first generation.
func (s *Server) resume(c *gin.Context) {
	id := c.Param("id")
	ctx := c.Request.Context()
	notSuspended := contract.Errorf("not_suspended", "session '%s' is not suspended", id)
	rec, _, err := s.store.Get(ctx, id)
	if errors.Is(err, session.ErrNotFound) || (err == nil && rec.Status.Kind != contract.StatusSuspended) {
		s.fail(c, notSuspended)
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	if _, err := s.store.Checkpoints().Get(ctx, id); err != nil {
		s.fail(c, contract.Errorf("no_checkpoint", "session '%s' was suspended before any checkpoint existed", id))
		return
	}
	// 19.20: resume re-checks the watch ceiling.
	if n, err := s.store.CountLiveWatch(ctx); err != nil {
		s.fail(c, err)
		return
	} else if n >= s.cfg.Watch.MaxSessions {
		s.fail(c, contract.Errorf("too_many_watch_sessions", "runner is at its limit of %d live watch sessions", s.cfg.Watch.MaxSessions))
		return
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	_, err = s.store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusStarting}, func(r *session.Record) error {
		if r.Status.Kind != contract.StatusSuspended {
			return notSuspended
		}
		for i := range r.Apps {
			r.Apps[i].Trigger = contract.TriggerResume
		}
		// A resumed session gets a fresh idle window (13.2).
		r.Workspace, r.IdleSince, r.SuspendedAt = "", &now, nil
		r.StartRequestedAt = &now
		return nil
	})
	s.store.Release(id) // the driver writes the rest: keep no tail here
	if err != nil {
		s.fail(c, err)
		return
	}
	if err := s.publishStart(ctx, id, now); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusAccepted, gin.H{"sessionId": id})
}

// appsTakeTimeout bounds how long PUT apps waits for the owning driver to
// take a change (not to carry it out). The request carries the deadline
// (bus.HeaderDeadline): a driver that gets it later drops it, so when the
// edge answers that nothing changed, nothing does.
var appsTakeTimeout = 10 * time.Second

// appsTakeMargin is how much longer than the deadline the edge waits for
// the driver's answer (clock skew and transit).
const appsTakeMargin = 2 * time.Second

// putApps is PUT /v1/sessions/:id/apps (4.12). The owning driver takes the
// change at once, then checkpoints, recreates the workload with the new
// set and re-seeds it; the route answers 202 when the driver has taken the
// change, and the outcome arrives on the event stream (the contract allows
// this instead of holding the request for minutes): a fresh `running`, or
// `failed` with "changing the app set failed: <detail>".
func (s *Server) putApps(c *gin.Context) {
	data, ok := s.readBody(c)
	if !ok {
		return
	}
	body, err := decode.Parse(data, "body")
	var specs []contract.AppSpec
	if err == nil {
		specs, _, err = body.Apps("apps", true)
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	rec, ok := s.liveWatchSession(c)
	if !ok {
		return
	}
	apps, err := resolveApps(specs, contract.ReservedPorts(contract.ModeWatch, true, len(specs)))
	if err != nil {
		s.fail(c, err)
		return
	}
	change := session.AppsChange{Apps: apps}
	// 19.20: the manifest-wins rule applies to an app-set change too.
	if a := rec.Launch.AgentSpec; a != nil {
		if owner := portOwner(apps, contract.PortMapping{Port: a.Port, Protocol: "tcp"}); owner != "" {
			change.DropAgent = true
			change.Notices = append(change.Notices, fmt.Sprintf("co-resident agent %q was stopped: app %q declares its port tcp/%d", a.Name, owner, a.Port))
		}
	}
	payload, _ := json.Marshal(change)
	hdr := nats.Header{}
	wait := appsTakeTimeout
	bus.SetDeadline(hdr, time.Now().Add(wait))
	if err := s.ctlData(c.Request.Context(), rec.ID, bus.CtlApps, payload, hdr, wait+appsTakeMargin); err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			s.fail(c, notRunning(rec))
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			s.fail(c, contract.Errorf("set_apps_failed", "the session's driver did not take the change within %v; the app set is unchanged", wait))
		default:
			s.fail(c, err)
		}
		return
	}
	names := make([]string, 0, len(apps))
	for _, a := range apps {
		names = append(names, a.Name)
	}
	c.JSON(http.StatusAccepted, gin.H{"apps": names})
}
