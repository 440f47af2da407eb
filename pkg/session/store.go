package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// ErrNotFound is returned for a session that is not in the registry.
var ErrNotFound = errors.New("session not found")

// ErrTerminal is returned by SetStatus when the session already ended.
var ErrTerminal = errors.New("session already terminal")

// Store is the registry over the bus. Safe for concurrent use.
type Store struct {
	js          jetstream.JetStream
	sessions    jetstream.KeyValue
	owners      jetstream.KeyValue
	presence    jetstream.KeyValue
	admission   jetstream.KeyValue
	checkpoints jetstream.KeyValue
	bundlesKV   jetstream.KeyValue    // bundles of at most bus.BundleKVMax bytes
	bundles     jetstream.ObjectStore // larger bundles, and those stored before bundlesKV
	events      *bus.Log
	ioLog       *bus.Log
	now         func() time.Time

	// admIndex is the stream behind Admission, read by subject for the
	// reclaim index (Admit).
	admIndex jetstream.Stream
	// ledgerSeen is the admission ledger's head as this store last saw it.
	ledgerSeen seenLedger
	// admitted queues AdmittedSoon's ids.
	admitted admittedQueue

	// afterStatusCAS, when set (tests), runs between a status transition
	// and the append of its event; an error ends SetStatus there, as a
	// writer dying at that point would.
	afterStatusCAS func() error
}

// Open binds a Store to provisioned buckets; replayBytes is the byte
// window of each event log and each io channel.
func Open(ctx context.Context, js jetstream.JetStream, replayBytes int64) (*Store, error) {
	s := &Store{js: js, now: time.Now,
		events: bus.NewLog(js, bus.StreamEvents, replayBytes),
		ioLog:  bus.NewLog(js, bus.StreamIO, replayBytes),
	}
	var err error
	for _, b := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{
		{bus.BucketSessions, &s.sessions}, {bus.BucketOwners, &s.owners}, {bus.BucketPresence, &s.presence},
		{bus.BucketAdmission, &s.admission}, {bus.BucketCheckpoints, &s.checkpoints},
		{bus.BucketBundles, &s.bundlesKV},
	} {
		if *b.kv, err = js.KeyValue(ctx, b.name); err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", b.name, err)
		}
	}
	if s.bundles, err = js.ObjectStore(ctx, bus.ObjectBundles); err != nil {
		return nil, fmt.Errorf("open object store %s: %w", bus.ObjectBundles, err)
	}
	if s.admIndex, err = js.Stream(ctx, "KV_"+bus.BucketAdmission); err != nil {
		return nil, fmt.Errorf("open the stream of bucket %s: %w", bus.BucketAdmission, err)
	}
	return s, nil
}

// Get reads a session record.
func (s *Store) Get(ctx context.Context, id string) (Record, uint64, error) {
	if !contract.ValidSessionID(id) {
		return Record{}, 0, ErrNotFound
	}
	r, rev, err := bus.GetJSON[Record](ctx, s.sessions, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, 0, ErrNotFound
	}
	return r, rev, err
}

// Create stores a new record (the id must be free).
func (s *Store) Create(ctx context.Context, r Record) error {
	_, err := bus.CreateJSON(ctx, s.sessions, r.ID, r)
	return err
}

// Update applies mutate to the record with compare-and-set. An id that is
// not a session id's shape names no record (ErrNotFound), as in Get: ids
// from requests become key-value keys and NATS subjects, where `*`, `>`
// and `.` mean something.
func (s *Store) Update(ctx context.Context, id string, mutate func(*Record) error) (Record, error) {
	if !contract.ValidSessionID(id) {
		return Record{}, ErrNotFound
	}
	r, _, err := bus.UpdateJSON(ctx, s.sessions, id, false, mutate)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, ErrNotFound
	}
	return r, err
}

// Emit appends an event to the session's event log and returns its id.
func (s *Store) Emit(ctx context.Context, id string, ev contract.Event) (uint64, error) {
	return s.emit(ctx, id, ev, "")
}

