package driver

import (
	"context"
	"slices"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

// recoverer is a backend whose workloads are processes on this machine
// (the local backend): a workload lost with its driver cannot be
// re-attached (its terminal and pipes ended with that process), but what
// is left of it can be ended and a watch session started again from its
// workspace directory.
type recoverer interface {
	// WorkspaceIntact reports whether the session's workspace directory,
	// created by lastDriver, is on this machine with a completed seed.
	WorkspaceIntact(id, lastDriver string) bool
	// ReapSession ends the process groups a lost workload of the session
	// left on this machine and reports how many were still running.
	ReapSession(id string) int
}

// lostRunMessage is the failed status of a run session whose process was
// lost with its driver.
const lostRunMessage = "workload lost: the driver running this session died, and a run session cannot be resumed"

// takeOver claims, at boot, every session whose owner key names one of
// names — this driver's identity in a previous run, or a driver that died
// on this machine — without waiting for the key to expire, and recovers
// it as an adoption. A key is taken with a CAS on its revision, so a
// driver racing for it (or the key expiring meanwhile) never yields two
// owners. It returns how many sessions it took.
func (d *Driver) takeOver(ctx, sessCtx context.Context, names []string) int {
	if len(names) == 0 {
		return 0
	}
	keys, err := d.o.Store.OwnerKeys(ctx)
	if err != nil {
		d.log.Warn("list owner keys", "err", err)
		return 0
	}
	n := 0
	for _, id := range keys {
		if !contract.ValidSessionID(id) {
			continue // the supervisor's leader key
		}
		holder, held, err := d.o.Store.Owner(ctx, id)
		if err != nil || !slices.Contains(names, holder) {
			continue
		}
		rev, err := d.o.Store.RenewOwner(ctx, id, d.o.ID, held)
		if err != nil {
			d.log.Info("owner key changed before takeover", "session", id, "err", err)
			continue
		}
		d.log.Info("took over a session of a dead driver", "session", id, "previous", holder)
		n++
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.own(sessCtx, command{id: id, adopt: true, claimed: rev})
		}()
	}
	return n
}

// recoverPlan decides what a driver does with a session whose previous
// workload may have been lost with its driver (adopt, takeover, or a
// start command for a session that is past starting).
type recoverPlan int

const (
	planStart   recoverPlan = iota // start a workload as usual
	planAdopt                      // re-attach (kubernetes)
	planRecover                    // watch session: a new workload from the workspace dir or checkpoint
	planLost                       // record failed: the workload cannot be brought back
)

func (d *Driver) plan(rec session.Record, adopt bool) recoverPlan {
	lost := adopt || rec.Status.Kind != contract.StatusStarting
	if !lost {
		return planStart
	}
	if _, ok := d.o.Backend.(adopter); ok && rec.Status.Kind == contract.StatusRunning {
		return planAdopt
	}
	rc, ok := d.o.Backend.(recoverer)
	switch {
	case !ok && rec.Status.Kind == contract.StatusStarting:
		// An adopt that won the race with a queued or resumed start:
		// nothing ran that could be lost; the start command then finds
		// the owner key.
		return planStart
	case !ok:
		return planLost
	case rec.Mode == contract.ModeWatch:
		return planRecover
	case rec.Status.Kind == contract.StatusStarting && rc.ReapSession(rec.ID) == 0:
		// A run session whose start never launched a process here.
		return planStart
	default:
		rc.ReapSession(rec.ID)
		return planLost
	}
}

// recoverStatus records that a watch session comes up again after its
// workload was lost: status starting (running before: every app's next
// generation is attributed resume, 4.13), no workspace address until the
// new workload's server answers.
func (o *owned) recoverStatus(ctx context.Context) error {
	rec, err := o.store.SetStatus(ctx, o.id, contract.Status{Kind: contract.StatusStarting}, func(r *session.Record) error {
		if r.Status.Kind == contract.StatusRunning {
			for i := range r.Apps {
				r.Apps[i].Trigger = contract.TriggerResume
			}
		}
		r.Workspace = ""
		return nil
	})
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.rec = rec
	o.mu.Unlock()
	return nil
}
