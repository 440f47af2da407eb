package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// Ledger is the head of the admission ledger (runner_admission/ledger):
// everything admission decides on, in one value changed only with
// compare-and-set, so the ceilings hold exactly across any number of edge
// replicas. Its size does not grow with the retained sessions: it holds a
// count, the live watch sessions (bounded by the watch ceiling), the
// admissions and evictions in flight, and the reclaim cursors. Which
// retained session to reclaim first is read from the reclaim index
// (runner_admission/reclaim.<class>.<id>, see Store.Admit).
type Ledger struct {
	// Total counts the retained sessions: admitted and not yet evicted
	// (Pending included, Evicting until its record is gone).
	Total int `json:"total"`
	// Watch holds the live watch sessions (neither terminal nor
	// suspended), admitted ones whose record is not written yet included.
	Watch map[string]bool `json:"watch,omitempty"`
	// Pending holds the sessions admitted whose creation is not known to
	// have finished (Store.Admitted); one older than orphanGrace without a
	// record is the leftover of a crashed creation and is reclaimed.
	Pending map[string]Slot `json:"pending,omitempty"`
	// Evicting holds the evictions under way (Store.Evict); one whose
	// evictor died is driven again by a later Admit or eviction.
	Evicting map[string]Eviction `json:"evicting,omitempty"`
	// Cursors is, per reclaim class, the last stream sequence of the
	// reclaim index the ledger has consumed.
	Cursors map[string]uint64 `json:"cursors,omitempty"`
}

// Eviction is an eviction under way.
type Eviction struct {
	At time.Time `json:"at"`
	// Transferred: the slot went to the session whose admission chose this
	// victim, so finishing the eviction leaves Total as it is.
	Transferred bool `json:"transferred,omitempty"`
}

func (l *Ledger) init() {
	if l.Watch == nil {
		l.Watch = map[string]bool{}
	}
	if l.Pending == nil {
		l.Pending = map[string]Slot{}
	}
	if l.Evicting == nil {
		l.Evicting = map[string]Eviction{}
	}
	if l.Cursors == nil {
		l.Cursors = map[string]uint64{}
	}
}

// Slots is the first ledger format (runner_admission/slots, every
// retained session id in one value), read once to build the Ledger.
type Slots struct {
	IDs map[string]Slot `json:"ids"`
}

// Slot is one admitted session.
type Slot struct {
	Mode string    `json:"mode"`
	At   time.Time `json:"at"`
}

// UnmarshalJSON also reads the oldest slots format, where a slot was just
// the session's mode; such a slot has no admission time, so it is
// reclaimed at once if its record is gone.
func (s *Slot) UnmarshalJSON(b []byte) error {
	var mode string
	if json.Unmarshal(b, &mode) == nil {
		*s = Slot{Mode: mode}
		return nil
	}
	type plain Slot
	return json.Unmarshal(b, (*plain)(s))
}

// orphanGrace is how long an admission may stay pending (the record is
// written right after admission) or an eviction under way before it
// counts as the leftover of a process that died.
const orphanGrace = time.Minute

// Limits are the admission ceilings.
type Limits struct {
	MaxSessions      int // RUNNER_MAX_SESSIONS: every retained session
	MaxWatchSessions int // RUNNER_WATCH_MAX_SESSIONS: live watch sessions
}

// reclaimClass is the reclaim index class of a record and the time that
// orders it (5.4: terminal by exitedAt, suspended by idleSince).
func reclaimClass(r *Record) (class string, since time.Time, ok bool) {
	ok, since = r.Reclaimable()
	if !ok {
		return "", since, false
	}
	if r.Status.Terminal() {
		return bus.ReclaimEnded, since, true
	}
	return bus.ReclaimSuspended, since, true
}

