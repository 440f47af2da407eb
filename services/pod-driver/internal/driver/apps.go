package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/iopump"
)

// checkpointNow asks runner-ws for a checkpoint of the live workspace.
func (o *owned) checkpointNow(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	reply, err := o.d.o.NC.RequestWithContext(ctx, bus.WSSubject(o.id, bus.WSCheckpoint), nil)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var ans struct{ Error, Message string }
	if err := json.Unmarshal(reply.Data, &ans); err != nil {
		return fmt.Errorf("checkpoint: undecodable reply: %w", err)
	}
	if ans.Error != "" {
		return fmt.Errorf("checkpoint: %s: %s", ans.Error, ans.Message)
	}
	return nil
}

// changeApps replaces the app set (PUT apps, 4.12): checkpoint the live
// workspace, record the new set (kept apps keep their generations and
// channels, new ones start at 0, every next generation is `resume`), then
// recreate the workload, which restores the checkpoint before any app
// starts. A checkpoint failure changes nothing.
//
// Changes of one session run one at a time; a stop or suspend that comes
// meanwhile wins (the change then finds no live workload).
func (o *owned) changeApps(change session.AppsChange) error {
	o.appsMu.Lock()
	defer o.appsMu.Unlock()
	if !o.live() {
		return errNotLive
	}
	if err := o.checkpointNow(o.ctx); err != nil {
		if !o.live() {
			return errNotLive
		}
		return err
	}
	if !o.live() {
		return errNotLive
	}
	var removed []string
	rec, err := o.store.Update(context.Background(), o.id, func(r *session.Record) error {
		removed = removed[:0]
		old := map[string]session.App{}
		for _, a := range r.Apps {
			old[a.Name] = a
		}
		next := make([]session.App, 0, len(change.Apps))
		for _, a := range change.Apps {
			if prev, ok := old[a.Name]; ok {
				a.Generation = prev.Generation
				delete(old, a.Name)
			} else {
				a.Generation = 0
			}
			a.Trigger = contract.TriggerResume
			next = append(next, a)
		}
		for name := range old {
			removed = append(removed, name)
		}
		r.Apps = next
		if change.DropAgent {
			r.Launch.AgentSpec, r.Agent = nil, ""
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range change.Notices {
		o.enqueue(contract.Event{Type: contract.EventProgress, Phase: contract.PhaseProvision, Message: n})
	}
	o.mu.Lock()
	o.rec = rec
	o.mu.Unlock()
	o.resetChannels(rec, removed)
	return o.end(context.Background(), intentRecreate)
}

// errNotLive: the session has no live workload (starting, ending, ended).
var errNotLive = errors.New("the session has no live workload")

// live reports whether the workload runs and nothing asked it to end.
func (o *owned) live() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.w != nil && o.next == intentNone && o.ctx.Err() == nil
}

// resetChannels opens pumps for new apps and drops the channels of removed
// ones: their bytes and counters are discarded, so an app added back later
// starts over (7.5).
func (o *owned) resetChannels(rec session.Record, removed []string) {
	o.pumpMu.Lock()
	defer o.pumpMu.Unlock()
	for _, a := range rec.Apps {
		if _, ok := o.pumps[a.Name]; !ok && !o.pumpsClosed {
			o.pumps[a.Name] = iopump.New(o.store.IO, bus.IOSubject(o.id, a.Name), 0, o.log)
		}
	}
	for _, name := range removed {
		if p, ok := o.pumps[name]; ok {
			p.Close()
			delete(o.pumps, name)
		}
		if err := o.store.IO.Purge(context.Background(), bus.IOSubject(o.id, name)); err != nil {
			o.log.Warn("purge removed app channel", "app", name, "err", err)
		}
		o.proj.Forget(name)
	}
}
