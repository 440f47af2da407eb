package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Locks is the single-flight of image builds across drivers: one key per
// image ref in bus.BucketBuilds (bus.BuildKey), created if absent by the
// driver that builds, renewed while it builds, deleted when it is done.
// A driver that finds the key waits until it goes (deleted, or expired
// when its holder died: the bucket's TTL), then takes it and checks the
// registry again. Safe for concurrent use.
type Locks struct {
	KV    jetstream.KeyValue // bus.BucketBuilds
	Owner string             // the driver id written as the value
	// TTL is the bucket's TTL (0: bus.BuildLockTTL); the holder renews
	// every third of it.
	TTL time.Duration
	// Poll bounds a waiter's sleep between attempts (0: 1 s): an
	// expired key leaves no delete marker to watch.
	Poll   time.Duration
	Logger *slog.Logger
}

// OpenLocks opens bus.BucketBuilds (provisioned by bus.Provision).
func OpenLocks(ctx context.Context, js jetstream.JetStream, owner string, log *slog.Logger) (*Locks, error) {
	kv, err := js.KeyValue(ctx, bus.BucketBuilds)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bus.BucketBuilds, err)
	}
	return &Locks{KV: kv, Owner: owner, Logger: log}, nil
}

// Acquire returns once this caller holds ref's lock; release gives it
// back (idempotent). onWait is called once, before the first wait, when
// another holder has it. The lock is renewed until release or until ctx
// ends.
func (l *Locks) Acquire(ctx context.Context, ref string, onWait func()) (release func(), err error) {
	key := bus.BuildKey(ref)
	poll := l.Poll
	if poll <= 0 {
		poll = time.Second
	}
	waited := false
	for {
		rev, err := l.KV.Create(ctx, key, []byte(l.Owner))
		if err == nil {
			return l.hold(ctx, key, rev), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("build lock %s: %w", ref, err)
		}
		if !waited && onWait != nil {
			onWait()
		}
		waited = true
		if err := l.waitGone(ctx, key, poll); err != nil {
			return nil, err
		}
	}
}

// waitGone returns when key is deleted or purged, or after poll (the
// caller then tries again), or with ctx's error.
func (l *Locks) waitGone(ctx context.Context, key string, poll time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, poll)
	defer cancel()
	w, err := l.KV.Watch(wctx, key, jetstream.UpdatesOnly())
	if err != nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wctx.Done():
			return nil
		}
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				return nil
			}
		}
	}
}

// hold renews key (revision rev) every third of the TTL until release.
func (l *Locks) hold(ctx context.Context, key string, rev uint64) func() {
	ttl := l.TTL
	if ttl <= 0 {
		ttl = bus.BuildLockTTL
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan uint64, 1)
	go func() {
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				done <- rev
				return
			case <-ctx.Done():
				done <- rev
				return
			case <-t.C:
				next, err := l.KV.Update(hctx, key, []byte(l.Owner), rev)
				if err != nil {
					if l.Logger != nil && hctx.Err() == nil {
						l.Logger.Warn("renew build lock", "key", key, "err", err)
					}
					continue
				}
				rev = next
			}
		}
	}()
	released := false
	return func() {
		if released {
			return
		}
		released = true
		cancel()
		last := <-done
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		if err := l.KV.Delete(dctx, key, jetstream.LastRevision(last)); err != nil && l.Logger != nil {
			l.Logger.Warn("release build lock", "key", key, "err", err)
		}
	}
}
