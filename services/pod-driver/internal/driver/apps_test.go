package driver

import (
	"encoding/json"
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
		for {
			select {
			case <-stop:
				return
			default:
			}
			// What the sink does with a frame; the sleep leaves the record
			// write of a change between two reads with nothing ordering them.
			o.portsResolved("web", json.RawMessage(`{"ports":[]}`))
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() {
		close(stop)
		<-done
	}()
	for i := range 3 {
		testkit.Eventually(t, 30*time.Second, o.live, "change %d: workload live", i)
		r, err := ctl(e.nc, id, bus.CtlApps, appsChange(t, "web"), nil, 30*time.Second)
		if err != nil || !r.OK {
			t.Fatalf("change %d: PUT apps = %+v, %v; want ok", i, r, err)
		}
	}
	testkit.Eventually(t, 30*time.Second, o.live, "workload live after the last change")
	if st := e.status(t, id); st.Kind != contract.StatusRunning {
		t.Fatalf("status after the changes = %+v, want running", st)
	}
}
