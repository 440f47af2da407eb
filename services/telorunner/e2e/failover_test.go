package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// watchVars is the environment of a watch-enabled telorunner process.
func watchVars(dataDir string, extra map[string]string) map[string]string {
	return merge(map[string]string{
		"RUNNER_DATA_DIR":                 dataDir,
		"RUNNER_WATCH_SESSIONS":           "true",
		"RUNNER_KERNEL_COMMAND":           devkernel,
		"RUNNER_WORKSPACE_SERVER_COMMAND": workspaceServer,
	}, extra)
}

// A run session cannot be resumed: after kill -9 and a restart it ends
// failed with a message that says its process was lost, and its process
// is gone.
func TestCrashRestartFailsLostRunSession(t *testing.T) {
	vars := watchVars(t.TempDir(), nil)
	a := startProcRunner(t, "first", vars)
	c := createOn(t, a.URL, runBody(manifest("oneshot", nil, nil), nil, false))
	s := openSSE(t, a.URL+c.StreamURL, nil)
	s.until(t, 60*time.Second, isStatus("running"))
	s.Close()
	old := processesUnder(vars["RUNNER_DATA_DIR"])
	if len(old) == 0 {
		t.Fatal("no process of the run session under the data dir")
	}
	a.kill9(t)
	b := startProcRunner(t, "second", vars)
	doc := waitStatus(t, &runner{URL: b.URL}, c.SessionID, "failed", 10*time.Second)
	msg, _ := doc["status"].(map[string]any)["message"].(string)
	if !strings.Contains(msg, "workload lost") || !strings.Contains(msg, "cannot be resumed") {
		t.Errorf("failed message = %q, want it to say the run's workload was lost and cannot be resumed", msg)
	}
	for _, pid := range old {
		if alive(pid) {
			t.Errorf("process %d of the lost run session still runs", pid)
		}
	}
}

// A watch session whose workspace directory is gone (another machine, a
// wiped disk) is recovered from its last checkpoint.
func TestCrashRestartRecoversFromCheckpoint(t *testing.T) {
	natsPort := freePort(t)
	vars := watchVars(t.TempDir(), merge(fastSupervisor, map[string]string{
		"RUNNER_WATCH_IDLE_SECONDS": "3600", "RUNNER_NATS_PORT": strconv.Itoa(natsPort),
	}))
	a := startProcRunner(t, "first", vars)
	r := &runner{URL: a.URL}
	c, _ := seedWatch(t, r)
	// Wait for a checkpoint taken after the edits. A periodic checkpoint of
	// an unchanged tree writes nothing, so one that raced the last edit is
	// not followed by another: edit again (a new file) until a checkpoint
	// is stored well after an edit.
	nc := (&runner{NATSURL: "nats://127.0.0.1:" + strconv.Itoa(natsPort), DataDir: vars["RUNNER_DATA_DIR"]}).connect(t, bus.RoleSupervisor)
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), bus.BucketCheckpoints)
	if err != nil {
		t.Fatal(err)
	}
	var want string
	checkpointed := false
	for i := 0; i < 5 && !checkpointed; i++ {
		if resp := writeFiles(t, r, c.SessionID, map[string]string{fmt.Sprintf("notes/mark-%d.txt", i): "mark\n"}); resp.Status != 200 {
			t.Fatalf("write = %d %s", resp.Status, resp.Body)
		}
		edited := time.Now()
		want = tree(t, r, c.SessionID)
		checkpointed = testkit.Poll(context.Background(), 5*time.Second, func() bool {
			e, err := kv.Get(context.Background(), c.SessionID)
			return err == nil && e.Created().After(edited.Add(200*time.Millisecond))
		})
	}
	if !checkpointed {
		t.Fatal("no checkpoint stored 200 ms or more after an edit, in 5 edits of 5 s each")
	}
	nc.Close()
	a.kill9(t)
	if err := os.RemoveAll(filepath.Join(vars["RUNNER_DATA_DIR"], "sessions", c.SessionID)); err != nil {
		t.Fatal(err)
	}
	b := startProcRunner(t, "second", vars)
	r2 := &runner{URL: b.URL}
	s := openSSE(t, b.URL+c.StreamURL, nil)
	s.until(t, 30*time.Second, func(e sseEvent) bool {
		return e.Event == "run" && strings.Contains(e.Data, `"trigger":"resume"`)
	})
	waitStatus(t, r2, c.SessionID, "running", 5*time.Second)
	if got := tree(t, r2, c.SessionID); got != want {
		t.Fatalf("tree after recovery from the checkpoint = %s\nwant %s", got, want)
	}
}

