// Package supervisor is the background policy service (contract 13): one
// active replica (leader-elected over a key with a TTL; standbys take over
// when it stops renewing) reconciles every stored session on a tick:
// checkpoints of live watch sessions, idle suspend, suspended-TTL and
// exit-TTL eviction, adoption requests for sessions whose driver died,
// delivery of status events a dead writer left in a record's outbox, and
// garbage collection of unreferenced checkpoint blobs.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/pkg/session"
)

// Config is the supervisor configuration.
type Config struct {
	ExitTTL         time.Duration // RUNNER_EXIT_TTL_MS
	Idle            time.Duration // RUNNER_WATCH_IDLE_SECONDS
	CheckpointEvery time.Duration // RUNNER_WORKSPACE_CHECKPOINT_SECONDS
	SuspendedTTL    time.Duration // RUNNER_WATCH_SUSPENDED_TTL_SECONDS
	// Tick is the reconcile period (contract 13.1: 5 s;
	// RUNNER_SUPERVISOR_TICK_MS).
	Tick time.Duration
	// AdoptAfter is how long after its start was requested a starting
	// session with no owner and no queued start command is left alone
	// (the edge records `starting` before it publishes the command).
	AdoptAfter time.Duration
	// GCEvery is how often unreferenced blobs are collected.
	GCEvery time.Duration
	ID      string
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	life := session.DefaultLifetimes()
	def(&c.ExitTTL, life.ExitTTL)
	def(&c.Idle, life.Idle)
	def(&c.CheckpointEvery, life.Checkpoint)
	def(&c.SuspendedTTL, life.SuspendedTTL)
	def(&c.Tick, 5*time.Second)
	def(&c.AdoptAfter, 30*time.Second)
	def(&c.GCEvery, 10*time.Minute)
	if c.ID == "" {
		c.ID = "supervisor-" + nuid.Next()
	}
	return c
}

// Deps are the supervisor's connections.
type Deps struct {
	NC       *nats.Conn
	Logger   *slog.Logger
	Limits   bus.Limits
	Registry prometheus.Registerer
	Now      func() time.Time
}