// EmitBatch appends evs, in order, to the session's event log in one
// round trip (bus.Log.AppendBatch: all or none).
func (s *Store) EmitBatch(ctx context.Context, id string, evs []contract.Event) error {
	if len(evs) == 1 {
		_, err := s.Emit(ctx, id, evs[0])
		return err
	}
	datas := make([][]byte, len(evs))
	hdrs := make([]nats.Header, len(evs))
	for i, ev := range evs {
		b, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		datas[i], hdrs[i] = b, eventHeader(ev)
	}
	_, err := s.events.AppendBatch(ctx, bus.EventsSubject(id), datas, hdrs)
	return err
}

// eventHeader is the header of ev's log entry.
func eventHeader(ev contract.Event) nats.Header {
	hdr := nats.Header{}
	hdr.Set(bus.HeaderType, ev.Type)
	if ev.Status != nil && ev.Status.Terminal() {
		hdr.Set(bus.HeaderTerminal, "1")
	}
	return hdr
}

// emit appends ev under msgID (its idempotency key; "" draws one).
func (s *Store) emit(ctx context.Context, id string, ev contract.Event, msgID string) (uint64, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return 0, fmt.Errorf("encode event: %w", err)
	}
	hdr := eventHeader(ev)
	if msgID != "" {
		hdr.Set(jetstream.MsgIDHeader, msgID)
	}
	return s.events.Append(ctx, bus.EventsSubject(id), b, hdr)
}

// SetStatus records a status transition and emits its status event. A
// terminal session never changes again (ErrTerminal). mutate, when given,
// checks and changes other fields in the same compare-and-set; an error
// from it aborts the transition.
//
// The transition and its event cannot be separated: the compare-and-set
// also queues the event in the record's outbox; the admission ledger is
// brought in line with the record (syncLedger), then the event is appended
// from the outbox (then the outbox entry is dropped). A writer that dies
// between these steps leaves the event in the outbox, where the next
// SetStatus of the session or the supervisor's FlushStatus syncs the
// ledger and appends it, in transition order and exactly once (see
// FlushStatus). An error after the compare-and-set means the transition is
// recorded and its ledger sync and event pending.
func (s *Store) SetStatus(ctx context.Context, id string, st contract.Status, mutate func(*Record) error) (Record, error) {
	after, err := s.events.Position(ctx, bus.EventsSubject(id))
	if err != nil {
		return Record{}, err
	}
	p := PendingStatus{ID: "status-" + id + "-" + nuid.Next(), After: after, At: s.now().UTC(), Status: st}
	r, err := s.Update(ctx, id, func(r *Record) error {
		if r.Status.Terminal() {
			return ErrTerminal
		}
		// mutate sees the status being left.
		if mutate != nil {
			if err := mutate(r); err != nil {
				return err
			}
		}
		r.Status = st
		if st.Terminal() {
			now := s.now().UTC()
			r.ExitedAt = &now
		}
		r.Outbox = append(r.Outbox, p)
		return nil
	})
	if err != nil {
		return r, err
	}
	if s.afterStatusCAS != nil {
		if err := s.afterStatusCAS(); err != nil {
			return r, err
		}
	}
	if err := s.syncLedger(ctx, id, r); err != nil {
		return r, err
	}
	// Only this call can have appended its own event, so it needs no
	// lookup; entries other writers left are looked up first.
	if err := s.deliver(ctx, id, r.Outbox, p.ID); err != nil {
		return r, err
	}
	r.Outbox = nil
	return r, nil
}

// FlushStatus appends the status events a session's outbox still holds
// (their writer died between the transition and the append, or the append
// failed), in order, each exactly once: an entry whose event is found in
// the log after the position the outbox recorded is not appended again,
// and concurrent flushers use the entry's id as Nats-Msg-Id, which
// JetStream de-duplicates. The admission ledger is synced first (a sync
// applies the record as it is now, so a repeated one changes nothing). A
// missing session is not an error.
func (s *Store) FlushStatus(ctx context.Context, id string) error {
	r, _, err := s.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(r.Outbox) > 0 {
		if err := s.syncLedger(ctx, id, r); err != nil {
			return err
		}
	}
	return s.deliver(ctx, id, r.Outbox, "")
}

