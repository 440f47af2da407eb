package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// routes is a watch workload whose routing is a list the test reads and
// can make fail, standing in for the Kubernetes API (the backends have
// their own tests against real processes and a real API server).
type routes struct {
	backend.Workload // unused by portsResolved

	mu      sync.Mutex
	fail    error
	set     map[string][]contract.PortMapping
	watched []string
	calls   int
}

func (r *routes) SetPorts(_ context.Context, app string, ports []contract.PortMapping) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.fail != nil {
		return r.fail
	}
	r.set[app] = ports
	return nil
}

func (r *routes) WatchPorts(app string, ports []contract.PortMapping) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range ports {
		r.watched = append(r.watched, app+"/"+p.Key())
	}
}

func (r *routes) Endpoints(ports []contract.PortMapping) []contract.Endpoint {
	out := []contract.Endpoint{}
	for _, p := range ports {
		out = append(out, contract.Endpoint{Host: fmt.Sprintf("%d-s.example", p.Port), Port: p.Port, Protocol: p.Protocol})
	}
	return out
}

type portsEnv struct {
	o     *owned
	store *session.Store
	r     *routes
	next  uint64 // events read so far
}

func newPortsEnv(t *testing.T) *portsEnv {
	t.Helper()
	_, _, store := testkit.Session(t, bus.Limits{}, bus.RoleDriver)
	ctx := context.Background()
	rec := session.Record{ID: contract.NewSessionID(), Mode: contract.ModeWatch, Status: contract.Status{Kind: contract.StatusRunning},
		Apps: []session.App{
			{Name: "web", Entry: "web/telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{{Port: 3000, Protocol: "tcp"}}},
			{Name: "worker", Entry: "worker/telo.yaml", IO: contract.IOStreams, Ports: []contract.PortMapping{{Port: 4000, Protocol: "tcp"}}},
		}}
	if err := store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	o := &owned{id: rec.ID, mode: rec.Mode, rec: rec, store: store, ctx: sctx, cancel: cancel,
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), events: newEvQueue(), evDone: make(chan struct{})}
	o.wReady.L = &o.mu
	go o.emitLoop()
	t.Cleanup(func() {
		o.closeEvents()
		<-o.evDone
		cancel()
	})
	return &portsEnv{o: o, store: store, r: &routes{set: map[string][]contract.PortMapping{}}}
}

func declare(ports ...int) json.RawMessage {
	var items []string
	for _, p := range ports {
		items = append(items, fmt.Sprintf(`{"name":"http","port":%d,"protocol":"tcp"}`, p))
	}
	return json.RawMessage(`{"ports":[` + strings.Join(items, ",") + `]}`)
}

// events returns the events emitted since the last call, after a flush.
func (e *portsEnv) events(t *testing.T) []string {
	t.Helper()
	e.o.flush()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tail, err := e.store.Events().Tail(ctx, bus.EventsSubject(e.o.id))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if tail <= e.next {
		return out
	}
	rd, err := e.store.Events().Read(ctx, bus.EventsSubject(e.o.id), e.next)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	for e.next < tail {
		ent, _, _, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		e.next = ent.Seq
		out = append(out, string(ent.Data))
	}
	return out
}

func (e *portsEnv) webPorts(t *testing.T) []string {
	t.Helper()
	rec, _, err := e.store.Get(context.Background(), e.o.id)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := rec.App("web")
	var keys []string
	for _, p := range a.Ports {
		keys = append(keys, p.Key())
	}
	return keys
}

func (e *portsEnv) setWorkload() {
	e.o.mu.Lock()
	e.o.w = e.r
	e.o.mu.Unlock()
}

// A declaration that arrives while the workload is starting is applied
// once it runs: routed first, then recorded and announced with the
// workload's hosts, then watched.
func TestPortsResolvedWhileStarting(t *testing.T) {
	e := newPortsEnv(t)
	e.o.portsResolved("web", declare(3000, 3001))
	if got := e.events(t); len(got) != 0 {
		t.Fatalf("events before the workload runs = %v, want none", got)
	}
	e.setWorkload()
	e.o.applyPendingPorts()
	got := e.events(t)
	want := []string{`{"type":"endpoints","app":"web","added":[{"host":"3001-s.example","port":3001,"protocol":"tcp"}]}`}
	if !slices.Equal(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	if ports := e.webPorts(t); !slices.Equal(ports, []string{"tcp/3000", "tcp/3001"}) {
		t.Errorf("recorded web ports = %v", ports)
	}
	if !slices.Equal(e.r.watched, []string{"web/tcp/3001"}) || len(e.r.set["web"]) != 2 {
		t.Errorf("routed %v, watched %v", e.r.set, e.r.watched)
	}
	e.o.applyPendingPorts() // nothing pending any more
	if got := e.events(t); len(got) != 0 {
		t.Fatalf("second apply emitted %v", got)
	}
}

// A routing failure rejects the accepted ports with its error and changes
// neither the record nor the watchers (11.8 step 4, rolled back); a
// conflict with another app is rejected without routing at all.
func TestPortsResolvedRoutingFailure(t *testing.T) {
	e := newPortsEnv(t)
	e.setWorkload()
	e.r.fail = errors.New("ingresses is forbidden")
	e.o.portsResolved("web", declare(3000, 3002))
	got := e.events(t)
	want := []string{`{"type":"endpoints","app":"web","rejected":[{"port":3002,"reason":"ingresses is forbidden"}]}`}
	if !slices.Equal(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	if ports := e.webPorts(t); !slices.Equal(ports, []string{"tcp/3000"}) || len(e.r.watched) != 0 {
		t.Fatalf("after a failed route: recorded %v, watched %v", ports, e.r.watched)
	}

	// Only a removal, and it fails: nothing is said, nothing changes.
	e.o.portsResolved("web", declare())
	if got := e.events(t); len(got) != 0 {
		t.Fatalf("failed removal emitted %v", got)
	}
	if ports := e.webPorts(t); !slices.Equal(ports, []string{"tcp/3000"}) {
		t.Fatalf("failed removal recorded %v", ports)
	}

	// The other app's port: rejected by the driver, routing not touched.
	e.r.fail = nil
	calls := e.r.calls
	e.o.portsResolved("web", declare(3000, 4000))
	got = e.events(t)
	want = []string{`{"type":"endpoints","app":"web","rejected":[{"port":4000,"reason":"another app in this session already declares tcp port 4000"}]}`}
	if !slices.Equal(got, want) || e.r.calls != calls {
		t.Fatalf("events = %v (routing calls %d → %d), want %v", got, calls, e.r.calls, want)
	}

	// A removal that routes: announced with the host it had.
	e.o.portsResolved("web", declare())
	got = e.events(t)
	want = []string{`{"type":"endpoints","app":"web","removed":[{"host":"3000-s.example","port":3000,"protocol":"tcp"}]}`}
	if !slices.Equal(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	if ports := e.webPorts(t); len(ports) != 0 {
		t.Fatalf("recorded web ports after removal = %v", ports)
	}
}
