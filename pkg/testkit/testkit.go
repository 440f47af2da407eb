// Package testkit starts real infrastructure for tests: an in-process NATS
// server with JetStream in a temporary directory on a random port, and wait
// helpers that poll a condition with a deadline instead of sleeping.
package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/session"
)

// Server is a running in-process JetStream server.
type Server struct {
	*server.Server
	Dir string
}

// StartJetStream starts a server storing under a fresh t.TempDir() (or dir,
// when given) on a random loopback port and stops it when t ends.
func StartJetStream(t testing.TB, dir ...string) *Server {
	t.Helper()
	d := ""
	if len(dir) > 0 {
		d = dir[0]
	} else {
		d = t.TempDir()
	}
	s, err := StartServer(d, -1)
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Server{Server: s, Dir: d}
}

// StartServer starts a JetStream server storing under dir on port (-1 for a
// random port) and waits until it accepts connections.
func StartServer(dir string, port int) (*server.Server, error) {
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats server not ready within 10s")
	}
	return s, nil
}

// Connect opens a client connection and a JetStream handle, closed when t ends.
func Connect(t testing.TB, s *Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Eventually polls cond every few milliseconds until it returns true or
// timeout passes, then fails the test with msg.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	if !Poll(context.Background(), timeout, cond) {
		t.Fatalf("timed out after %v: "+msg, append([]any{timeout}, args...)...)
	}
}

// Poll polls cond with a growing interval (1 ms to 50 ms) until it returns
// true (true), or timeout passes or ctx ends (false).
func Poll(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

// Session starts JetStream, connects, provisions every stream and bucket
// with lim and opens the session store (event replay budget 1 MiB): the
// setup of every test that drives sessions over the bus.
func Session(t testing.TB, lim bus.Limits) (*nats.Conn, jetstream.JetStream, *session.Store) {
	t.Helper()
	nc, js := Connect(t, StartJetStream(t))
	ctx := context.Background()
	if err := bus.Provision(ctx, js, lim); err != nil {
		t.Fatalf("bus.Provision() = %v", err)
	}
	store, err := session.Open(ctx, js, 1<<20)
	if err != nil {
		t.Fatalf("session.Open() = %v", err)
	}
	return nc, js, store
}
