package driver

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/iopump"
)

// command is one start or adopt for a session: from the work queue (msg
// set), or a boot takeover whose owner key is already claimed.
type command struct {
	id      string
	adopt   bool
	msg     jetstream.Msg // nil for a takeover
	claimed uint64        // owner key revision of a takeover; 0: claim it
}

func (c command) ack() {
	if c.msg != nil {
		_ = c.msg.Ack()
	}
}

func (c command) retry() {
	if c.msg != nil {
		_ = c.msg.NakWithDelay(time.Second)
	}
}

// retrySoon has the command delivered again after claimRetry.
func (c command) retrySoon() {
	if c.msg != nil {
		_ = c.msg.NakWithDelay(claimRetry)
	}
}

// claimRetry is how soon a start whose owner key is still held (the
// previous owner releasing it) is tried again.
const claimRetry = 200 * time.Millisecond

// own reconciles one command for session id.
func (d *Driver) own(ctx context.Context, c command) {
	id := c.id
	log := d.log.With("session", id)
	store := d.o.Store
	rec, _, err := store.Get(ctx, id)
	if err != nil && !errors.Is(err, session.ErrNotFound) {
		log.Warn("read session", "err", err)
		c.retry()
		return
	}
	if errors.Is(err, session.ErrNotFound) || rec.Status.Terminal() || rec.Status.Kind == contract.StatusSuspended {
		c.ack()
		if c.claimed != 0 { // a stale key of a session with nothing to run
			_ = store.ReleaseOwner(context.Background(), id, c.claimed)
		}
		return
	}
	rev := c.claimed
	if rev == 0 {
		var ok bool
		rev, ok, err = d.claim(ctx, id)
		if err != nil {
			log.Warn("claim session", "err", err)
			c.retry()
			return
		}
		if !ok {
			if rec.Status.Kind == contract.StatusStarting && !c.adopt {
				// A start was asked for (a resume) while the previous
				// owner still holds the key: it recorded the suspend and
				// is about to release it. Acked now, the start would be
				// lost until the supervisor's adoption; asked again
				// shortly, it is claimed once the key is gone. A driver
				// that took this same start holds the key too: the
				// command is then acked once the session is no longer
				// starting.
				log.Debug("owner key held while the session is starting; the start is retried")
				c.retrySoon()
				return
			}
			c.ack() // another driver owns it
			return
		}
	}
	c.ack()
	release := func() { _ = store.ReleaseOwner(context.Background(), id, rev) }
	if rec.UserStopped {
		if rc, ok := d.o.Backend.(recoverer); ok {
			rc.ReapSession(id)
		}
		_, _ = store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusStopped}, nil)
		release()
		return
	}
	plan := d.plan(rec, c.adopt)
	if plan == planLost {
		// Never go silent (ARCHITECTURE §3): say the workload is gone.
		msg := lostRunMessage
		if rec.Mode == contract.ModeWatch {
			msg = "workload lost: the driver that owned it stopped"
		}
		_, _ = store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusFailed, Message: msg}, nil)
		release()
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	o := &owned{d: d, id: id, mode: rec.Mode, rec: rec, log: log, store: store, ctx: sctx, cancel: cancel, adopting: plan == planAdopt,
		pumps: map[string]*iopump.Pump{}, events: newEvQueue(), evDone: make(chan struct{})}
	o.wReady.L = &o.mu
	if rc, ok := d.o.Backend.(recoverer); ok && rec.Mode == contract.ModeWatch {
		o.keepWorkspace = rc.WorkspaceIntact(id, rec.Driver)
	}
	o.recovering = plan == planRecover
	d.mu.Lock()
	if d.stopping {
		// Taken while the driver stops, after stopAll looked at the owned
		// sessions: a workload started now would never be stopped (and
		// Run would wait for it forever). It is not started; the owner
		// key goes, so the supervisor's adoption request has the next
		// driver start the session.
		d.mu.Unlock()
		cancel()
		log.Info("not starting a session taken while the driver stops; left for adoption")
		release()
		return
	}
	d.owned[id] = o
	d.mu.Unlock()
	d.m.sessions.Inc()
	defer func() {
		d.mu.Lock()
		delete(d.owned, id)
		d.mu.Unlock()
		d.m.sessions.Dec()
	}()
	o.run(rev)
}

// renew keeps the owner key alive until the session is released. Only an
// answer ends ownership — the key held by another driver; a bus that does
// not answer (a cluster electing the owners bucket's leader) is retried at
// the next tick, the workload untouched. An update whose answer was lost
// may have been applied: the key then holds this driver's id at a newer
// revision, which renew takes as its own.
func (o *owned) renew(rev uint64) {
	t := time.NewTicker(o.d.o.OwnerTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		}
		n, err := o.store.RenewOwner(o.ctx, o.id, o.d.o.ID, rev)
		if err == nil {
			rev = n
			o.ownerRev.Store(rev)
			continue
		}
		if o.ctx.Err() != nil {
			return
		}
		if bus.Transient(err) {
			o.log.Warn("renew owner key: the bus does not answer; retrying", "err", err)
			continue
		}
		o.log.Warn("renew owner key", "err", err)
		n, held, err := o.reclaim()
		switch {
		case err != nil:
			if o.ctx.Err() != nil {
				return
			}
			o.log.Warn("renew owner key: the bus does not answer; retrying", "err", err)
		case held != "":
			// Another driver adopted the session: this workload goes,
			// and records nothing more (the adopter owns the status and
			// the key now).
			o.log.Error("lost session ownership; stopping workload", "owner", held)
			o.lost.Store(true)
			_ = o.requestStop(context.Background())
			return
		default:
			rev = n
			o.ownerRev.Store(rev)
		}
	}
}

// reclaim reads the owner key after an update was refused: held by this
// driver (an update whose answer was lost) it is ours at its revision;
// gone (it expired) it is created again; held by another driver, held
// names it. err is the bus not answering.
func (o *owned) reclaim() (rev uint64, held string, err error) {
	holder, rev, err := o.store.Owner(o.ctx, o.id)
	switch {
	case err == nil && holder == o.d.o.ID:
		return rev, "", nil
	case err == nil:
		return 0, holder, nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, "", err
	}
	rev, err = o.store.ClaimOwner(o.ctx, o.id, o.d.o.ID)
	if errors.Is(err, jetstream.ErrKeyExists) {
		if holder, _, gerr := o.store.Owner(o.ctx, o.id); gerr == nil && holder != o.d.o.ID {
			return 0, holder, nil
		}
	}
	return rev, "", err
}
