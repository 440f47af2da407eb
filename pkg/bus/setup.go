package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Limits are the retention settings of the bus. Zero fields take defaults.
type Limits struct {
	// Replicas of every stream, bucket and object store (1 embedded, 3 in
	// production).
	Replicas int
	// ReplayBytes is the byte budget of one session's event log and of one
	// app channel's io log (RUNNER_REPLAY_BUFFER_BYTES). Enforced by Log.
	ReplayBytes int64
	// MaxAge is the safety-net age of event and io messages; it must be
	// longer than any session can live (sessions are purged explicitly).
	MaxAge time.Duration
	// MaxMsgsPerSubject is the backstop message count per log subject.
	MaxMsgsPerSubject int64
	// OwnerTTL is how long an owner key lives without renewal.
	OwnerTTL time.Duration
	// PresenceTTL is how long a presence key lives without renewal.
	PresenceTTL time.Duration
}

// Defaults fills the zero fields of l.
func (l Limits) Defaults() Limits {
	if l.Replicas <= 0 {
		l.Replicas = 1
	}
	if l.ReplayBytes <= 0 {
		l.ReplayBytes = 5_000_000
	}
	if l.MaxAge <= 0 {
		l.MaxAge = 30 * 24 * time.Hour
	}
	if l.MaxMsgsPerSubject <= 0 {
		l.MaxMsgsPerSubject = 1_000_000
	}
	if l.OwnerTTL <= 0 {
		l.OwnerTTL = 15 * time.Second
	}
	if l.PresenceTTL <= 0 {
		l.PresenceTTL = 15 * time.Second
	}
	return l
}

// StreamConfigs returns the configuration of every stream.
func StreamConfigs(l Limits) []jetstream.StreamConfig {
	l = l.Defaults()
	return []jetstream.StreamConfig{
		{
			Name:              StreamEvents,
			Subjects:          []string{SubjectEventsPrefix + "*"},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          l.Replicas,
			MaxAge:            l.MaxAge,
			MaxMsgsPerSubject: l.MaxMsgsPerSubject,
			Duplicates:        2 * time.Minute,
			AllowDirect:       true,
			// A driver appends the events queued for a session as one
			// atomic batch (Log.AppendBatch).
			AllowAtomicPublish: true,
		},
		{
			Name:              StreamIO,
			Subjects:          []string{SubjectIOPrefix + "*.*"},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          l.Replicas,
			MaxAge:            l.MaxAge,
			MaxMsgsPerSubject: l.MaxMsgsPerSubject,
			Duplicates:        2 * time.Minute,
			AllowDirect:       true,
		},
		{
			Name:       StreamCmd,
			Subjects:   []string{SubjectCmdAll},
			Retention:  jetstream.WorkQueuePolicy,
			Storage:    jetstream.FileStorage,
			Replicas:   l.Replicas,
			Duplicates: 2 * time.Minute,
			// The supervisor looks for a queued start of a session with a
			// direct get of its subject (runner.cmd.start.<id>).
			AllowDirect: true,
		},
	}
}

// BucketConfigs returns the configuration of every key-value bucket.
func BucketConfigs(l Limits) []jetstream.KeyValueConfig {
	l = l.Defaults()
	return []jetstream.KeyValueConfig{
		{Bucket: BucketSessions, History: 1, Storage: jetstream.FileStorage, Replicas: l.Replicas},
		{Bucket: BucketOwners, History: 1, TTL: l.OwnerTTL, Storage: jetstream.FileStorage, Replicas: l.Replicas},
		{Bucket: BucketPresence, History: 1, TTL: l.PresenceTTL, Storage: jetstream.FileStorage, Replicas: l.Replicas},
		{Bucket: BucketAdmission, History: 1, Storage: jetstream.FileStorage, Replicas: l.Replicas},
		{Bucket: BucketCheckpoints, History: 1, Storage: jetstream.FileStorage, Replicas: l.Replicas},
		{Bucket: BucketBuilds, History: 1, TTL: BuildLockTTL, Storage: jetstream.FileStorage, Replicas: l.Replicas},
		{Bucket: BucketBundles, History: 1, Storage: jetstream.FileStorage, Replicas: l.Replicas},
	}
}