// Admit reserves a slot for a new session, evicting the oldest reclaimable
// session (terminal by exitedAt, suspended by idleSince) when the registry
// is full. It answers a *contract.Error (409 too_many_sessions or
// too_many_watch_sessions) when nothing can be reclaimed. The caller
// writes the record next and then calls Admitted.
//
// Its cost does not depend on how many sessions are retained: one
// compare-and-set of the ledger head, and at capacity the first valid
// entry of each reclaim index class (entries the cursors pass over are
// consumed once, so a create reads O(1) entries amortized).
func (s *Store) Admit(ctx context.Context, id, mode string, lim Limits) error {
	var victim, redo string
	var orphans []string
	var refused error
	_, err := s.updateLedger(ctx, func(l *Ledger) error {
		victim, redo, orphans, refused = "", "", nil, nil
		l.init()
		now := s.now()
		for pid, slot := range l.Pending {
			if now.Sub(slot.At) < orphanGrace {
				continue
			}
			_, _, err := s.Get(ctx, pid)
			if err == nil {
				delete(l.Pending, pid) // its creator died after writing the record
				continue
			}
			if !errors.Is(err, ErrNotFound) {
				return err
			}
			// The leftover of a creation that crashed: its slot is free.
			delete(l.Pending, pid)
			delete(l.Watch, pid)
			l.Total = max(0, l.Total-1)
			orphans = append(orphans, pid)
		}
		for eid, e := range l.Evicting {
			if now.Sub(e.At) >= orphanGrace {
				redo = eid // its evictor died: finished after this CAS
				break
			}
		}
		cursors := fmt.Sprint(l.Cursors)
		switch {
		case mode == contract.ModeWatch && lim.MaxWatchSessions > 0 && len(l.Watch) >= lim.MaxWatchSessions:
			refused = contract.Errorf("too_many_watch_sessions", "runner is at its limit of %d live watch sessions", lim.MaxWatchSessions)
		case l.Total < lim.MaxSessions:
			l.Total++
		default:
			v, err := s.pickVictim(ctx, l)
			if err != nil {
				return err
			}
			if v == "" {
				refused = contract.Errorf("too_many_sessions", "runner is at its limit of %d sessions (RUNNER_MAX_SESSIONS) and none can be reclaimed", lim.MaxSessions)
				break
			}
			victim = v
			l.Evicting[v] = Eviction{At: now, Transferred: true}
			delete(l.Watch, v)
		}
		if refused != nil {
			if len(orphans) == 0 && fmt.Sprint(l.Cursors) == cursors {
				return refused // nothing learned worth writing
			}
			return nil // keep the reclaimed orphans and the consumed index entries
		}
		l.Pending[id] = Slot{Mode: mode, At: now}
		if mode == contract.ModeWatch {
			l.Watch[id] = true
		}
		return nil
	})
	if err == nil {
		err = refused
	}
	for _, o := range orphans {
		if perr := s.purge(ctx, o); perr != nil {
			err = errors.Join(err, fmt.Errorf("purge crashed creation %s: %w", o, perr))
		}
	}
	if err != nil {
		return err
	}
	if victim != "" {
		if err := s.Evict(ctx, victim); err != nil {
			return fmt.Errorf("evict %s: %w", victim, err)
		}
	}
	if redo != "" {
		// Best effort: the supervisor's eviction of it retries anyway.
		_ = s.Evict(ctx, redo)
	}
	return nil
}

// Admitted marks the admission of id complete: its record is written.
func (s *Store) Admitted(ctx context.Context, id string) error {
	_, err := s.updateLedger(ctx, func(l *Ledger) error {
		if _, ok := l.Pending[id]; !ok {
			return bus.ErrNoChange
		}
		delete(l.Pending, id)
		return nil
	})
	return err
}

// Unadmit gives back the slot Admit reserved for id when its record could
// not be written (the id was already in use): the creation did not happen.
func (s *Store) Unadmit(ctx context.Context, id string) error {
	_, err := s.updateLedger(ctx, func(l *Ledger) error {
		if _, ok := l.Pending[id]; !ok {
			return bus.ErrNoChange
		}
		delete(l.Pending, id)
		delete(l.Watch, id)
		l.Total = max(0, l.Total-1)
		return nil
	})
	return err
}

// AdmittedSoon is Admitted off the caller's path: the ids queued while an
// update is in flight are marked complete together, by one compare-and-set
// of the ledger's head, so a create does not wait for it. An id whose
// update never lands (the process died, the bus stayed away) stays
// pending until a later Admit finds its record and drops it (orphanGrace).
func (s *Store) AdmittedSoon(id string) {
	s.admitted.mu.Lock()
	defer s.admitted.mu.Unlock()
	s.admitted.ids = append(s.admitted.ids, id)
	if !s.admitted.running {
		s.admitted.running = true
		go s.flushAdmitted()
	}
}

// admittedQueue holds the ids AdmittedSoon has not marked yet.
type admittedQueue struct {
	mu      sync.Mutex
	ids     []string
	running bool // a flushAdmitted goroutine owns the queue
}