// deliver appends the outbox entries pending (looking each up first but
// fresh, this caller's own new entry) and drops them from the record.
func (s *Store) deliver(ctx context.Context, id string, pending []PendingStatus, fresh string) error {
	if len(pending) == 0 {
		return nil
	}
	subject := bus.EventsSubject(id)
	done := map[string]bool{}
	var failed error
	for _, p := range pending {
		if p.ID != fresh {
			landed, err := s.events.Has(ctx, subject, p.ID, p.After)
			if err != nil {
				failed = err
				break
			}
			if landed {
				done[p.ID] = true
				continue
			}
		}
		if _, err := s.emit(ctx, id, contract.StatusEvent(p.Status), p.ID); err != nil {
			failed = err
			break
		}
		done[p.ID] = true
	}
	if len(done) > 0 {
		if _, err := s.Update(ctx, id, func(r *Record) error {
			kept := r.Outbox[:0]
			for _, p := range r.Outbox {
				if !done[p.ID] {
					kept = append(kept, p)
				}
			}
			if len(kept) == len(r.Outbox) {
				return bus.ErrNoChange
			}
			r.Outbox = kept
			if len(r.Outbox) == 0 {
				r.Outbox = nil
			}
			return nil
		}); err != nil && !errors.Is(err, ErrNotFound) && failed == nil {
			failed = err
		}
	}
	if failed != nil {
		return fmt.Errorf("deliver status events of %s: %w", id, failed)
	}
	if pending[len(pending)-1].Status.Terminal() {
		s.Release(id) // nothing follows the terminal status
	}
	return nil
}

// Release drops what this process caches about session id's logs (the
// tails of its event subject and io subjects), once it has nothing more to
// write there: the terminal status is in the log, or the edge appended its
// creation notices. Whatever is needed later is read from JetStream again.
// Kept, each retained session would cost every service that ever wrote to
// it a tail and its replay window's index, until eviction (issue 20).
func (s *Store) Release(id string) {
	s.events.Forget(bus.EventsSubject(id))
	s.ioLog.ForgetAll(bus.IOSubjects(id))
}

// PutBundle stores (or replaces) a session's bundle: one key-value put
// when it is at most bus.BundleKVMax bytes encoded, the object store
// otherwise.
func (s *Store) PutBundle(ctx context.Context, id string, b contract.Bundle) error {
	data, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("encode bundle: %w", err)
	}
	if len(data) <= bus.BundleKVMax {
		if _, err := s.bundlesKV.Put(ctx, id, data); err != nil {
			return fmt.Errorf("put bundle %s: %w", id, err)
		}
		return nil
	}
	if err := s.putBundleObject(ctx, id, data); err != nil {
		return err
	}
	// A smaller bundle stored before would be read first.
	if err := s.bundlesKV.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("put bundle %s: drop the smaller one: %w", id, err)
	}
	return nil
}

func (s *Store) putBundleObject(ctx context.Context, id string, data []byte) error {
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	if _, err := s.bundles.PutBytes(ctx, id, data); err != nil {
		return fmt.Errorf("put bundle %s: %w", id, err)
	}
	return nil
}

// CreateWithBundle stores a new record (the id must be free, as in Create)
// and its bundle. A bundle of at most bus.BundleKVMax bytes is written
// create-only at the same time as the record, so both take one round
// trip; a larger one goes to the object store after the record.
//
// The record's create is what proves the id ours, so the bundle is
// settled by its outcome:
//   - the record exists already (an id collision, ErrKeyExists): a bundle
//     this call wrote is withdrawn, by revision, so a bundle someone else
//     wrote meanwhile stays;
//   - the record is new but a bundle was there: it is stale (a creation
//     that lost this id, or died after its bundle and before its record)
//     and is replaced.
//
// A creation that dies between the two writes leaves a record without a
// bundle (its start fails), never another session's bundle overwritten.
func (s *Store) CreateWithBundle(ctx context.Context, r Record, b contract.Bundle) error {
	data, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("encode bundle: %w", err)
	}
	if len(data) > bus.BundleKVMax {
		if err := s.Create(ctx, r); err != nil {
			return err
		}
		return s.putBundleObject(ctx, r.ID, data)
	}
	var (
		rev  uint64
		berr error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		rev, berr = s.bundlesKV.Create(ctx, r.ID, data)
	}()
	err = s.Create(ctx, r)
	<-done
	switch {
	case err != nil && berr == nil:
		if derr := s.bundlesKV.Delete(ctx, r.ID, jetstream.LastRevision(rev)); derr != nil && !wrongLastSequence(derr) {
			return errors.Join(err, fmt.Errorf("withdraw bundle %s: %w", r.ID, derr))
		}
		return err
	case err != nil:
		return err
	case errors.Is(berr, jetstream.ErrKeyExists):
		if _, err := s.bundlesKV.Put(ctx, r.ID, data); err != nil {
			return fmt.Errorf("put bundle %s: %w", r.ID, err)
		}
		return nil
	case berr != nil:
		return fmt.Errorf("put bundle %s: %w", r.ID, berr)
	}
	return nil
}

