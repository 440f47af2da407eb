package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// The all-in-one's embedded NATS authenticates every client (issue 11):
// an anonymous client on RUNNER_NATS_PORT is refused; the subscriber
// credential it generated follows a session's events on runner.evt.<id>
// and is refused publishing on runner.ctl.>; the seeds are private files,
// reused across restarts; and no workload's environment holds a
// credential.
func TestBusAuthAllInOne(t *testing.T) {
	dir := t.TempDir()
	// What a standalone driver would have in its own environment.
	t.Setenv("RUNNER_NATS_NKEY_FILE", filepath.Join(dir, "driver.nk"))
	port := freePort(t)
	dataDir := filepath.Join(dir, "data")
	vars := map[string]string{"RUNNER_DATA_DIR": dataDir, "RUNNER_NATS_PORT": fmt.Sprint(port)}
	r := startRunner(t, vars)

	anon, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port))
	if err == nil {
		anon.Close()
		t.Fatal("anonymous client accepted on RUNNER_NATS_PORT")
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous Connect() = %v, want %v", err, nats.ErrAuthorization)
	}

	credDir := allinone.CredentialsDir(dataDir)
	if fi, err := os.Stat(credDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("credentials dir: %v, %v; want mode 0700", fi.Mode(), err)
	}
	seeds := map[string]string{}
	for _, role := range bus.Roles {
		f := bus.SeedFile(credDir, role)
		fi, err := os.Stat(f)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v; want mode 0600", f, err)
		}
		b, _ := os.ReadFile(f)
		seeds[role] = strings.TrimSpace(string(b))
	}

	var mu sync.Mutex
	var refusals []string
	sub := r.connect(t, bus.RoleSubscriber, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		refusals = append(refusals, err.Error())
		mu.Unlock()
	}))
	live, err := sub.SubscribeSync(bus.SubjectEventsPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	c := r.create(t, runBody(manifest("authed", nil, map[string]any{"exitAfterMs": 300}), nil, false))
	var types []string
	for !strings.Contains(strings.Join(types, ","), "exited") {
		m, err := live.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("subscriber: %v after %v", err, types)
		}
		if m.Subject != bus.EventsSubject(c.SessionID) {
			t.Fatalf("event on %s, want %s", m.Subject, bus.EventsSubject(c.SessionID))
		}
		types = append(types, m.Header.Get(bus.HeaderType)+":"+string(m.Data))
	}
	if err := sub.Publish(bus.CtlSubject(c.SessionID, bus.CtlStop), nil); err != nil {
		t.Fatal(err)
	}
	want := `Permissions Violation for Publish to "` + bus.CtlSubject(c.SessionID, bus.CtlStop) + `"`
	testkit.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(refusals, "\n"), want)
	}, "subscriber publish on runner.ctl not refused")

	// No workload environment names or holds a credential: the kernel of a
	// session that keeps running, its environment read from /proc.
	live2 := r.create(t, runBody(manifest("authed-live", nil, nil), nil, false))
	home := []byte("HOME=" + filepath.Join(dataDir, "sessions", live2.SessionID, "home") + "\x00")
	var envs [][]byte
	testkit.Eventually(t, 30*time.Second, func() bool {
		envs = nil
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			cmd, err := os.ReadFile(p)
			if err != nil || !bytes.HasPrefix(cmd, []byte(devkernel)) {
				continue
			}
			if env, err := os.ReadFile(filepath.Join(filepath.Dir(p), "environ")); err == nil && bytes.Contains(env, home) {
				envs = append(envs, env)
			}
		}
		return len(envs) > 0
	}, "no kernel process of session %s found", live2.SessionID)
	for _, b := range envs {
		env := strings.ReplaceAll(string(b), "\x00", "\n")
		for role, seed := range seeds {
			if strings.Contains(env, seed) {
				t.Fatalf("workload env holds the %s seed", role)
			}
		}
		if strings.Contains(env, "RUNNER_NATS") || strings.Contains(env, credDir) || strings.Contains(env, ".nk") {
			t.Fatalf("workload env names a bus credential: %q", env)
		}
	}

	// A restart reuses the seeds.
	r.stop()
	r2 := startRunner(t, vars)
	for role, seed := range seeds {
		b, _ := os.ReadFile(bus.SeedFile(credDir, role))
		if strings.TrimSpace(string(b)) != seed {
			t.Fatalf("%s seed changed across a restart", role)
		}
	}
	r2.connect(t, bus.RoleSubscriber)
}
