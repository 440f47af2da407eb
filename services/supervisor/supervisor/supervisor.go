// Package supervisor is the background policy service: one active replica
// (leader-elected over a key with a TTL; standbys take over when it stops
// renewing) reconciles stored sessions on a tick. Today it evicts terminal
// sessions after the exit TTL (contract 5.4); checkpoints, idle suspend
// and adoption requests come with the watch-session work.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/session"
)

// LeaderKey is the runner_owners key the active supervisor holds.
const LeaderKey = "_supervisor"

// Config is the supervisor configuration.
type Config struct {
	ExitTTL time.Duration // RUNNER_EXIT_TTL_MS
	Tick    time.Duration // reconcile period (contract 13.1: 5 s)
	ID      string
}

// Deps are the supervisor's connections.
type Deps struct {
	NC     *nats.Conn
	Logger *slog.Logger
	Limits bus.Limits
	Now    func() time.Time
}

// Run reconciles until ctx ends.
func Run(ctx context.Context, cfg Config, d Deps) error {
	if cfg.ExitTTL <= 0 {
		cfg.ExitTTL = 4 * time.Hour
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 5 * time.Second
	}
	if cfg.ID == "" {
		cfg.ID = "supervisor-" + nuid.Next()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	log := d.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("service", "supervisor", "supervisor", cfg.ID)
	js, err := jetstream.New(d.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := bus.Provision(ctx, js, d.Limits); err != nil {
		return err
	}
	store, err := session.Open(ctx, js, bus.Limits.Defaults(d.Limits).ReplayBytes)
	if err != nil {
		return err
	}
	s := &sup{cfg: cfg, store: store, log: log, now: d.Now}
	t := time.NewTicker(cfg.Tick)
	defer t.Stop()
	for {
		if s.lead(ctx) {
			s.reconcile(ctx)
		}
		select {
		case <-ctx.Done():
			if s.leaderRev != 0 {
				_ = store.Owners.Delete(context.Background(), LeaderKey, jetstream.LastRevision(s.leaderRev))
			}
			return nil
		case <-t.C:
		}
	}
}

type sup struct {
	cfg       Config
	store     *session.Store
	log       *slog.Logger
	now       func() time.Time
	leaderRev uint64
}

// lead holds or takes the leader key; it reports whether this replica is
// the active one.
func (s *sup) lead(ctx context.Context) bool {
	if s.leaderRev != 0 {
		rev, err := s.store.Owners.Update(ctx, LeaderKey, []byte(s.cfg.ID), s.leaderRev)
		if err == nil {
			s.leaderRev = rev
			return true
		}
		s.log.Warn("lost supervisor leadership", "err", err)
		s.leaderRev = 0
	}
	rev, err := s.store.Owners.Create(ctx, LeaderKey, []byte(s.cfg.ID))
	if err != nil {
		return false
	}
	s.log.Info("supervisor is the active replica")
	s.leaderRev = rev
	return true
}

// reconcile evicts terminal sessions whose exit TTL passed.
func (s *sup) reconcile(ctx context.Context) {
	keys, err := s.store.Sessions.ListKeys(ctx)
	if err != nil {
		s.log.Warn("list sessions", "err", err)
		return
	}
	for id := range keys.Keys() {
		rec, _, err := s.store.Get(ctx, id)
		if errors.Is(err, session.ErrNotFound) {
			continue
		}
		if err != nil {
			s.log.Warn("read session", "session", id, "err", err)
			continue
		}
		if rec.Status.Terminal() && rec.ExitedAt != nil && s.now().Sub(*rec.ExitedAt) >= s.cfg.ExitTTL {
			if err := s.store.Evict(ctx, id); err != nil {
				s.log.Warn("evict session", "session", id, "err", err)
				continue
			}
			s.log.Info("evicted terminal session", "session", id)
		}
	}
}
