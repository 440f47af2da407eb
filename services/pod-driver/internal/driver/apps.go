package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/iopump"
)

// finalCheckpoint freezes the workspace (every write in flight finishes,
// every later one is refused) and takes its last checkpoint before the
// workload goes, so nothing written before the suspend is lost. A
// workspace that cannot be frozen (a workspace server from before the
// freeze) is checkpointed anyway, as before. When the checkpoint fails the
// workspace is thawed and the session goes on.
func (o *owned) finalCheckpoint(ctx context.Context) error {
	frozen := true
	if err := o.freeze(ctx, true); err != nil {
		o.log.Warn("freeze the workspace before the final checkpoint", "err", err)
		frozen = false
	}
	if err := o.checkpointNow(ctx); err != nil {
		if frozen {
			o.thaw()
		}
		return err
	}
	return nil
}

// thaw lets the workspace take writes again after a suspend that did not
// happen.
func (o *owned) thaw() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := o.freeze(ctx, false); err != nil {
		o.log.Warn("thaw the workspace", "err", err)
	}
}

// freeze asks runner-ws to freeze (or thaw) the session's workspace.
func (o *owned) freeze(ctx context.Context, frozen bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := bus.CallJSON(ctx, o.d.o.NC, bus.WSSubject(o.id, bus.WSFreeze), map[string]bool{"frozen": frozen}, nil); err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	return nil
}

// checkpointNow asks runner-ws for a checkpoint of the live workspace;
// the workload is about to go (driver exit, app-set change), so the
// history records it as a suspend checkpoint.
func (o *owned) checkpointNow(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := bus.CallJSON(ctx, o.d.o.NC, bus.WSSubject(o.id, bus.WSCheckpoint), map[string]string{"reason": "suspend"}, nil); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// changeApps replaces the app set (PUT apps, 4.12) after beginAppsChange
// took it: freeze and checkpoint the live workspace, record the new set (kept apps
// keep their generations and channels, new ones start at 0, every next
// generation is `resume`), then recreate the workload, which restores the
// checkpoint before any app starts.
//
// The edge answered 202 already, so the outcome is the session's status:
// a fresh `running` with the new endpoints, or, when the change fails
// (checkpoint, record, the new workload's start), `failed` with "changing
// the app set failed: <detail>" and the new apps' channels removed. A stop
// or suspend that comes meanwhile wins: the change then does nothing more.
func (o *owned) changeApps(change session.AppsChange) {
	o.appsMu.Lock()
	defer o.appsMu.Unlock()
	defer o.endAppsChange()
	// The same final checkpoint as a suspend: the workspace is frozen
	// first, so a write acknowledged before the change is in the
	// checkpoint the new workload starts from and a later one is refused.
	// The new workload's workspace starts thawed; a failed checkpoint
	// thaws this one.
	if err := o.finalCheckpoint(o.ctx); err != nil {
		o.failAppsChange(err)
		return
	}
	if !o.live() {
		return
	}
	var removed, added []string
	prev := o.record()
	rec, err := o.store.Update(context.Background(), o.id, func(r *session.Record) error {
		removed, added = removed[:0], added[:0]
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
				added = append(added, a.Name)
			}
			a.Trigger = contract.TriggerResume
			next = append(next, a)
		}
		for name := range old {
			removed = append(removed, name)
		}
		r.Apps = next
		// The frozen workspace goes with the workload: writes are refused
		// (not_running) until the new one is seeded and records its own
		// address, never taken by a workspace the seed is still replacing.
		r.Workspace = ""
		if change.DropAgent {
			r.Launch.AgentSpec, r.Agent = nil, ""
		}
		return nil
	})
	if err != nil {
		o.failAppsChange(fmt.Errorf("record the new app set: %w", err))
		return
	}
	for _, n := range change.Notices {
		o.enqueue(contract.Event{Type: contract.EventProgress, Phase: contract.PhaseProvision, Message: n})
	}
	o.mu.Lock()
	o.rec = rec
	o.recreate = &appsUndo{apps: prev.Apps, agentSpec: prev.Launch.AgentSpec, agent: prev.Agent, added: added}
	o.mu.Unlock()
	o.resetChannels(rec, removed)
	if err := o.end(context.Background(), intentRecreate); err != nil {
		o.log.Warn("stop the workload for an app-set change", "err", err)
	}
}

