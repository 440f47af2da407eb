//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
	"github.com/telorunner/telorunner/tools/kubetest"
)

// Failover timing: what the figure is bounded by.
const (
	failoverTTL  = 3 * time.Second        // RUNNER_OWNER_TTL_MS
	failoverTick = 500 * time.Millisecond // RUNNER_SUPERVISOR_TICK_MS
)

var (
	telorunnerOnce sync.Once
	telorunnerBin  string
	telorunnerErr  error
)

// telorunner builds the all-in-one binary once (the benchmark kills it
// with SIGKILL, so it must be a separate process).
func telorunner(tb testing.TB) string {
	tb.Helper()
	telorunnerOnce.Do(func() {
		telorunnerBin = filepath.Join(filepath.Dir(kernelBin), "telorunner")
		out, err := exec.Command("go", "build", "-o", telorunnerBin, "github.com/telorunner/telorunner/services/telorunner/cmd/telorunner").CombinedOutput()
		if err != nil {
			telorunnerErr = fmt.Errorf("build telorunner: %v\n%s", err, out)
		}
	})
	if telorunnerErr != nil {
		tb.Fatal(telorunnerErr)
	}
	return telorunnerBin
}

// startProc runs the all-in-one binary with vars on a free loopback port
// until tb ends (startProcess).
func startProc(tb testing.TB, vars map[string]string) *proc {
	tb.Helper()
	port := freePort(tb)
	env := []string{"PATH=" + os.Getenv("PATH"), "PORT=" + port, "RUNNER_DATA_DIR=" + tb.TempDir(),
		"RUNNER_KERNEL_COMMAND=" + kernelBin, "RUNNER_WORKSPACE_SERVER_COMMAND=" + serverBin}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	url := "http://127.0.0.1:" + port
	p := startProcess(tb, "telorunner", telorunner(tb), env, url+"/v1/health")
	p.url = url
	return p
}

// status is GET /v1/sessions/:id's status kind and the workspace route's
// answer.
func served(url, id string) bool {
	resp, err := http.Get(url + "/v1/sessions/" + id)
	if err != nil {
		return false
	}
	var doc struct{ Status struct{ Kind string } }
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil || doc.Status.Kind != "running" {
		return false
	}
	ws, err := http.Get(url + "/v1/sessions/" + id + "/workspace")
	if err != nil {
		return false
	}
	ws.Body.Close()
	return ws.StatusCode == 200
}

// failover runs one round per iteration: two drivers (two telorunner processes over
// one NATS, sharing the local work directory), a one-app watch session,
// kill -9 of its owner, and the time until the session is served again
// by the other: its owner key names the survivor, its status is running
// and its workspace answers through the survivor's edge. No warm-up: every
// round is a fresh pair of processes over a fresh NATS on purpose (the
// figure is a takeover by a survivor that has done nothing else), so the
// rounds are alike; with -benchtime=3x there are 3 samples and each is
// printed (no percentile of 3 samples is).
func failover(b *testing.B, vars map[string]string) {
	var took []time.Duration
	for b.Loop() {
		b.StopTimer()
		ns := testkit.StartJetStream(b)
		common := map[string]string{
			"RUNNER_NATS_URL": ns.ClientURL(), "RUNNER_WORK_DIR": filepath.Join(b.TempDir(), "work"),
			"RUNNER_WATCH_SESSIONS": "true", "RUNNER_OWNER_TTL_MS": strconv.Itoa(int(failoverTTL.Milliseconds())),
			"RUNNER_SUPERVISOR_TICK_MS": strconv.Itoa(int(failoverTick.Milliseconds())),
		}
		for k, v := range vars {
			common[k] = v
		}
		procs := map[string]*proc{}
		for _, id := range []string{"driver-a", "driver-b"} {
			dataDir := b.TempDir()
			ns.WriteCredentials(b, allinone.CredentialsDir(dataDir)) // the process connects with the server's credentials
			v := map[string]string{"RUNNER_DRIVER_ID": id, "RUNNER_DATA_DIR": dataDir}
			for k, x := range common {
				v[k] = x
			}
			procs[id] = startProc(b, v)
		}
		r := runner{url: procs["driver-a"].url}
		man := "kind: Telo.Application\nmetadata:\n  name: failover\n"
		id := r.create(b, map[string]any{
			"mode":   "watch",
			"bundle": map[string]any{"entryRelativePath": "telo.yaml", "files": []map[string]any{{"relativePath": "telo.yaml", "contents": man}}},
			"env":    map[string]any{}, "config": map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
			"inspect": true,
			"apps":    []map[string]any{{"name": "app", "entryRelativePath": "telo.yaml"}},
		})
		if !testkit.Poll(context.Background(), 60*time.Second, func() bool { return served(r.url, id) }) {
			b.Fatal("session not running within 60s")
		}
		nc, js := testkit.Connect(b, ns, bus.RoleSupervisor)
		owners, err := js.KeyValue(context.Background(), bus.BucketOwners)
		if err != nil {
			b.Fatal(err)
		}
		e, err := owners.Get(context.Background(), id)
		if err != nil {
			b.Fatal(err)
		}
		owner := string(e.Value())
		survivor := "driver-a"
		if owner == survivor {
			survivor = "driver-b"
		}
		b.StartTimer()
		t0 := time.Now()
		_ = procs[owner].cmd.Process.Kill()
		<-procs[owner].done
		ok := testkit.Poll(context.Background(), 10*failoverTTL, func() bool {
			e, err := owners.Get(context.Background(), id)
			return err == nil && string(e.Value()) == survivor && served(procs[survivor].url, id)
		})
		d := time.Since(t0)
		b.StopTimer()
		nc.Close()
		if !ok {
			b.Fatalf("session not served by %s within %v of the kill", survivor, 10*failoverTTL)
		}
		took = append(took, d)
		b.StartTimer()
	}
	latency(b, fmt.Sprintf("kill -9 → served again (owner TTL %v, supervisor tick %v; goal ≤ 2 × TTL = %v)", failoverTTL, failoverTick, 2*failoverTTL),
		"kill-to-served-", took, 0.5)
	b.ReportMetric(float64(slices.Max(took))/float64(failoverTTL), "max-x-owner-ttl")
}

// BenchmarkDriverFailover: the time from a driver's kill -9 to its
// session served again by another driver. Bounded by the owner TTL (the
// dead driver's key must expire: up to one TTL after its last renewal,
// renewals every TTL/3), then the supervisor's next tick (it publishes
// runner.cmd.adopt; if the dead process held the supervisor lease too,
// the survivor's supervisor first waits out the same TTL for it), then
// the adoption itself: local — end the lost process groups, start the
// workspace server on the kept workspace directory, kernels, running;
// kubernetes — find the pod and re-attach (no restart).
func BenchmarkDriverFailover(b *testing.B) {
	b.Run("local", func(b *testing.B) { failover(b, nil) })
	b.Run("kubernetes", func(b *testing.B) {
		env := kubetest.Start(b, kubetest.Options{})
		env.StartKubelet(b, kubetest.KubeletOptions{Images: map[string]string{"telorun/node": kernelBin, "telorunner/workspace-server": serverBin}})
		failover(b, map[string]string{
			"RUNNER_BACKEND": "kubernetes", "KUBECONFIG": env.KubeconfigPath(env.Driver), "RUNNER_SESSION_NAMESPACE": env.Namespace,
			"RUNNER_WORKSPACE_IMAGE": "telorunner/workspace-server:bench", "SESSION_INGRESS_BASE_DOMAIN": "bench.test",
			"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "false", // hermetic: no Docker Hub at boot
		})
	})
}