// ObjectConfigs returns the configuration of every object store.
func ObjectConfigs(l Limits) []jetstream.ObjectStoreConfig {
	l = l.Defaults()
	return []jetstream.ObjectStoreConfig{
		{Bucket: ObjectBundles, Storage: jetstream.FileStorage, Replicas: l.Replicas},
		{Bucket: ObjectBlobs, Storage: jetstream.FileStorage, Replicas: l.Replicas},
	}
}

// Provision creates every stream, bucket, object store and the drivers'
// consumer. It is idempotent: an existing item with the same configuration
// is left alone, one with different limits is updated in place, and nothing
// is ever deleted or recreated.
func Provision(ctx context.Context, js jetstream.JetStream, l Limits) error {
	for _, cfg := range StreamConfigs(l) {
		if err := provisionStep(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateStream(ctx, cfg)
			return err
		}); err != nil {
			return fmt.Errorf("provision stream %s: %w", cfg.Name, err)
		}
	}
	for _, cfg := range BucketConfigs(l) {
		if err := provisionStep(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateKeyValue(ctx, cfg)
			return err
		}); err != nil {
			return fmt.Errorf("provision bucket %s: %w", cfg.Bucket, err)
		}
	}
	for _, cfg := range ObjectConfigs(l) {
		if err := provisionStep(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateObjectStore(ctx, cfg)
			return err
		}); err != nil {
			return fmt.Errorf("provision object store %s: %w", cfg.Bucket, err)
		}
	}
	if err := provisionStep(ctx, func(ctx context.Context) error {
		_, err := js.CreateOrUpdateConsumer(ctx, StreamCmd, DriversConsumerConfig())
		return err
	}); err != nil {
		return fmt.Errorf("provision consumer %s: %w", ConsumerDrivers, err)
	}
	return nil
}

// provisionAttempt bounds one create-or-update request. A cluster creates a
// stream in a few seconds; an answer that never comes (seen once on a
// fresh three-node cluster: the stream was created, its answer lost) is
// asked again — create-or-update of an item that exists with the same
// configuration is a no-op — until ctx ends.
const provisionAttempt = 10 * time.Second

func provisionStep(ctx context.Context, fn func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, provisionAttempt)
		err := fn(actx)
		cancel()
		if err == nil || !Transient(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// DriversConsumerConfig is the durable pull consumer all drivers share.
func DriversConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerDrivers,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		FilterSubject: SubjectCmdAll,
	}
}

// WaitProvisioned waits until the bus is provisioned — the drivers'
// consumer, which Provision creates last, exists — and then until each of
// opens (the service binding its buckets and streams) succeeds, polling
// until ctx ends or wait passes. Services call it at start instead of
// provisioning: only the provisioner role may create streams (the
// all-in-one provisions at boot; a standalone install runs `telorunner
// provision` first). A cluster that is still electing its stream leaders
// (every node restarted at once) answers the first requests with timeouts;
// those are retried here, not returned, so a service waits for its bus
// rather than exiting.
func WaitProvisioned(ctx context.Context, js jetstream.JetStream, log *slog.Logger, wait time.Duration, opens ...func(context.Context) error) error {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	attempt := func() (string, error) {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		defer acancel()
		if _, err := js.Consumer(actx, StreamCmd, ConsumerDrivers); err != nil {
			return "provisioned", err
		}
		for _, open := range opens {
			if err := open(actx); err != nil {
				return "bound", err
			}
		}
		return "", nil
	}
	var last error
	var stage string
	for logged := false; ; {
		if stage, last = attempt(); last == nil {
			return nil
		}
		if !logged {
			if stage == "provisioned" {
				log.Warn("bus not provisioned yet: waiting (run `telorunner provision` with the provisioner credential)", "err", last)
			} else {
				log.Warn("bus not answering yet: waiting", "err", last)
			}
			logged = true
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			if stage != "provisioned" {
				return fmt.Errorf("bus not answering within %v: %w", wait, last)
			}
			if errors.Is(last, context.DeadlineExceeded) {
				last = fmt.Errorf("%w (no answer: is this role allowed %s?)", last, "$JS.API.CONSUMER.INFO."+StreamCmd+"."+ConsumerDrivers)
			}
			return fmt.Errorf("bus not provisioned (stream %s, consumer %s; run `telorunner provision`): %w", StreamCmd, ConsumerDrivers, last)
		case <-t.C:
		}
	}
}
