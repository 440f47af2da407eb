package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/api-edge/internal/decode"
)

var appNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

type created struct {
	SessionID string `json:"sessionId"`
	StreamURL string `json:"streamUrl"`
	CreatedAt string `json:"createdAt"`
}

// termsAccepted enforces section 16: the first x-telo-accepted-terms value
// must equal the configured version.
func (s *Server) termsAccepted(c *gin.Context) bool {
	if s.cfg.Terms == nil {
		return true
	}
	if vals := c.Request.Header.Values("X-Telo-Accepted-Terms"); len(vals) > 0 && vals[0] == s.cfg.Terms.Version {
		return true
	}
	c.JSON(http.StatusPreconditionRequired, gin.H{"error": "terms_required", "terms": s.cfg.Terms})
	return false
}

// createSession is POST /v1/sessions (section 4.4), checks in order.
func (s *Server) createSession(c *gin.Context) {
	data, ok := s.readBody(c)
	if !ok {
		return
	}
	req, err := decode.Create(data)
	if err != nil {
		s.fail(c, err)
		return
	}
	if !s.termsAccepted(c) {
		return
	}
	entry, err := contract.NormalizePath(req.Bundle.EntryRelativePath)
	if err != nil {
		s.fail(c, contract.Errorf("invalid_bundle", "%v", err))
		return
	}
	for _, f := range req.Bundle.Files {
		if _, err := contract.NormalizePath(f.RelativePath); err != nil {
			s.fail(c, contract.Errorf("invalid_bundle", "%v", err))
			return
		}
	}
	if allowed := s.allowedImages(); !slices.Contains(allowed, req.Config.Image) {
		s.fail(c, contract.Errorf("invalid_config", "image %q is not offered by this runner; allowed images: %s", req.Config.Image, strings.Join(allowed, ", ")))
		return
	}
	watch := req.Mode == contract.ModeWatch
	if watch && !s.cfg.Watch.Enabled {
		s.fail(c, contract.Errorf("watch_disabled", "watch sessions are not enabled on this runner (RUNNER_WATCH_SESSIONS)"))
		return
	}
	var agent *session.AgentSpec
	if req.Agent != "" {
		if !watch {
			s.fail(c, contract.Errorf("agent_requires_watch", "agent %q requires mode \"watch\"", req.Agent))
			return
		}
		a, ok := s.cfg.Apps.Lookup(req.Agent)
		if !ok {
			s.fail(c, contract.Errorf("unknown_agent", "no agent named %q; offered: %s", req.Agent, offered(s.cfg.Apps.AgentNames())))
			return
		}
		if a.Port == 0 {
			s.fail(c, contract.Errorf("agent_port_undeclared", "catalog entry %q declares no port; add RUNNER_APPS.%s.port", a.Name, a.Name))
			return
		}
		agent = &session.AgentSpec{Name: a.Name, Image: a.Image, PullPolicy: a.PullPolicy, Port: a.Port} // env: the driver's RUNNER_APPS
	}
	ctx := c.Request.Context()
	if watch {
		n, err := s.store.CountLiveWatch(ctx)
		if err != nil {
			s.fail(c, err)
			return
		}
		if n >= s.cfg.Watch.MaxSessions {
			s.fail(c, contract.Errorf("too_many_watch_sessions", "runner is at its limit of %d live watch sessions", s.cfg.Watch.MaxSessions))
			return
		}
	}
	specs := req.Apps
	if specs == nil {
		specs = []contract.AppSpec{{Name: contract.DefaultApp, EntryRelativePath: entry, Ports: req.Ports, IO: contract.IOTTY}}
	}
	if !watch && len(specs) > 1 {
		s.fail(c, contract.Errorf("invalid_request", "mode \"run\" runs exactly one app; got %d", len(specs)))
		return
	}
	apps, err := resolveApps(specs, contract.ReservedPorts(req.Mode, req.Inspect, len(specs)))
	if err != nil {
		s.fail(c, err)
		return
	}
	var notices []string
	if agent != nil {
		if owner := portOwner(apps, contract.PortMapping{Port: agent.Port, Protocol: "tcp"}); owner != "" {
			notices = append(notices, fmt.Sprintf("co-resident agent %q was not started: app %q declares its port tcp/%d", agent.Name, owner, agent.Port))
			agent = nil
		}
	}
	inspect := req.Inspect || watch
	launch := session.Launch{Env: s.shapeEnv(req.Env, req.Config.RegistryURL), Config: req.Config, Inspect: inspect, AgentSpec: agent}
	bundle := contract.Bundle{EntryRelativePath: entry, Files: req.Bundle.Files}
	s.admitAndStart(c, req.Mode, apps, launch, bundle, notices)
}

