package driver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local"
)

// A start command taken while the driver shuts down, after stopAll looked
// at the owned sessions (the e2e suite hit it: a create answered just
// before the all-in-one stopped), is not started: a workload started then
// was never stopped, so Driver.Run waited for it forever and its processes
// outlived the driver. The session stays starting with no owner key, for
// the supervisor's adoption request to start it on the next driver.
func TestSessionTakenWhileStoppingIsNotStarted(t *testing.T) {
	lim := bus.Limits{OwnerTTL: 3 * time.Second}
	srv := testkit.StartJetStream(t)
	testkit.Provision(t, srv, lim)
	dnc, djs := testkit.Connect(t, srv, bus.RoleDriver)
	dstore, err := session.Open(context.Background(), djs, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	_, js := testkit.Connect(t, srv, testkit.Admin)
	store, err := session.Open(context.Background(), js, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := local.New(local.Options{KernelCommand: []string{devkernelPath}, WorkspaceServerCommand: []string{workspaceServerPath},
		WorkRoot: t.TempDir(), StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = lb.Close(ctx)
	})
	e := &driverEnv{js: js, store: store}
	id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
	d := New(Options{ID: "driver-stopping", NC: dnc, Store: dstore, Backend: lb, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OwnerTTL: 3 * time.Second})

	d.stopAll() // the shutdown has looked at the owned sessions (none)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.own(context.Background(), command{id: id})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("own() of a session taken while the driver stops did not return within 30s: its workload was started and nothing stops it")
	}
	if st := e.status(t, id); st.Kind != contract.StatusStarting {
		t.Fatalf("status = %+v, want still starting (left for adoption)", st)
	}
	if _, _, err := store.Owner(context.Background(), id); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("owner key after own() = %v, want none (released for adoption)", err)
	}
	if groups, err := lb.Groups(); err != nil || len(groups) != 0 {
		t.Fatalf("process groups = %+v, %v; want none started", groups, err)
	}
}
