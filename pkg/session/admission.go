package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// Slots is the admission ledger: every retained session id, its mode and
// when it was admitted. It is changed only with compare-and-set, so the
// ceilings hold exactly across any number of edge replicas.
type Slots struct {
	IDs map[string]Slot `json:"ids"`
}

// Slot is one admitted session.
type Slot struct {
	Mode string    `json:"mode"`
	At   time.Time `json:"at"`
}

// UnmarshalJSON also reads the first ledger format, where a slot was just
// the session's mode; such a slot has no admission time, so it is
// reclaimed at once if its record is gone. A store written by an older
// runner then keeps working instead of failing every creation.
func (s *Slot) UnmarshalJSON(b []byte) error {
	var mode string
	if json.Unmarshal(b, &mode) == nil {
		*s = Slot{Mode: mode}
		return nil
	}
	type plain Slot
	return json.Unmarshal(b, (*plain)(s))
}

// orphanGrace is how long a slot may exist without its record (the record
// is written right after admission) before it counts as the leftover of a
// creation that crashed and is reclaimed.
const orphanGrace = time.Minute

// Limits are the admission ceilings.
type Limits struct {
	MaxSessions      int // RUNNER_MAX_SESSIONS: every retained session
	MaxWatchSessions int // RUNNER_WATCH_MAX_SESSIONS: live watch sessions
}

// Admit reserves a slot for a new session, evicting the oldest reclaimable
// session (terminal by exitedAt, suspended by idleSince) when the registry
// is full. It answers a *contract.Error (409 too_many_sessions or
// too_many_watch_sessions) when nothing can be reclaimed.
func (s *Store) Admit(ctx context.Context, id, mode string, lim Limits) error {
	var victim string
	_, _, err := bus.UpdateJSON(ctx, s.Admission, bus.KeyAdmissionSlots, true, func(sl *Slots) error {
		victim = ""
		if sl.IDs == nil {
			sl.IDs = map[string]Slot{}
		}
		now := s.Now()
		var oldest time.Time
		liveWatch := 0
		for other, slot := range sl.IDs {
			r, _, err := s.Get(ctx, other)
			if errors.Is(err, ErrNotFound) {
				if now.Sub(slot.At) < orphanGrace {
					continue // being created right now: live
				}
				// The leftover of a creation that crashed: reclaimed first.
				victim, oldest = other, time.Time{}
				continue
			}
			if err != nil {
				return err
			}
			if r.LiveWatch() {
				liveWatch++
			}
			if ok, at := r.Reclaimable(); ok && (victim == "" || at.Before(oldest)) {
				victim, oldest = other, at
			}
		}
		if mode == contract.ModeWatch && lim.MaxWatchSessions > 0 && liveWatch >= lim.MaxWatchSessions {
			return contract.Errorf("too_many_watch_sessions", "runner is at its limit of %d live watch sessions", lim.MaxWatchSessions)
		}
		if len(sl.IDs) < lim.MaxSessions {
			victim = ""
		} else if victim == "" {
			return contract.Errorf("too_many_sessions", "runner is at its limit of %d sessions (RUNNER_MAX_SESSIONS) and none can be reclaimed", lim.MaxSessions)
		} else {
			delete(sl.IDs, victim)
		}
		sl.IDs[id] = Slot{Mode: mode, At: now}
		return nil
	})
	if err != nil {
		return err
	}
	if victim != "" {
		if err := s.Evict(ctx, victim); err != nil {
			return fmt.Errorf("evict %s: %w", victim, err)
		}
	}
	return nil
}

// CountLiveWatch counts watch sessions that are neither terminal nor
// suspended (the pre-check of creation step 7).
func (s *Store) CountLiveWatch(ctx context.Context) (int, error) {
	sl, _, err := bus.GetJSON[Slots](ctx, s.Admission, bus.KeyAdmissionSlots)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil // no ledger yet: nothing admitted
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for id, slot := range sl.IDs {
		if slot.Mode != contract.ModeWatch {
			continue
		}
		if r, _, err := s.Get(ctx, id); err == nil && r.LiveWatch() {
			n++
		}
	}
	return n, nil
}
