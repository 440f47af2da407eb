package driver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local"
)

// Binaries built by TestMain: the stand-in kernel and the workspace file
// server the local backend runs as real processes.
var devkernelPath, workspaceServerPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "driver-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	devkernelPath = filepath.Join(dir, "devkernel")
	workspaceServerPath = filepath.Join(dir, "workspace-server")
	for _, b := range []struct{ out, pkg, dir string }{
		{devkernelPath, "./cmd/devkernel", filepath.Join("..", "..", "..", "..", "tools", "devkernel")},
		{workspaceServerPath, "./cmd/workspace-server", filepath.Join("..", "..", "..", "workspace-proxy")},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = b.dir
		if b.dir != "" {
			cmd.Env = append(os.Environ(), "GOWORK=off")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			_ = os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// driverEnv is a real driver on the local backend over a real JetStream.
type driverEnv struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	store *session.Store
	drv   *Driver
	done  chan error
}

func newDriverEnv(t *testing.T) *driverEnv {
	t.Helper()
	lim := bus.Limits{OwnerTTL: 3 * time.Second}
	srv := testkit.StartJetStream(t)
	testkit.Provision(t, srv, lim)
	// The driver runs as its role; the test plays the edge, supervisor and
	// workspace-proxy with the test-only identity.
	dnc, djs := testkit.Connect(t, srv, bus.RoleDriver)
	dstore, err := session.Open(context.Background(), djs, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	nc, js := testkit.Connect(t, srv, testkit.Admin)
	store, err := session.Open(context.Background(), js, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := local.New(local.Options{KernelCommand: []string{devkernelPath}, WorkspaceServerCommand: []string{workspaceServerPath},
		WorkRoot: t.TempDir(), StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := &driverEnv{nc: nc, js: js, store: store, done: make(chan error, 1),
		drv: New(Options{ID: "driver-test", NC: dnc, Store: dstore, Backend: lb, Logger: log, OwnerTTL: 3 * time.Second})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { e.done <- e.drv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-e.done:
			if err != nil {
				t.Errorf("Driver.Run() = %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("Driver.Run() did not return after cancel")
		}
		closeCtx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		_ = lb.Close(closeCtx)
	})
	return e
}

// watchSession stores a one-app (tty) watch session in status and returns
// its id; the bundle is a manifest devkernel runs until stopped.
func (e *driverEnv) watchSession(t *testing.T, st contract.Status, mod func(*session.Record)) string {
	t.Helper()
	ctx := context.Background()
	id := contract.NewSessionID()
	manifest := "kind: Telo.Application\nmetadata:\n  name: web\n"
	b := contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{{RelativePath: "telo.yaml", Contents: manifest}}}
	if err := e.store.PutBundle(ctx, id, b); err != nil {
		t.Fatal(err)
	}
	rec := session.Record{ID: id, Mode: contract.ModeWatch, Status: st, CreatedAt: time.Now().UTC(),
		Apps:   []session.App{{Name: "web", Entry: "telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{}}},
		Launch: session.Launch{Env: map[string]string{}}}
	if mod != nil {
		mod(&rec)
	}
	if err := e.store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	return id
}

// command publishes a start or adopt command the way the edge and the
// supervisor do.
func (e *driverEnv) command(t *testing.T, subject, id string) {
	t.Helper()
	msg := &nats.Msg{Subject: subject, Data: []byte(id), Header: nats.Header{}}
	msg.Header.Set(bus.HeaderSession, id)
	msg.Header.Set(jetstream.MsgIDHeader, subject+"-"+id+"-"+fmt.Sprint(time.Now().UnixNano()))
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

func (e *driverEnv) status(t *testing.T, id string) contract.Status {
	t.Helper()
	rec, _, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s) = %v", id, err)
	}
	return rec.Status
}

func (e *driverEnv) waitStatus(t *testing.T, id, kind string) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, func() bool { return e.status(t, id).Kind == kind },
		"session %s %s (is %+v)", id, kind, e.status(t, id))
}

// ioContains reports whether the app channel's retained bytes contain s.
func (e *driverEnv) ioContains(t *testing.T, id, app, s string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subject := bus.IOSubject(id, app)
	tail, err := e.store.IO().Tail(ctx, subject)
	if err != nil || tail == 0 {
		return false
	}
	r, err := e.store.IO().Read(ctx, subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var all []byte
	for {
		ent, _, _, err := r.Next()
		if err != nil {
			return false
		}
		all = append(all, ent.Data[1:]...)
		if ent.Seq >= tail {
			return bytes.Contains(all, []byte(s))
		}
	}
}

// startOrAdopt is the subject a command of kind subject uses for id.
func startOrAdopt(subject, id string) string {
	if subject == bus.SubjectCmdStart {
		return bus.CmdStartSubject(id)
	}
	return subject
}