// createAppSession is POST /v1/apps/:name/sessions (section 4.5).
func (s *Server) createAppSession(c *gin.Context) {
	data, ok := s.readBody(c)
	if !ok {
		return
	}
	req, err := decode.App(data)
	if err != nil {
		s.fail(c, err)
		return
	}
	name := c.Param("name")
	entry, ok := s.cfg.Apps.Lookup(name)
	if !ok {
		msg := "no operator apps are offered"
		if names := s.cfg.Apps.Names(); len(names) > 0 {
			msg = "offered: " + strings.Join(names, ", ")
		}
		s.fail(c, contract.Errorf("unknown_app", "no operator app named %q (%s); see /v1/capabilities", name, msg))
		return
	}
	if !s.termsAccepted(c) {
		return
	}
	// The entry's env wins over the caller's; it is not stored: the driver
	// adds it from its own RUNNER_APPS (OperatorApp).
	env := map[string]string{}
	for k, v := range req.Env {
		if _, operator := entry.Env[k]; !operator {
			env[k] = v
		}
	}
	shaped := s.shapeEnv(env, "")
	if _, operator := entry.Env["TELO_REGISTRY_URL"]; operator {
		delete(shaped, "TELO_REGISTRY_URL")
	}
	apps := []session.App{{Name: contract.DefaultApp, IO: contract.IOTTY, Ports: req.Ports, Trigger: contract.TriggerInitial}}
	launch := session.Launch{
		OperatorApp:   entry.Name,
		Env:           shaped,
		Config:        contract.SessionConfig{Image: entry.Image, PullPolicy: entry.PullPolicy},
		SelfContained: true,
		Inspect:       false, // 4.5: forced off, the image has no inspect endpoint
	}
	s.admitAndStart(c, contract.ModeRun, apps, launch, contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{}}, nil)
}

// admitAndStart admits and stores a new session, answers 201 and queues
// its start (startSoon). The session is durable before the answer, so an
// edge dying right after it loses nothing. seed (fork: the session's first checkpoint)
// runs after the record and bundle are stored and before the start
// command; a seed that fails ends the session failed.
func (s *Server) admitAndStart(c *gin.Context, mode string, apps []session.App, launch session.Launch, bundle contract.Bundle, notices []string, seed ...func(ctx context.Context, id string) error) {
	ctx := c.Request.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	lim := session.Limits{MaxSessions: s.cfg.MaxSessions}
	if mode == contract.ModeWatch {
		lim.MaxWatchSessions = s.cfg.Watch.MaxSessions
	}
	rec := session.Record{
		Mode: mode, Status: contract.Status{Kind: contract.StatusStarting},
		Apps: apps, CreatedAt: now, IdleSince: &now, Launch: launch, StartRequestedAt: &now,
	}
	if launch.AgentSpec != nil {
		rec.Agent = launch.AgentSpec.Name
	}
	id, err := s.admitAndCreate(ctx, rec, bundle, lim)
	if err != nil {
		s.fail(c, err)
		return
	}
	s.store.AdmittedSoon(id)
	for _, f := range seed {
		if err := f(ctx, id); err != nil {
			// The record exists: it ends failed rather than starting with
			// nothing to start from.
			if _, serr := s.store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusFailed, Message: "start: " + err.Error()}, nil); serr != nil {
				s.log.Warn("record failed seed", "session", id, "err", serr)
			}
			s.fail(c, err)
			return
		}
	}
	for _, n := range notices {
		if _, err := s.store.Emit(ctx, id, contract.Event{Type: contract.EventProgress, Phase: contract.PhaseProvision, Message: n}); err != nil {
			s.fail(c, err)
			return
		}
	}
	s.store.Release(id) // the driver writes the rest: keep no tail here
	s.startSoon(id, now)
	s.m.sessionsCreated.WithLabelValues(mode).Inc()
	c.JSON(http.StatusCreated, created{SessionID: id, StreamURL: "/v1/sessions/" + id + "/events", CreatedAt: contract.Timestamp(now)})
}

