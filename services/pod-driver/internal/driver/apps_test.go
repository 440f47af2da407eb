package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// owner returns the driver's owner of session id.
func (e *driverEnv) owner(t *testing.T, id string) *owned {
	t.Helper()
	var o *owned
	testkit.Eventually(t, 10*time.Second, func() bool {
		e.drv.mu.Lock()
		defer e.drv.mu.Unlock()
		o = e.drv.owned[id]
		return o != nil
	}, "driver owns session %s", id)
	return o
}

// settled reports whether the workload is live and no app-set change is
// under way (one was taken, its recreate has not brought a workload up).
func (o *owned) settled() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.w != nil && o.next == intentNone && !o.changing && o.ctx.Err() == nil
}

// answerCheckpoints makes the test play workspace-proxy's checkpoint for
// session id: it answers at once.
func (e *driverEnv) answerCheckpoints(t *testing.T, id string) {
	t.Helper()
	sub, err := e.nc.Subscribe(bus.WSSubject(id, bus.WSCheckpoint), func(m *nats.Msg) { _ = m.Respond([]byte(`{}`)) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// An app-set change replaces the owner's record while the workload's
// frames (Kernel.PortsResolved) read the session's mode on the sink's
// goroutine. Under -race this failed while the mode was read from the
// record without the owner's lock.
func TestAppsChangeRacesWorkloadFrames(t *testing.T) {
	e := newDriverEnv(t)
	id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
	e.answerCheckpoints(t, id)
	e.command(t, bus.CmdStartSubject(id), id)
	e.waitStatus(t, id, contract.StatusRunning)
	o := e.owner(t, id)

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		// What the sink does with a frame, once a millisecond: the pace
		// leaves the record write of a change between two reads with
		// nothing ordering them.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			o.portsResolved("web", json.RawMessage(`{"ports":[]}`))
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() {
		close(stop)
		<-done
	}()
	for i := range 3 {
		testkit.Eventually(t, 30*time.Second, o.settled, "change %d: workload live, no change under way", i)
		r, err := ctl(e.nc, id, bus.CtlApps, appsChange(t, "web"), nil, 30*time.Second)
		if err != nil || !r.OK {
			t.Fatalf("change %d: PUT apps = %+v, %v; want ok", i, r, err)
		}
	}
	testkit.Eventually(t, 30*time.Second, o.settled, "workload live after the last change")
	if st := e.status(t, id); st.Kind != contract.StatusRunning {
		t.Fatalf("status after the changes = %+v, want running", st)
	}
}

// hangCheckpoints makes the test play a workspace-proxy whose checkpoints
// of session id wait until the returned release is called; got receives
// one value per checkpoint asked for.
func (e *driverEnv) hangCheckpoints(t *testing.T, id string) (got <-chan struct{}, release func()) {
	t.Helper()
	asked := make(chan struct{}, 16)
	free := make(chan struct{})
	sub, err := e.nc.Subscribe(bus.WSSubject(id, bus.WSCheckpoint), func(m *nats.Msg) {
		asked <- struct{}{}
		select {
		case <-free:
		case <-time.After(2 * time.Minute):
		}
		_ = m.Respond([]byte(`{}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	rel := func() { once.Do(func() { close(free) }) }
	t.Cleanup(func() {
		rel()
		_ = sub.Unsubscribe()
	})
	return asked, rel
}

// recordedApps is the session's recorded app names.
func (e *driverEnv) recordedApps(t *testing.T, id string) []string {
	t.Helper()
	rec, _, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range rec.Apps {
		names = append(names, a.Name)
	}
	return names
}

// PUT apps is taken at once (the edge answers 202, contract 4.12) however
// long the checkpoint takes; while one change is under way the session
// has no live workload for another (not_running, 409 at the edge); a
// request past the deadline its sender set is dropped, so the edge that
// gave up and the driver agree that nothing changed.
func TestAppsChangeTakenAtOnce(t *testing.T) {
	e := newDriverEnv(t)
	id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
	asked, release := e.hangCheckpoints(t, id)
	e.command(t, bus.CmdStartSubject(id), id)
	e.waitStatus(t, id, contract.StatusRunning)
	o := e.owner(t, id)
	testkit.Eventually(t, 30*time.Second, o.live, "workload live")

	// Expired: answered, and neither checkpointed nor recorded.
	late := nats.Header{}
	bus.SetDeadline(late, time.Now().Add(-time.Second))
	r, err := ctl(e.nc, id, bus.CtlApps, appsChange(t, "web", "late"), late, 5*time.Second)
	if err != nil || r.Error != "set_apps_failed" {
		t.Fatalf("PUT apps past its deadline = %+v, %v; want set_apps_failed", r, err)
	}

	hdr := nats.Header{}
	bus.SetDeadline(hdr, time.Now().Add(10*time.Second))
	took := time.Now()
	r, err = ctl(e.nc, id, bus.CtlApps, appsChange(t, "web", "admin"), hdr, 5*time.Second)
	if err != nil || !r.OK {
		t.Fatalf("PUT apps = %+v, %v; want ok within 5 s while its checkpoint waits", r, err)
	}
	t.Logf("change taken in %v while its checkpoint waits", time.Since(took))
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the change never asked for a checkpoint")
	}
	r, err = ctl(e.nc, id, bus.CtlApps, appsChange(t, "web", "other"), nil, 5*time.Second)
	if err != nil || r.Error != "not_running" {
		t.Fatalf("second PUT apps during a change = %+v, %v; want not_running within 5 s", r, err)
	}
	release()
	testkit.Eventually(t, 30*time.Second, func() bool { return fmt.Sprint(e.recordedApps(t, id)) == "[web admin]" },
		"recorded apps %v, want [web admin]", e.recordedApps(t, id))
	testkit.Eventually(t, 30*time.Second, o.settled, "workload live after the change")
	if st := e.status(t, id); st.Kind != contract.StatusRunning {
		t.Fatalf("status after the change = %+v, want running", st)
	}
	select {
	case <-asked:
		t.Fatal("a refused or expired change asked for a checkpoint")
	default:
	}
}

// A change that fails ends the session failed with "changing the app set
// failed: <detail>" (contract 4.12 step 7): a checkpoint failure, and a
// recreated workload that cannot start, whose session keeps the app set
// it had (only a success records the new one).
func TestAppsChangeFailure(t *testing.T) {
	e := newDriverEnv(t)
	t.Run("checkpoint", func(t *testing.T) {
		id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
		sub, err := e.nc.Subscribe(bus.WSSubject(id, bus.WSCheckpoint), func(m *nats.Msg) {
			_ = m.Respond([]byte(`{"error":"workspace_error","message":"disk full"}`))
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		e.command(t, bus.CmdStartSubject(id), id)
		e.waitStatus(t, id, contract.StatusRunning)
		testkit.Eventually(t, 30*time.Second, e.owner(t, id).live, "workload live")
		r, err := ctl(e.nc, id, bus.CtlApps, appsChange(t, "web", "admin"), nil, 5*time.Second)
		if err != nil || !r.OK {
			t.Fatalf("PUT apps = %+v, %v; want ok", r, err)
		}
		e.waitStatus(t, id, contract.StatusFailed)
		if st, want := e.status(t, id), "changing the app set failed: checkpoint: workspace_error: disk full"; st.Message != want {
			t.Errorf("failed message = %q, want %q", st.Message, want)
		}
		if got := fmt.Sprint(e.recordedApps(t, id)); got != "[web]" {
			t.Errorf("recorded apps = %s, want [web]", got)
		}
	})
	t.Run("recreate", func(t *testing.T) {
		id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
		e.answerCheckpoints(t, id)
		e.command(t, bus.CmdStartSubject(id), id)
		e.waitStatus(t, id, contract.StatusRunning)
		testkit.Eventually(t, 30*time.Second, e.owner(t, id).live, "workload live")
		// The new workload cannot be built: its bundle (small: a key in
		// the bundles bucket) is gone.
		bundles, err := e.js.KeyValue(context.Background(), bus.BucketBundles)
		if err != nil {
			t.Fatal(err)
		}
		if err := bundles.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		r, err := ctl(e.nc, id, bus.CtlApps, appsChange(t, "web", "admin"), nil, 5*time.Second)
		if err != nil || !r.OK {
			t.Fatalf("PUT apps = %+v, %v; want ok", r, err)
		}
		e.waitStatus(t, id, contract.StatusFailed)
		st := e.status(t, id)
		if !strings.HasPrefix(st.Message, "changing the app set failed: start: get bundle: ") {
			t.Errorf("failed message = %q, want changing the app set failed: start: get bundle: …", st.Message)
		}
		if got := fmt.Sprint(e.recordedApps(t, id)); got != "[web]" {
			t.Errorf("recorded apps = %s, want [web] (the change did not succeed)", got)
		}
	})
}
