package driver

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

type ctlReply struct {
	OK      bool   `json:"ok"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

func ctl(nc *nats.Conn, id, verb string, data []byte, hdr nats.Header, timeout time.Duration) (ctlReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	m, err := nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: bus.CtlSubject(id, verb), Data: data, Header: hdr})
	if err != nil {
		return ctlReply{}, err
	}
	var r ctlReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return r, err
	}
	return r, nil
}

func appsChange(t *testing.T, names ...string) []byte {
	t.Helper()
	// A notice makes the change enqueue an event, the path that used to
	// panic when it ran after the session closed its queue.
	c := session.AppsChange{Notices: []string{"app set changed by the test"}}
	for _, n := range names {
		c.Apps = append(c.Apps, session.App{Name: n, Entry: "telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{}})
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A PUT apps whose checkpoint hangs is taken at once and holds up neither
// keystrokes nor a DELETE; the stop wins over the change (stopped, not
// failed).
func TestSlowAppsChangeBlocksNeitherStdinNorStop(t *testing.T) {
	e := newDriverEnv(t)
	id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
	e.command(t, bus.CmdStartSubject(id), id)
	e.waitStatus(t, id, contract.StatusRunning)

	// The workspace checkpoint (workspace-proxy's job) hangs.
	got := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	sub, err := e.nc.Subscribe(bus.WSSubject(id, bus.WSCheckpoint), func(m *nats.Msg) {
		got <- struct{}{}
		select {
		case <-release:
		case <-time.After(2 * time.Minute):
		}
		_ = m.Respond([]byte(`{}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	type answer struct {
		r   ctlReply
		err error
	}
	apps := make(chan answer, 1)
	go func() {
		r, err := ctl(e.nc, id, bus.CtlApps, appsChange(t, "web"), nil, 60*time.Second)
		apps <- answer{r, err}
	}()
	select {
	case a := <-apps:
		if a.err != nil || !a.r.OK {
			t.Fatalf("PUT apps = %+v, %v; want ok (taken) before its checkpoint", a.r, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("PUT apps not answered while its checkpoint waits")
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("PUT apps never asked for a checkpoint")
	}

	// Keystrokes flow while the change waits.
	hdr := nats.Header{}
	hdr.Set(bus.HeaderApp, "web")
	if err := e.nc.PublishMsg(&nats.Msg{Subject: bus.CtlSubject(id, bus.CtlStdin), Data: []byte("during-apps\n"), Header: hdr}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return e.ioContains(t, id, "web", "echo: during-apps") },
		"stdin echoed while PUT apps waits for its checkpoint")

	// DELETE answers promptly.
	start := time.Now()
	r, err := ctl(e.nc, id, bus.CtlStop, nil, nil, 30*time.Second)
	if err != nil || !r.OK {
		t.Fatalf("stop during a slow PUT apps = %+v, %v, want ok", r, err)
	}
	took := time.Since(start)
	if took > 10*time.Second {
		t.Fatalf("stop took %v during a slow PUT apps, want well under the 30 s edge timeout", took)
	}
	t.Logf("stop answered in %v while PUT apps waited for its checkpoint", took)
	e.waitStatus(t, id, contract.StatusStopped)
	if st := e.status(t, id); st.Message != "" {
		t.Errorf("status after a stop during a change = %+v, want stopped with no message", st)
	}
}

// Control requests of every kind racing the session's end get an answer
// (or no responder once it is gone), never a panic or a hang, and the
// driver goes on serving.
func TestCtlRacingSessionEnd(t *testing.T) {
	e := newDriverEnv(t)
	for round := range 3 {
		id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
		// A checkpoint that answers at once, so changes get as far as
		// recording the new set and recreating the workload.
		sub, err := e.nc.Subscribe(bus.WSSubject(id, bus.WSCheckpoint), func(m *nats.Msg) { _ = m.Respond([]byte(`{}`)) })
		if err != nil {
			t.Fatal(err)
		}
		e.command(t, bus.CmdStartSubject(id), id)
		e.waitStatus(t, id, contract.StatusRunning)

		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for i := range 16 {
			verb := []string{bus.CtlApps, bus.CtlSuspend, bus.CtlApps, bus.CtlStdin}[i%4]
			wg.Add(1)
			go func() {
				defer wg.Done()
				var data []byte
				hdr := nats.Header{}
				hdr.Set(bus.HeaderApp, "web")
				switch verb {
				case bus.CtlApps:
					data = appsChange(t, "web", "admin")
				case bus.CtlStdin:
					if err := e.nc.PublishMsg(&nats.Msg{Subject: bus.CtlSubject(id, verb), Data: []byte("x\n"), Header: hdr}); err != nil {
						errs <- err
					}
					return
				}
				_, err := ctl(e.nc, id, verb, data, hdr, 45*time.Second)
				if err != nil && !errors.Is(err, nats.ErrNoResponders) {
					errs <- err
				}
			}()
		}
		r, err := ctl(e.nc, id, bus.CtlStop, nil, nil, 30*time.Second)
		if err != nil && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("round %d: stop = %+v, %v", round, r, err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: control request = %v, want an answer or no responders", round, err)
		}
		testkit.Eventually(t, 30*time.Second, func() bool {
			st := e.status(t, id)
			return st.Terminal() || st.Kind == contract.StatusSuspended
		}, "round %d: session ended", round)
		_ = sub.Unsubscribe()
		select {
		case err := <-e.done:
			t.Fatalf("driver stopped: %v", err)
		default:
		}
	}
}