// startSoon queues the start of a new session without holding its 201 for
// the acknowledgement. What must survive a crash is durable already: the
// record says starting, with its startRequestedAt. An edge that dies
// before this publish lands loses nothing: the supervisor asks a driver to
// adopt a starting session whose start is neither queued nor owned once
// AdoptAfter (30 s) has passed since it was requested, and the driver
// starts it then. Until then a failed publish is retried here.
func (s *Server) startSoon(id string, requested time.Time) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		wait := 50 * time.Millisecond
		for {
			// Not cut by shutdown: a publish under way finishes (Wait).
			ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 10*time.Second)
			err := s.publishStart(ctx, id, requested)
			cancel()
			if err == nil {
				return
			}
			if time.Since(requested) > startRetryFor || s.ctx.Err() != nil {
				s.log.Warn("start not queued: the supervisor has a driver adopt the session", "session", id, "err", err)
				return
			}
			s.log.Warn("queue start; retrying", "session", id, "err", err)
			select {
			case <-time.After(wait):
			case <-s.ctx.Done():
			}
			wait = min(2*wait, 2*time.Second)
		}
	}()
}

// startRetryFor is how long startSoon retries: the supervisor's default
// AdoptAfter, after which a driver adopts the session instead.
const startRetryFor = 30 * time.Second

// publishStart queues the start of the session whose start was requested
// at requested (the record's startRequestedAt). The Nats-Msg-Id names that
// request, so every publish of the same start (a retry after a lost
// acknowledgement) is de-duplicated by JetStream, and a later start of the
// same session (a resume) is not.
func (s *Server) publishStart(ctx context.Context, id string, requested time.Time) error {
	if err := s.store.RequestStart(ctx, id, bus.StartAttempt(requested)); err != nil {
		return fmt.Errorf("publish start %s: %w", id, err)
	}
	return nil
}

// admitAndCreate draws a session id (5.1), reserves its admission slot and
// writes its record and bundle (at the same time: Store.CreateWithBundle).
// The record's create is what proves the id unused: a drawn id that a
// record already holds gives its slot back (and withdraws its bundle) and
// another id is drawn (a 60-bit id almost never collides, so no read comes
// first).
func (s *Server) admitAndCreate(ctx context.Context, rec session.Record, bundle contract.Bundle, lim session.Limits) (string, error) {
	for range 8 {
		rec.ID = s.newID()
		// Admission reserves the slot first; a slot whose record never
		// appears (a crash right here) is reclaimed after a grace period.
		if err := s.store.Admit(ctx, rec.ID, rec.Mode, lim); err != nil {
			return "", err
		}
		err := s.store.CreateWithBundle(ctx, rec, bundle)
		if err == nil {
			return rec.ID, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", fmt.Errorf("create session %s: %w", rec.ID, err)
		}
		if err := s.store.Unadmit(ctx, rec.ID); err != nil {
			return "", err
		}
	}
	return "", errors.New("draw session id: collisions")
}

// shapeEnv applies 4.4.2's env shaping: registry URL injection and
// TELO_CACHE_DIR removal.
func (s *Server) shapeEnv(env map[string]string, registryURL string) map[string]string {
	out := make(map[string]string, len(env)+1)
	for k, v := range env {
		out[k] = v
	}
	reg := strings.TrimSpace(registryURL)
	if reg == "" {
		reg = s.cfg.RegistryURL
	}
	if _, ok := out["TELO_REGISTRY_URL"]; !ok && reg != "" {
		out["TELO_REGISTRY_URL"] = reg
	}
	delete(out, "TELO_CACHE_DIR")
	return out
}

// resolveApps applies 4.4.2 step 8 in order: names, entry paths, ports.
// A port in reserved (contract.ReservedPorts) is a conflict too.
func resolveApps(specs []contract.AppSpec, reserved map[int]string) ([]session.App, error) {
	apps := make([]session.App, 0, len(specs))
	seen := map[string]bool{}
	claimed := map[string]string{}
	for _, sp := range specs {
		if !appNameRE.MatchString(sp.Name) {
			return nil, contract.Errorf("invalid_app_name", "app name %q is not a DNS label (lowercase letters, digits and '-', starting and ending alphanumeric)", sp.Name)
		}
		if sp.Name == "workspace" || sp.Name == "agent" {
			return nil, contract.Errorf("reserved_app_name", "app name %q is reserved", sp.Name)
		}
		if seen[sp.Name] {
			return nil, contract.Errorf("duplicate_app_name", "app name %q is used twice", sp.Name)
		}
		seen[sp.Name] = true
		entry, err := contract.NormalizePath(sp.EntryRelativePath)
		if err != nil {
			return nil, contract.Errorf("invalid_bundle", "%v", err)
		}
		ports := make([]contract.PortMapping, 0, len(sp.Ports))
		for _, p := range sp.Ports {
			if other, ok := claimed[p.Key()]; ok {
				return nil, contract.Errorf("port_conflict", "apps %q and %q both declare %s", other, sp.Name, p.Key())
			}
			if what, ok := reserved[p.Port]; ok {
				return nil, contract.Errorf("port_conflict", "app %q declares %s, which is reserved for %s", sp.Name, p.Key(), what)
			}
			claimed[p.Key()] = sp.Name
			ports = append(ports, p)
		}
		io := sp.IO
		if io == "" {
			io = contract.IOTTY
		}
		apps = append(apps, session.App{Name: sp.Name, Entry: entry, IO: io, Ports: ports, Trigger: contract.TriggerInitial})
	}
	return apps, nil
}

