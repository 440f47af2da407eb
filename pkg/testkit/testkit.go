// Package testkit starts real infrastructure for tests: an in-process NATS
// server with JetStream in a temporary directory on a random port, and wait
// helpers that poll a condition with a deadline instead of sleeping.
package testkit

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/embednats"
	"github.com/telorunner/telorunner/pkg/session"
)

// Server is a running in-process JetStream server that authenticates
// every client: one nkey user per bus role with bus.Permissions(role), so
// tests run under the production permissions and anonymous clients are
// refused.
type Server struct {
	*server.Server
	Dir string
	// Creds holds each role's key pair (bus.Roles).
	Creds map[string]nkeys.KeyPair
}

// Admin is a test-only identity allowed everything, for tests that inspect
// the bus (stream configurations, leftovers). No service connects as it.
const Admin = "testkit-admin"

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
	creds := make(map[string]nkeys.KeyPair, len(bus.Roles))
	pubs := make(map[string]string, len(bus.Roles))
	for _, role := range bus.Roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatalf("nkey: %v", err)
		}
		creds[role] = kp
		pubs[role], _ = kp.PublicKey()
	}
	users, err := embednats.Users(pubs)
	if err != nil {
		t.Fatalf("nats users: %v", err)
	}
	admin, err := nkeys.CreateUser()
	if err != nil {
		t.Fatalf("nkey: %v", err)
	}
	creds[Admin] = admin
	adminPub, _ := admin.PublicKey()
	users = append(users, &server.NkeyUser{Nkey: adminPub}) // no permissions block: allowed everything
	s, err := embednats.Start(embednats.Options{Dir: d, Port: -1, Users: users}, 10*time.Second)
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Server{Server: s, Dir: d, Creds: creds}
}

// Connect opens a connection as role (bus.Roles) and a JetStream handle,
// closed when t ends. A permission violation the server reports to this
// connection fails the test: a role must be able to do its job.
func Connect(t testing.TB, s *Server, role string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	var mu sync.Mutex
	var violations []string
	opts := s.ClientOptions(t, role)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}
	}))
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect nats as %s: %v", role, err)
	}
	t.Cleanup(func() {
		nc.Close()
		mu.Lock()
		defer mu.Unlock()
		if len(violations) > 0 {
			t.Errorf("role %s was refused by the bus: %v", role, violations)
		}
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// ClientOptions are the connection options of role (bus.ClientOptions).
func (s *Server) ClientOptions(t testing.TB, role string) []nats.Option {
	t.Helper()
	kp, ok := s.Creds[role]
	if !ok {
		t.Fatalf("no bus role %q", role)
	}
	inbox := role
	if role == Admin {
		inbox = "admin"
	}
	opts, err := bus.ClientOptions(inbox, kp, nil)
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// Provision provisions the bus with lim as the provisioner role.
func Provision(t testing.TB, s *Server, lim bus.Limits) {
	t.Helper()
	nc, js := Connect(t, s, bus.RoleProvisioner)
	if err := bus.Provision(context.Background(), js, lim); err != nil {
		t.Fatalf("bus.Provision() = %v", err)
	}
	nc.Close()
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

// Session starts JetStream, provisions every stream and bucket with lim,
// connects as role and opens the session store (event replay budget 1 MiB):
// the setup of every test that drives sessions over the bus.
func Session(t testing.TB, lim bus.Limits, role string) (*nats.Conn, jetstream.JetStream, *session.Store) {
	t.Helper()
	s := StartJetStream(t)
	Provision(t, s, lim)
	nc, js := Connect(t, s, role)
	store, err := session.Open(context.Background(), js, 1<<20)
	if err != nil {
		t.Fatalf("session.Open() = %v", err)
	}
	return nc, js, store
}

// WriteCredentials writes each role's seed to dir/<role>.nk (mode 0600),
// the layout the all-in-one reads its credentials from, so processes under
// test can connect to s.
func (s *Server) WriteCredentials(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, role := range bus.Roles {
		seed, err := s.Creds[role].Seed()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bus.SeedFile(dir, role), append(seed, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