// Two drivers (two telorunner processes over one NATS, sharing the work
// directory as drivers on one machine do): kill -9 of the one that owns a
// watch session; the other serves it again within 2 × the owner TTL,
// recovered from the workspace directory.
func TestFailoverBetweenDrivers(t *testing.T) {
	const ttl = 3 * time.Second
	ns := testkit.StartJetStream(t)
	work := filepath.Join(t.TempDir(), "work")
	common := merge(fastSupervisor, map[string]string{
		"RUNNER_NATS_URL": ns.ClientURL(), "RUNNER_WORK_DIR": work,
		"RUNNER_OWNER_TTL_MS": strconv.Itoa(int(ttl.Milliseconds())), "RUNNER_WATCH_IDLE_SECONDS": "3600",
		"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "3600",
	})
	// Each process connects with the server's credentials, from its data dir.
	dataDir := func() string {
		d := t.TempDir()
		ns.WriteCredentials(t, allinone.CredentialsDir(d))
		return d
	}
	procs := map[string]*procRunner{
		"driver-a": startProcRunner(t, "a", watchVars(dataDir(), merge(common, map[string]string{"RUNNER_DRIVER_ID": "driver-a"}))),
		"driver-b": startProcRunner(t, "b", watchVars(dataDir(), merge(common, map[string]string{"RUNNER_DRIVER_ID": "driver-b"}))),
	}
	c := createOn(t, procs["driver-a"].URL, watchBody(map[string]string{"telo.yaml": manifest("solo", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	s := openSSE(t, procs["driver-a"].URL+c.StreamURL, nil)
	seen := s.until(t, 60*time.Second, isRun("app", "started", 1))
	s.Close()
	lastID, _ := strconv.Atoi(seen[len(seen)-1].ID)
	if resp := writeFiles(t, &runner{URL: procs["driver-a"].URL}, c.SessionID, map[string]string{"notes.txt": "kept\n"}); resp.Status != 200 {
		t.Fatalf("write = %d %s", resp.Status, resp.Body)
	}

	_, js := testkit.Connect(t, ns, bus.RoleSupervisor)
	owners, err := js.KeyValue(context.Background(), bus.BucketOwners)
	if err != nil {
		t.Fatal(err)
	}
	e, err := owners.Get(context.Background(), c.SessionID)
	if err != nil {
		t.Fatalf("owner key: %v", err)
	}
	owner := string(e.Value())
	survivor := "driver-a"
	if owner == "driver-a" {
		survivor = "driver-b"
	}
	// The supervisor's adopt request is what the survivor acts on: watch
	// for it (a plain subscription sees the work queue's publishes).
	adminNC, _ := testkit.Connect(t, ns, testkit.Admin)
	adopts, err := adminNC.SubscribeSync(bus.SubjectCmdAdopt)
	if err != nil {
		t.Fatal(err)
	}
	if err := adminNC.Flush(); err != nil {
		t.Fatal(err)
	}
	old := processesUnder(work)
	procs[owner].kill9(t)
	killed := time.Now()

	surv := procs[survivor]
	s2 := openSSE(t, surv.URL+c.StreamURL, map[string]string{"Last-Event-ID": strconv.Itoa(lastID)})
	sawStarting := false
	evs := s2.until(t, 30*time.Second, func(e sseEvent) bool {
		sawStarting = sawStarting || isStatus("starting")(e)
		return sawStarting && isStatus("running")(e)
	})
	took := time.Since(killed)
	t.Logf("kill -9 of %s → served by %s: %v (owner TTL %v)", owner, survivor, took, ttl)
	if took > 2*ttl {
		t.Errorf("session served again %v after the kill, want within 2 × owner TTL = %v", took, 2*ttl)
	}
	sseIDs(t, lastID, evs)
	if e, err := owners.Get(context.Background(), c.SessionID); err != nil || string(e.Value()) != survivor {
		t.Errorf("owner after failover = %v, %v; want %s", e, err, survivor)
	}
	// The adoption was requested (by the supervisor: nothing else asks for
	// a session nobody deleted) and the surviving driver ran it.
	m, err := adopts.NextMsg(time.Second)
	if err != nil || string(m.Data) != c.SessionID {
		t.Errorf("adopt request after the kill = %v, %v; want one for %s", m, err, c.SessionID)
	}
	var f struct{ Content string }
	do(t, "GET", surv.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path=notes.txt", nil, nil).json(t, &f)
	if f.Content != "kept\n" {
		t.Errorf("notes.txt after failover = %q, want the edit from the workspace directory", f.Content)
	}
	for _, pid := range old {
		if alive(pid) {
			t.Errorf("process %d of the dead driver's workload still runs", pid)
		}
	}
}