// flushAdmitted marks the queued ids admitted until the queue is empty.
func (s *Store) flushAdmitted() {
	q := &s.admitted
	for {
		q.mu.Lock()
		ids := q.ids
		q.ids = nil
		if len(ids) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		wait := 50 * time.Millisecond
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := s.updateLedger(ctx, func(l *Ledger) error {
				n := len(l.Pending)
				for _, id := range ids {
					delete(l.Pending, id)
				}
				if len(l.Pending) == n {
					return bus.ErrNoChange
				}
				return nil
			})
			cancel()
			if err == nil || attempt == 5 {
				break // given up: a later Admit drops them (orphanGrace)
			}
			time.Sleep(wait)
			wait *= 2
		}
	}
}

// pickVictim finds the oldest reclaimable session: the first valid entry
// of each reclaim class after its cursor, the older of the two. Entries
// passed over (deleted, evicted, no longer of their class) and the victim
// are consumed: l.Cursors moves past them. "" when nothing is reclaimable.
func (s *Store) pickVictim(ctx context.Context, l *Ledger) (string, error) {
	type candidate struct {
		id    string
		seq   uint64
		since time.Time
	}
	var best *candidate
	var bestClass string
	for _, class := range []string{bus.ReclaimEnded, bus.ReclaimSuspended} {
		cur := l.Cursors[class]
		var found *candidate
		for found == nil {
			m, err := s.admIndex.GetMsg(ctx, cur+1, jetstream.WithGetMsgSubject(bus.ReclaimSubjects(class)))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return "", fmt.Errorf("read reclaim index: %w", err)
			}
			vid := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			_, evicting := l.Evicting[vid]
			_, pending := l.Pending[vid]
			if m.Header.Get(kvOperation) == "" && !evicting && !pending {
				r, _, err := s.Get(ctx, vid)
				if err != nil && !errors.Is(err, ErrNotFound) {
					return "", err
				}
				if c, since, ok := reclaimClass(&r); err == nil && ok && c == class {
					found = &candidate{id: vid, seq: m.Sequence, since: since}
					break
				}
			}
			cur = m.Sequence // consumed: a re-entry lands after the cursor
		}
		if cur != l.Cursors[class] {
			l.Cursors[class] = cur
		}
		if found != nil && (best == nil || found.since.Before(best.since)) {
			best, bestClass = found, class
		}
	}
	if best == nil {
		return "", nil
	}
	l.Cursors[bestClass] = best.seq
	return best.id, nil
}

// kvOperation is the header of a key-value delete or purge marker.
const kvOperation = "KV-Operation"

// syncLedger brings the ledger in line with a session's record after a
// status change: a reclaimable session gets its reclaim index entry, and
// a watch session enters or leaves the live watch set. It reads the
// record again inside the ledger's compare-and-set, so a stale caller can
// never undo a newer change, and it is idempotent: SetStatus runs it after
// the transition and FlushStatus again for any transition whose writer
// died before its event was appended.
func (s *Store) syncLedger(ctx context.Context, id string, r Record) error {
	if class, since, ok := reclaimClass(&r); ok {
		if err := s.putReclaim(ctx, class, id, since); err != nil {
			return err
		}
	}
	if r.Mode != contract.ModeWatch {
		return nil
	}
	_, err := s.updateLedger(ctx, func(l *Ledger) error {
		cur, _, err := s.Get(ctx, id)
		live := false
		switch {
		case err == nil:
			live = cur.LiveWatch()
		case errors.Is(err, ErrNotFound):
			if _, ok := l.Pending[id]; ok {
				return bus.ErrNoChange // admitted, record not written yet
			}
		default:
			return err
		}
		if _, ok := l.Evicting[id]; ok {
			live = false
		}
		if l.Watch[id] == live {
			return bus.ErrNoChange
		}
		l.init()
		if live {
			l.Watch[id] = true
		} else {
			delete(l.Watch, id)
		}
		return nil
	})
	return err
}

// putReclaim makes id's index entry of class hold since, appending it at
// the index's end unless it already does.
func (s *Store) putReclaim(ctx context.Context, class, id string, since time.Time) error {
	key, val := bus.ReclaimKey(class, id), since.UTC().Format(time.RFC3339Nano)
	if e, err := s.admission.Get(ctx, key); err == nil && string(e.Value()) == val {
		return nil
	} else if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("read reclaim entry %s: %w", key, err)
	}
	if _, err := s.admission.PutString(ctx, key, val); err != nil {
		return fmt.Errorf("put reclaim entry %s: %w", key, err)
	}
	return nil
}

