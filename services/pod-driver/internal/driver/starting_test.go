package driver

import (
	"context"
	"testing"
	"time"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// startedWorkload is a workload that runs until stopped (for tests of the
// owner's bookkeeping around it).
type startedWorkload struct{ done chan struct{} }

func (w *startedWorkload) Stdin(string, []byte) error    { return nil }
func (w *startedWorkload) Resize(string, int, int) error { return nil }
func (w *startedWorkload) Stop(context.Context) error    { return nil }
func (w *startedWorkload) Done() <-chan struct{}         { return w.done }
func (w *startedWorkload) Exit() backend.Exit            { return backend.Exit{} }

// The backend records `running` from inside Start, before the owner holds
// the workload: an app-set change arriving then waits for the start and
// is taken, instead of answering not_running for a running session.
func TestAppsChangeWaitsForTheStartingWorkload(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := &owned{ctx: ctx}
	o.wReady.L = &o.mu
	o.starting = true
	taken := make(chan bool, 1)
	go func() { taken <- o.beginAppsChange() }()
	select {
	case ok := <-taken:
		t.Fatalf("beginAppsChange() = %v while the workload was still starting, want it to wait", ok)
	case <-time.After(200 * time.Millisecond):
	}
	o.mu.Lock()
	o.w = &startedWorkload{done: make(chan struct{})}
	o.starting = false
	o.wReady.Broadcast()
	o.mu.Unlock()
	select {
	case ok := <-taken:
		if !ok {
			t.Fatal("beginAppsChange() = false once the workload started, want the change taken")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("beginAppsChange() still waiting after the workload started")
	}
	// Nothing starting and no workload: refused at once.
	idle := &owned{ctx: ctx}
	idle.wReady.L = &idle.mu
	if idle.beginAppsChange() {
		t.Fatal("beginAppsChange() = true with no workload, want not_running")
	}
}