// wrongLastSequence reports a write refused because the subject's last
// revision moved on (a conditional delete that lost a race).
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// GetBundle reads a session's bundle: from the key-value bucket, else the
// object store (large bundles, and bundles stored before the bucket).
func (s *Store) GetBundle(ctx context.Context, id string) (contract.Bundle, error) {
	var b contract.Bundle
	data, err := s.getBundleBytes(ctx, id)
	if err != nil {
		return b, err
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return b, fmt.Errorf("decode bundle %s: %w", id, err)
	}
	return b, nil
}

func (s *Store) getBundleBytes(ctx context.Context, id string) ([]byte, error) {
	e, err := s.bundlesKV.Get(ctx, id)
	if err == nil {
		return e.Value(), nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("get bundle %s: %w", id, err)
	}
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	data, err := s.bundles.GetBytes(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("get bundle %s: %w", id, err)
	}
	return data, nil
}

// Evict removes every trace of a session: event and io subjects, bundle,
// checkpoint, owner and reclaim index keys, then the record, and frees its
// admission slot. It runs in three steps, each safe to repeat: the ledger
// records the eviction as under way (only while the record exists, so a
// finished eviction is never counted twice), the traces go with the record
// last, then the ledger drops the eviction and the slot. An eviction that
// fails part-way leaves the record in place and is finished by whoever
// evicts next.
func (s *Store) Evict(ctx context.Context, id string) error {
	if _, err := s.updateLedger(ctx, func(l *Ledger) error {
		if _, ok := l.Evicting[id]; ok {
			return bus.ErrNoChange
		}
		if _, _, err := s.Get(ctx, id); err != nil {
			if errors.Is(err, ErrNotFound) {
				return bus.ErrNoChange // evicted already
			}
			return err
		}
		l.init()
		l.Evicting[id] = Eviction{At: s.now()}
		delete(l.Watch, id)
		delete(l.Pending, id)
		return nil
	}); err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	if err := s.purge(ctx, id); err != nil {
		return err
	}
	_, err := s.updateLedger(ctx, func(l *Ledger) error {
		e, ok := l.Evicting[id]
		if !ok {
			return bus.ErrNoChange
		}
		if _, _, err := s.Get(ctx, id); err == nil {
			return bus.ErrNoChange // not gone: left to the next evictor
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
		delete(l.Evicting, id)
		if !e.Transferred {
			l.Total = max(0, l.Total-1)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("evict %s: %w", id, err)
	}
	return nil
}

// purge removes every trace of a session, the record last.
func (s *Store) purge(ctx context.Context, id string) error {
	var errs []error
	if err := s.events.Purge(ctx, bus.EventsSubject(id)); err != nil {
		errs = append(errs, err)
	}
	if err := s.ioLog.Purge(ctx, bus.IOSubjects(id)); err != nil {
		errs = append(errs, err)
	}
	if err := s.bundles.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		errs = append(errs, err)
	}
	if err := s.bundlesKV.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		errs = append(errs, err)
	}
	if err := bus.PurgeFamily(ctx, s.checkpoints, id); err != nil { // with its history slots
		errs = append(errs, err)
	}
	if err := s.owners.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		errs = append(errs, err)
	}
	// Reclaim index entries: only those that exist (a purge of a missing
	// key would still leave a marker for the cursors to pass over).
	for _, class := range []string{bus.ReclaimEnded, bus.ReclaimSuspended} {
		key := bus.ReclaimKey(class, id)
		if _, err := s.admission.Get(ctx, key); errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err := s.admission.Purge(ctx, key); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := s.sessions.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}