// Ledger reads the admission ledger's head (building it on first use).
func (s *Store) Ledger(ctx context.Context) (Ledger, error) {
	for {
		l, _, err := bus.GetJSON[Ledger](ctx, s.admission, bus.KeyAdmissionLedger)
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return l, err
		}
		if err := s.buildLedger(ctx); err != nil {
			return l, err
		}
	}
}

// updateLedger applies mutate to the ledger's head with compare-and-set.
// It first tries the head as this store last saw it (no read when no other
// process changed it since); a conflict, a refusal or "no change" decided
// on that copy is decided again on the head as it is.
func (s *Store) updateLedger(ctx context.Context, mutate func(*Ledger) error) (Ledger, error) {
	l, rev, seen := s.ledgerSeen.get()
	for {
		if !seen {
			e, err := s.admission.Get(ctx, bus.KeyAdmissionLedger)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				if err := s.buildLedger(ctx); err != nil {
					return Ledger{}, err
				}
				continue
			}
			if err != nil {
				return Ledger{}, err
			}
			l = Ledger{}
			if err := json.Unmarshal(e.Value(), &l); err != nil {
				return l, fmt.Errorf("decode %s: %w", bus.KeyAdmissionLedger, err)
			}
			rev = e.Revision()
			s.ledgerSeen.set(e.Value(), rev)
		}
		if err := mutate(&l); err != nil {
			if seen {
				seen = false // decided on an old copy: decide again
				continue
			}
			if errors.Is(err, bus.ErrNoChange) {
				return l, nil
			}
			return l, err
		}
		b, err := json.Marshal(l)
		if err != nil {
			return l, fmt.Errorf("encode %s: %w", bus.KeyAdmissionLedger, err)
		}
		next, err := s.admission.Update(ctx, bus.KeyAdmissionLedger, b, rev)
		if err == nil {
			s.ledgerSeen.set(b, next)
			return l, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !isWrongLastSeq(err) {
			return l, fmt.Errorf("update %s: %w", bus.KeyAdmissionLedger, err)
		}
		if err := ctx.Err(); err != nil {
			return l, err
		}
		seen = false
	}
}

// seenLedger is the ledger's head as a store last read or wrote it.
type seenLedger struct {
	mu  sync.Mutex
	raw []byte
	rev uint64
}

func (c *seenLedger) get() (Ledger, uint64, bool) {
	c.mu.Lock()
	raw, rev := c.raw, c.rev
	c.mu.Unlock()
	var l Ledger
	if rev == 0 || json.Unmarshal(raw, &l) != nil {
		return l, 0, false
	}
	return l, rev, true
}

func (c *seenLedger) set(raw []byte, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev > c.rev {
		c.raw, c.rev = raw, rev
	}
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// buildLedger creates the ledger's head, from the first ledger format when
// a store written by an older runner has one (its records are read once
// here: the count, the live watch set and the reclaim index in order).
func (s *Store) buildLedger(ctx context.Context) error {
	old, _, err := bus.GetJSON[Slots](ctx, s.admission, bus.KeyAdmissionSlots)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	var l Ledger
	l.init()
	type entry struct {
		class, id string
		since     time.Time
	}
	var reclaim []entry
	for id, slot := range old.IDs {
		l.Total++
		r, _, err := s.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			l.Pending[id] = slot // reclaimed as a crashed creation once past the grace
			continue
		}
		if err != nil {
			return err
		}
		if r.LiveWatch() {
			l.Watch[id] = true
		}
		if class, since, ok := reclaimClass(&r); ok {
			reclaim = append(reclaim, entry{class, id, since})
		}
	}
	slices.SortFunc(reclaim, func(a, b entry) int { return a.since.Compare(b.since) })
	for _, e := range reclaim {
		if err := s.putReclaim(ctx, e.class, e.id, e.since); err != nil {
			return err
		}
	}
	if _, err := bus.CreateJSON(ctx, s.admission, bus.KeyAdmissionLedger, l); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil // another process built it
		}
		return fmt.Errorf("create admission ledger: %w", err)
	}
	if old.IDs != nil {
		if err := s.admission.Purge(ctx, bus.KeyAdmissionSlots); err != nil {
			return fmt.Errorf("drop the first admission ledger: %w", err)
		}
	}
	return nil
}

// CountLiveWatch counts watch sessions that are neither terminal nor
// suspended (the pre-check of creation step 7).
func (s *Store) CountLiveWatch(ctx context.Context) (int, error) {
	l, err := s.Ledger(ctx)
	if err != nil {
		return 0, err
	}
	return len(l.Watch), nil
}
