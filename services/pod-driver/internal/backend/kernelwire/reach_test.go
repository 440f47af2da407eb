package kernelwire

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
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
	time.Sleep(400 * time.Millisecond)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("rebind %d: %v", port, err)
	}
	time.Sleep(300 * time.Millisecond)
	_ = ln.Close() // the one-shot exits
	<-done
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := []string{contract.ReachChecking, contract.ReachReachable}
	if len(rec.states) != 2 || rec.states[0] != want[0] || rec.states[1] != want[1] {
		t.Errorf("states = %v, want %v", rec.states, want)
	}
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
