package kernelwire

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

type reachRecorder struct {
	mu     sync.Mutex
	states []string
}

func (r *reachRecorder) Reachability(_ string, _ int, state string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = append(r.states, state)
}

// A one-shot's port that lives 300 ms, bound 400 ms after the watch starts
// (issue 14's manifest: exitAfterMs 300), is still reported reachable with
// the contract's 1 s schedule: the first seconds probe faster.
func TestWatchReachabilitySeesShortLivedPort(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	_ = probe.Close() // the port is free again; bound below for 300 ms

	rec := &reachRecorder{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { // owned: waited for below
		defer close(done)
		WatchReachability(ctx, "127.0.0.1", port, "app", rec, ReachTiming{})
	}()
	// The one-shot starts 400 ms after the watch (the scenario's clock,
	// not a wait for a condition); the watcher has reported checking by
	// then.
	started := time.Now()
	if !testkit.Poll(ctx, 400*time.Millisecond, func() bool { return rec.saw(contract.ReachChecking) }) {
		t.Fatalf("no checking state within 400 ms of the watch's start")
	}
	bindAt := time.NewTimer(400*time.Millisecond - time.Since(started))
	select {
	case <-bindAt.C:
	case <-ctx.Done():
		t.Fatal("the watch ended before the port was bound")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("rebind %d: %v", port, err)
	}
	// It lives 300 ms: held until reported reachable, at most that long.
	testkit.Poll(ctx, 300*time.Millisecond, func() bool { return rec.saw(contract.ReachReachable) })
	_ = ln.Close() // the one-shot exits
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reachability watcher did not end with its context")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := []string{contract.ReachChecking, contract.ReachReachable}
	if len(rec.states) != 2 || rec.states[0] != want[0] || rec.states[1] != want[1] {
		t.Errorf("states = %v, want %v", rec.states, want)
	}
}

// saw reports whether state was reported.
func (r *reachRecorder) saw(state string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.states, state)
}

type progressRecorder struct {
	mu    sync.Mutex
	notes []string
}

func (r *progressRecorder) Progress(phase, message string, _ bool, app string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, phase+" "+app+" "+message)
}

// An agent that listens on its port gets no notice; CheckAgentPort returns
// once the port answers.
func TestCheckAgentPortListening(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rec := &progressRecorder{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	CheckAgentPort(ctx, "127.0.0.1", ln.Addr().(*net.TCPAddr).Port, "helper", rec, ReachTiming{Deadline: 200 * time.Millisecond})
	if ctx.Err() != nil {
		t.Fatal("CheckAgentPort did not return once the port answered")
	}
	if len(rec.notes) != 0 {
		t.Errorf("notices = %v, want none", rec.notes)
	}
}
