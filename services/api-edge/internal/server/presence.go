package server

import (
	"context"
	"sync"
	"time"

	"github.com/telorunner/telorunner/pkg/session"
)

// presence counts this edge's live SSE and io clients per session (13.2).
// Publishing the counts to runner_presence for the supervisor is done by
// the presence publisher; this type only keeps the local count.
type presence struct {
	mu     sync.Mutex
	counts map[string]int
	wake   chan struct{} // capacity 1: a change since the last publish
}

func (p *presence) changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wake == nil {
		p.wake = make(chan struct{}, 1)
	}
	return p.wake
}

func (p *presence) notifyLocked() {
	if p.wake == nil {
		p.wake = make(chan struct{}, 1)
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Acquire counts one client of session id and returns its release, which
// must be called exactly once.
func (p *presence) Acquire(id string) func() {
	p.mu.Lock()
	if p.counts == nil {
		p.counts = map[string]int{}
	}
	p.counts[id]++
	if p.counts[id] == 1 {
		p.notifyLocked()
	}
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if p.counts[id]--; p.counts[id] <= 0 {
				delete(p.counts, id)
				p.notifyLocked()
			}
			p.mu.Unlock()
		})
	}
}

// Snapshot returns a copy of the counts.
func (p *presence) Snapshot() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.counts))
	for k, v := range p.counts {
		out[k] = v
	}
	return out
}

// PublishPresence keeps runner_presence keys (<session>.<edge> → count)
// for every session with live clients on this edge, renewing them every
// period, and deletes a key when its count drops to zero. An edge that dies
// stops renewing and its keys expire by the bucket TTL.
func (s *Server) PublishPresence(ctx context.Context, store *session.Store, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	published := map[string]bool{}
	for {
		snap := s.presence.Snapshot()
		for id, n := range snap {
			if err := store.PutPresence(ctx, id, s.edgeID, n); err != nil && ctx.Err() == nil {
				s.log.Warn("publish presence", "session", id, "err", err)
			}
			published[id] = true
		}
		for id := range published {
			if _, live := snap[id]; !live {
				_ = store.DropPresence(ctx, id, s.edgeID)
				delete(published, id)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.presence.changed():
		}
	}
}