// Run reconciles until ctx ends.
func Run(ctx context.Context, cfg Config, d Deps) error {
	cfg = cfg.withDefaults()
	if d.Now == nil {
		d.Now = time.Now
	}
	log := run.ServiceLogger(d.Logger, "supervisor", "supervisor", cfg.ID)
	js, err := jetstream.New(d.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	var store *session.Store
	var cps *checkpoint.Store
	var cmds jetstream.Stream
	if err := bus.WaitProvisioned(ctx, js, log, time.Minute, func(ctx context.Context) (err error) {
		store, err = session.Open(ctx, js, bus.Limits.Defaults(d.Limits).ReplayBytes)
		return err
	}, func(ctx context.Context) (err error) {
		cps, err = checkpoint.NewStore(ctx, js, checkpoint.Options{})
		return err
	}, func(ctx context.Context) (err error) {
		if cmds, err = js.Stream(ctx, bus.StreamCmd); err != nil {
			return fmt.Errorf("open stream %s: %w", bus.StreamCmd, err)
		}
		return nil
	}); err != nil {
		return err
	}
	s := &sup{cfg: cfg, nc: d.NC, store: store, cps: cps, cmds: cmds, log: log, now: d.Now, ownerTTL: bus.Limits.Defaults(d.Limits).OwnerTTL,
		busy: map[string]bool{}, lastCheckpoint: map[string]time.Time{}, m: newMetrics(d.Registry)}
	t := time.NewTicker(cfg.Tick)
	defer t.Stop()
	for {
		if s.lead(ctx) {
			s.reconcile(ctx)
		}
		select {
		case <-ctx.Done():
			s.jobs.Wait()
			if s.leaderRev != 0 {
				_ = store.ReleaseOwner(context.Background(), bus.KeyLeader, s.leaderRev)
			}
			return nil
		case <-t.C:
		}
	}
}

type sup struct {
	cfg       Config
	nc        *nats.Conn
	store     *session.Store
	cps       *checkpoint.Store
	cmds      jetstream.Stream // RUNNER_CMD: queued start commands
	ownerTTL  time.Duration    // the owners bucket's TTL: the adopt request window
	log       *slog.Logger
	now       func() time.Time
	m         metrics
	leaderRev uint64
	lastGC    time.Time

	jobs           sync.WaitGroup
	mu             sync.Mutex
	busy           map[string]bool      // a checkpoint/suspend job in flight
	lastCheckpoint map[string]time.Time // last successful checkpoint
}

// lead holds or takes the leader key; it reports whether this replica is
// the active one.
func (s *sup) lead(ctx context.Context) bool {
	if s.leaderRev != 0 {
		rev, err := s.store.RenewOwner(ctx, bus.KeyLeader, s.cfg.ID, s.leaderRev)
		if err == nil {
			s.leaderRev = rev
			return true
		}
		s.log.Warn("lost supervisor leadership", "err", err)
		s.leaderRev = 0
	}
	rev, err := s.store.ClaimOwner(ctx, bus.KeyLeader, s.cfg.ID)
	if err != nil {
		return false
	}
	s.log.Info("supervisor is the active replica")
	s.leaderRev = rev
	return true
}

// reconcile looks at every session once.
func (s *sup) reconcile(ctx context.Context) {
	ids, err := s.store.SessionIDs(ctx)
	if err != nil {
		s.log.Warn("list sessions", "err", err)
		return
	}
	for _, id := range ids {
		rec, _, err := s.store.Get(ctx, id)
		if errors.Is(err, session.ErrNotFound) {
			continue
		}
		if err != nil {
			s.log.Warn("read session", "session", id, "err", err)
			continue
		}
		s.reconcileOne(ctx, rec)
	}
	if s.now().Sub(s.lastGC) >= s.cfg.GCEvery {
		s.lastGC = s.now()
		if n, err := s.cps.CollectGarbage(ctx); err != nil {
			s.log.Warn("collect checkpoint garbage", "err", err)
		} else if n > 0 {
			s.log.Info("collected checkpoint blobs", "removed", n)
		}
	}
}

func (s *sup) reconcileOne(ctx context.Context, rec session.Record) {
	now := s.now()
	if len(rec.Outbox) > 0 && now.Sub(rec.Outbox[0].At) >= s.cfg.Tick {
		// A status writer died between the transition and its event (or
		// the append failed): deliver the event, exactly once.
		if err := s.store.FlushStatus(ctx, rec.ID); err != nil {
			s.log.Warn("deliver pending status events", "session", rec.ID, "err", err)
		} else {
			s.m.outboxFlushes.Inc()
			s.log.Info("delivered pending status events", "session", rec.ID, "events", len(rec.Outbox))
		}
	}
	switch {
	case rec.Status.Terminal():
		// An ended session costs this replica nothing until its eviction.
		s.store.Release(rec.ID)
		s.mu.Lock()
		delete(s.lastCheckpoint, rec.ID)
		s.mu.Unlock()
		if rec.ExitedAt != nil && now.Sub(*rec.ExitedAt) >= s.cfg.ExitTTL {
			s.evict(ctx, rec.ID, "exit TTL")
		}
	case rec.Status.Kind == contract.StatusSuspended:
		if rec.SuspendedAt != nil && now.Sub(*rec.SuspendedAt) >= s.cfg.SuspendedTTL {
			s.evict(ctx, rec.ID, "suspended TTL")
		}
	default:
		if !s.owned(ctx, rec) {
			return
		}
		if rec.Mode == contract.ModeWatch && rec.Status.Kind == contract.StatusRunning {
			s.watchPolicy(ctx, rec)
		}
	}
}

// owned reports whether a live session has an owner, and asks the drivers
// to adopt it when it has none and no start is in flight (ARCHITECTURE
// §3): the decision comes from ownership, never from the session's age.
//
// A start is in flight while its command is on the work queue (queued, or
// delivered and not yet acked) or its owner key exists. A driver creates
// the owner key before it acks the command and before anything slow, so
// looking at the queue first and at the key second never misses a start
// moving from one to the other. Only a starting session whose start was
// requested less than AdoptAfter ago is also left alone: the edge writes
// `starting` before it publishes the command.
func (s *sup) owned(ctx context.Context, rec session.Record) bool {
	queued, err := s.startQueued(ctx, rec.ID)
	if err != nil {
		s.log.Warn("look for a queued start", "session", rec.ID, "err", err)
		return false
	}
	if queued {
		return false
	}
	if _, _, err := s.store.Owner(ctx, rec.ID); err == nil {
		return true
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	if rec.Status.Kind == contract.StatusStarting {
		requested := rec.CreatedAt
		if rec.StartRequestedAt != nil {
			requested = *rec.StartRequestedAt
		}
		if s.now().Sub(requested) < s.cfg.AdoptAfter {
			return false // its start command may still be on its way
		}
	}
	// One adopt request per session per owner TTL at most. A request handed
	// to a driver that died before acking it waits out the consumer's ack
	// wait; the next window's request reaches a live driver sooner (an
	// adopter claims the owner key first, so a late duplicate does nothing).
	if err := s.store.RequestAdopt(ctx, rec.ID, bus.AdoptAttempt(s.now(), s.ownerTTL)); err != nil {
		s.log.Warn("request adoption", "session", rec.ID, "err", err)
	} else {
		s.log.Info("requested adoption of an ownerless session", "session", rec.ID)
	}
	return false
}

// startQueued reports whether a start command for id is on the work queue.
func (s *sup) startQueued(ctx context.Context, id string) (bool, error) {
	_, err := s.cmds.GetLastMsgForSubject(ctx, bus.CmdStartSubject(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	return err == nil, err
}

// watchPolicy applies 13.1 to a running watch session: suspend when idle,
// else checkpoint when due. Jobs run in the background, one per session.
func (s *sup) watchPolicy(ctx context.Context, rec session.Record) {
	idleSince, err := s.idleSince(ctx, rec)
	if err != nil {
		s.log.Warn("read presence", "session", rec.ID, "err", err)
		return
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[rec.ID] {
		return
	}
	last, ok := s.lastCheckpoint[rec.ID]
	switch {
	case idleSince != nil && now.Sub(*idleSince) >= s.cfg.Idle:
		s.start(ctx, rec.ID, s.suspend)
	case !ok || now.Sub(last) >= s.cfg.CheckpointEvery:
		s.start(ctx, rec.ID, func(ctx context.Context, id string) error { return s.checkpoint(ctx, id, checkpoint.ReasonPeriodic) })
	}
}

// start runs job for id in the background; s.mu is held by the caller.
func (s *sup) start(ctx context.Context, id string, job func(context.Context, string) error) {
	s.busy[id] = true
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		if err := job(ctx, id); err != nil && ctx.Err() == nil {
			s.log.Warn("supervisor job failed; retried on a later tick", "session", id, "err", err)
		}
		s.mu.Lock()
		delete(s.busy, id)
		s.mu.Unlock()
	}()
}

// idleSince keeps the record's idleSince in step with presence: cleared
// while any edge counts a client, set when the last one left (13.2).
func (s *sup) idleSince(ctx context.Context, rec session.Record) (*time.Time, error) {
	present, err := s.present(ctx, rec.ID)
	if err != nil {
		return nil, err
	}
	switch {
	case present && rec.IdleSince != nil:
		_, err = s.store.Update(ctx, rec.ID, func(r *session.Record) error { r.IdleSince = nil; return nil })
		return nil, err
	case !present && rec.IdleSince == nil:
		now := s.now().UTC()
		_, err = s.store.Update(ctx, rec.ID, func(r *session.Record) error {
			if r.IdleSince == nil {
				r.IdleSince = &now
			}
			return nil
		})
		return &now, err
	case present:
		return nil, nil
	}
	return rec.IdleSince, nil
}

func (s *sup) present(ctx context.Context, id string) (bool, error) {
	return s.store.Present(ctx, id)
}

// checkpoint asks runner-ws for an incremental checkpoint, recorded in
// the session's history as reason.
func (s *sup) checkpoint(ctx context.Context, id, reason string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := bus.CallJSON(ctx, s.nc, bus.WSSubject(id, bus.WSCheckpoint), map[string]string{"reason": reason}, nil)
	if err != nil {
		s.m.checkpointFailures.Inc()
		return fmt.Errorf("checkpoint: %w", err)
	}
	s.m.checkpoints.Inc()
	s.mu.Lock()
	s.lastCheckpoint[id] = s.now()
	s.mu.Unlock()
	return nil
}

// suspend checkpoints, then asks the owner to end the workload; the owner
// records `suspended` once it is gone. A failed checkpoint aborts (13.4).
// This checkpoint moves what changed while the workspace still takes
// writes; the owner then freezes the workspace and takes the final one
// (the history's suspend entry), so the freeze is short and no write lands
// after the final checkpoint unseen.
//
// The decision to suspend was taken on the tick's presence; the checkpoint
// can take a while, so presence is read again at the moment the suspend
// is asked for: a client that came back meanwhile keeps the session
// running (the idle clock starts again when it leaves).
func (s *sup) suspend(ctx context.Context, id string) error {
	if err := s.checkpoint(ctx, id, checkpoint.ReasonPeriodic); err != nil {
		return fmt.Errorf("suspend aborted: %w", err)
	}
	present, err := s.present(ctx, id)
	if err != nil {
		return fmt.Errorf("suspend aborted: read presence: %w", err)
	}
	if present {
		if _, err := s.store.Update(ctx, id, func(r *session.Record) error { r.IdleSince = nil; return nil }); err != nil {
			return fmt.Errorf("suspend cancelled (a client is back), clear idleSince: %w", err)
		}
		s.log.Info("suspend cancelled: a client came back while it was prepared", "session", id)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := bus.CallJSON(ctx, s.nc, bus.CtlSubject(id, bus.CtlSuspend), nil, nil); err != nil {
		return fmt.Errorf("suspend: %w", err)
	}
	s.m.suspends.Inc()
	s.log.Info("suspended idle watch session", "session", id)
	return nil
}

// evict removes every trace of a session, its checkpoint manifest first.
func (s *sup) evict(ctx context.Context, id, why string) {
	if err := s.cps.Delete(ctx, id); err != nil {
		s.log.Warn("delete checkpoint", "session", id, "err", err)
	}
	if err := s.store.Evict(ctx, id); err != nil {
		s.log.Warn("evict session", "session", id, "err", err)
		return
	}
	s.mu.Lock()
	delete(s.lastCheckpoint, id)
	s.mu.Unlock()
	s.m.evictions.Inc()
	s.log.Info("evicted session", "session", id, "reason", why)
}

type metrics struct {
	checkpoints, checkpointFailures, suspends, evictions, outboxFlushes prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := metrics{
		checkpoints:        c("runner_supervisor_checkpoints_total", "Workspace checkpoints taken."),
		checkpointFailures: c("runner_supervisor_checkpoint_failures_total", "Workspace checkpoints that failed."),
		suspends:           c("runner_supervisor_suspends_total", "Idle watch sessions suspended."),
		evictions:          c("runner_supervisor_evictions_total", "Sessions evicted by TTL."),
		outboxFlushes:      c("runner_supervisor_status_replays_total", "Sessions whose pending status events the supervisor delivered."),
	}
	if reg != nil {
		reg.MustRegister(m.checkpoints, m.checkpointFailures, m.suspends, m.evictions, m.outboxFlushes)
	}
	return m
}
