package session

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Owner keys (bus.BucketOwners, expiring by the bucket's TTL): a session's
// key names the driver that owns it, bus.KeyLeader the active supervisor.
// A key is held by its revision: only the holder of the current revision
// renews or releases it, so two claimants never both win.

// ClaimOwner creates key for holder and returns its revision;
// jetstream.ErrKeyExists when someone holds it.
func (s *Store) ClaimOwner(ctx context.Context, key, holder string) (uint64, error) {
	return s.owners.Create(ctx, key, []byte(holder))
}

// RenewOwner writes holder to key if key is still at rev (a renewal, or a
// takeover of the revision read with Owner) and returns the new revision.
func (s *Store) RenewOwner(ctx context.Context, key, holder string, rev uint64) (uint64, error) {
	return s.owners.Update(ctx, key, []byte(holder), rev)
}

// ReleaseOwner deletes key if it is still at rev.
func (s *Store) ReleaseOwner(ctx context.Context, key string, rev uint64) error {
	return s.owners.Delete(ctx, key, jetstream.LastRevision(rev))
}

// Owner returns who holds key and at which revision;
// jetstream.ErrKeyNotFound when nobody does.
func (s *Store) Owner(ctx context.Context, key string) (holder string, rev uint64, err error) {
	e, err := s.owners.Get(ctx, key)
	if err != nil {
		return "", 0, err
	}
	return string(e.Value()), e.Revision(), nil
}

// OwnerKeys lists the held owner keys: session ids and bus.KeyLeader.
func (s *Store) OwnerKeys(ctx context.Context) ([]string, error) {
	return listKeys(ctx, s.owners)
}

// SessionIDs lists the ids of every record in the registry.
func (s *Store) SessionIDs(ctx context.Context) ([]string, error) {
	return listKeys(ctx, s.sessions)
}

func listKeys(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	l, err := kv.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// Presence keys (bus.BucketPresence, expiring by the bucket's TTL): each
// edge's count of live clients of a session.

// PutPresence records n live clients of session id on edge edgeID.
func (s *Store) PutPresence(ctx context.Context, id, edgeID string, n int) error {
	_, err := s.presence.Put(ctx, bus.PresenceKey(id, edgeID), []byte(strconv.Itoa(n)))
	return err
}

// DropPresence deletes edge edgeID's presence key of session id.
func (s *Store) DropPresence(ctx context.Context, id, edgeID string) error {
	return s.presence.Delete(ctx, bus.PresenceKey(id, edgeID))
}

// Present reports whether any edge holds a presence key of session id.
func (s *Store) Present(ctx context.Context, id string) (bool, error) {
	l, err := s.presence.ListKeysFiltered(ctx, id+".*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return false, nil
		}
		return false, err
	}
	found := false
	for range l.Keys() {
		found = true
	}
	return found, nil
}

// Commands (bus.StreamCmd, pulled by the drivers' consumer).

// RequestStart queues the start command of session id; attempt names
// the start (bus.StartAttempt), so a retried publish is de-duplicated.
func (s *Store) RequestStart(ctx context.Context, id, attempt string) error {
	return bus.PublishCommand(ctx, s.js, bus.CmdStart, id, attempt)
}

// RequestAdopt asks the drivers to take over session id (its owner key
// expired); attempt names the adoption (bus.AdoptAttempt).
func (s *Store) RequestAdopt(ctx context.Context, id, attempt string) error {
	return bus.PublishCommand(ctx, s.js, bus.CmdAdopt, id, attempt)
}

// DriverConsumer binds the drivers' durable consumer of the command
// stream (bus.ConsumerDrivers).
func (s *Store) DriverConsumer(ctx context.Context) (jetstream.Consumer, error) {
	return s.js.Consumer(ctx, bus.StreamCmd, bus.ConsumerDrivers)
}

// Events is the event log (bus.StreamEvents) the store appends to.
func (s *Store) Events() *bus.Log { return s.events }

// IO is the io log (bus.StreamIO).
func (s *Store) IO() *bus.Log { return s.ioLog }

// Checkpoints is the checkpoint bucket (bus.BucketCheckpoints), whose
// format pkg/checkpoint owns.
func (s *Store) Checkpoints() jetstream.KeyValue { return s.checkpoints }

// JetStream is the handle the store was opened on, for a package that binds
// buckets of its own beside the registry (pkg/checkpoint's blob store).
func (s *Store) JetStream() jetstream.JetStream { return s.js }

// Now is the store's clock (time.Now unless SetClock changed it).
func (s *Store) Now() time.Time { return s.now() }

// SetClock replaces the store's clock (tests). Not safe while the store is
// in use by other goroutines.
func (s *Store) SetClock(now func() time.Time) { s.now = now }