func portOwner(apps []session.App, p contract.PortMapping) string {
	for _, a := range apps {
		for _, q := range a.Ports {
			if q.Key() == p.Key() {
				return a.Name
			}
		}
	}
	return ""
}

func offered(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

type appDoc struct {
	Name       string                 `json:"name"`
	IO         string                 `json:"io"`
	Generation int                    `json:"generation"`
	Ports      []contract.PortMapping `json:"ports"`
}

type sessionDoc struct {
	SessionID string          `json:"sessionId"`
	Status    contract.Status `json:"status"`
	Mode      string          `json:"mode"`
	Agent     string          `json:"agent,omitempty"`
	Apps      []appDoc        `json:"apps"`
	CreatedAt string          `json:"createdAt"`
	ExitedAt  string          `json:"exitedAt,omitempty"`
}

// getSession is GET /v1/sessions/:id (4.6).
func (s *Server) getSession(c *gin.Context) {
	id := c.Param("id")
	rec, _, err := s.store.Get(c.Request.Context(), id)
	if errors.Is(err, session.ErrNotFound) {
		s.fail(c, notFound(id))
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	doc := sessionDoc{SessionID: rec.ID, Status: rec.Status, Mode: rec.Mode, Agent: rec.Agent, CreatedAt: contract.Timestamp(rec.CreatedAt)}
	for _, a := range rec.Apps {
		ports := a.Ports
		if ports == nil {
			ports = []contract.PortMapping{}
		}
		doc.Apps = append(doc.Apps, appDoc{Name: a.Name, IO: a.IO, Generation: a.Generation, Ports: ports})
	}
	if rec.ExitedAt != nil {
		doc.ExitedAt = contract.Timestamp(*rec.ExitedAt)
	}
	c.JSON(http.StatusOK, doc)
}

// deleteSession is DELETE /v1/sessions/:id (4.7): idempotent stop.
func (s *Server) deleteSession(c *gin.Context) {
	id := c.Param("id")
	ctx := c.Request.Context()
	rec, err := s.store.Update(ctx, id, func(r *session.Record) error {
		if r.UserStopped {
			return bus.ErrNoChange
		}
		r.UserStopped = true
		return nil
	})
	if errors.Is(err, session.ErrNotFound) {
		c.Status(http.StatusNoContent)
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	switch {
	case rec.Status.Terminal():
		c.Status(http.StatusNoContent)
		return
	case rec.Status.Kind == contract.StatusSuspended:
		// 19.18: a suspended session has no workload; stop it here and drop
		// its checkpoint.
		if _, err := s.store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusStopped}, nil); err != nil && !errors.Is(err, session.ErrTerminal) {
			s.fail(c, err)
			return
		}
		_ = checkpoint.Purge(ctx, s.store.Checkpoints(), id)
		c.Status(http.StatusNoContent)
		return
	}
	if err := s.ctl(ctx, id, bus.CtlStop, nil, 30*time.Second); err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			// No live owner. A queued start sees the flag and stops; a
			// workload whose driver died is adopted and stopped.
			if err := s.requestAdopt(ctx, id); err != nil {
				s.fail(c, err)
				return
			}
			c.Status(http.StatusNoContent)
			return
		}
		s.fail(c, contract.Errorf("stop_failed", "%v", err))
		return
	}
	c.Status(http.StatusNoContent)
}

// requestAdopt asks the drivers to take over a session with no live owner.
func (s *Server) requestAdopt(ctx context.Context, id string) error {
	if _, _, err := s.store.Owner(ctx, id); err == nil {
		return nil // owned: its owner is between subscriptions (starting)
	}
	if err := s.store.RequestAdopt(ctx, id, bus.AdoptAttempt(time.Now(), bus.Limits{}.Defaults().OwnerTTL)); err != nil {
		return fmt.Errorf("publish adopt %s: %w", id, err)
	}
	return nil
}