// appsUndo is what an app-set change replaced: the recorded app set and
// agent, and the apps it added (whose channels go if it fails).
type appsUndo struct {
	apps      []session.App
	agentSpec *session.AgentSpec
	agent     string
	added     []string
}

// appsChangeFailed is the failed status message of an app-set change
// (contract 4.12 step 7).
func appsChangeFailed(detail string) string { return "changing the app set failed: " + detail }

// beginAppsChange takes an app-set change when the workload is live and no
// other change is under way; false means not_running.
//
// A change that arrives while the workload is starting (the session may
// already report running: the backend records it from inside Start) waits
// for the start, at most liveWait.
func (o *owned) beginAppsChange() bool {
	wake := time.AfterFunc(liveWait, func() {
		o.mu.Lock()
		o.wReady.Broadcast()
		o.mu.Unlock()
	})
	defer wake.Stop()
	deadline := time.Now().Add(liveWait)
	o.mu.Lock()
	defer o.mu.Unlock()
	for o.w == nil && o.starting && o.next == intentNone && o.ctx.Err() == nil && time.Now().Before(deadline) {
		o.wReady.Wait()
	}
	if o.w == nil || o.next != intentNone || o.ctx.Err() != nil || o.changing {
		return false
	}
	o.changing = true
	return true
}

// liveWait bounds how long a control request waits for a workload being
// started.
const liveWait = 20 * time.Second

func (o *owned) endAppsChange() {
	o.mu.Lock()
	o.changing = false
	o.mu.Unlock()
}

// failAppsChange ends the session failed with the change's error, unless
// a stop or suspend already ends it (that one wins).
func (o *owned) failAppsChange(err error) {
	o.mu.Lock()
	if o.next != intentNone || o.ctx.Err() != nil {
		o.mu.Unlock()
		return
	}
	o.failMsg = appsChangeFailed(err.Error())
	o.mu.Unlock()
	o.log.Warn("app-set change failed", "err", err)
	if err := o.end(context.Background(), intentFail); err != nil {
		o.log.Warn("stop the workload of a failed app-set change", "err", err)
	}
}

// recreateFailed is the status of a session whose recreated workload
// could not start: the recorded app set goes back to the one the change
// replaced (contract 4.12: only a success updates it) and the channels the
// change added are removed.
func (o *owned) recreateFailed(undo *appsUndo, detail string) *contract.Status {
	rec, err := o.store.Update(context.Background(), o.id, func(r *session.Record) error {
		r.Apps = undo.apps
		r.Launch.AgentSpec, r.Agent = undo.agentSpec, undo.agent
		return nil
	})
	if err != nil {
		o.log.Warn("restore the app set of a failed change", "err", err)
	} else {
		o.mu.Lock()
		o.rec = rec
		o.mu.Unlock()
	}
	o.resetChannels(o.record(), undo.added)
	return &contract.Status{Kind: contract.StatusFailed, Message: appsChangeFailed(detail)}
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
			o.pumps[a.Name] = iopump.New(o.store.IO(), bus.IOSubject(o.id, a.Name), 0, o.log)
		}
	}
	for _, name := range removed {
		if p, ok := o.pumps[name]; ok {
			p.Close()
			delete(o.pumps, name)
		}
		if err := o.store.IO().Purge(context.Background(), bus.IOSubject(o.id, name)); err != nil {
			o.log.Warn("purge removed app channel", "app", name, "err", err)
		}
		o.proj.Forget(name)
	}
}
