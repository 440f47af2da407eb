//go:build linux

package bench

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/tools/kubetest"
)

// BenchmarkKubeWatchSession: the Kubernetes backend against a real
// kube-apiserver and the stand-in kubelet (pods are local processes, so
// image pulls and container runtimes are not in the figure; the API
// server round trips, pod watch, workspace readiness poll, seeding,
// attach and relay are). Each iteration creates a one-app watch session
// and reports create → `status running`, create → the app's first
// `run started`, and one edit → `run started` of the next generation;
// then deletes the session. One untimed session first. Needs
// TELORUNNER_KUBE_BIN (make kube-bins).
func BenchmarkKubeWatchSession(b *testing.B) {
	env := kubetest.Start(b, kubetest.Options{})
	env.StartKubelet(b, kubetest.KubeletOptions{Images: map[string]string{"telorun/node": kernelBin, "telorunner/workspace-server": serverBin}})
	r := startRunner(b, map[string]string{
		"RUNNER_WATCH_SESSIONS": "true", "RUNNER_BACKEND": "kubernetes",
		"KUBECONFIG": env.KubeconfigPath(env.Driver), "RUNNER_SESSION_NAMESPACE": env.Namespace,
		"RUNNER_WORKSPACE_IMAGE": "telorunner/workspace-server:bench", "SESSION_INGRESS_BASE_DOMAIN": "bench.test",
		"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "false", // hermetic: no Docker Hub at boot
	})
	man := "kind: Telo.Application\nmetadata:\n  name: kube\n"
	body := map[string]any{
		"mode":   "watch",
		"bundle": map[string]any{"entryRelativePath": "telo.yaml", "files": []map[string]any{{"relativePath": "telo.yaml", "contents": man}}},
		"env":    map[string]any{}, "config": map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"inspect": true,
		"apps":    []map[string]any{{"name": "app", "entryRelativePath": "telo.yaml"}},
	}
	var running, started, edit []time.Duration
	session := func() {
		t0 := time.Now()
		id := r.create(b, body)
		resp, err := http.Get(r.url + "/v1/sessions/" + id + "/events")
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		next := func(want string) {
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") && strings.Contains(sc.Text(), want) {
					return
				}
			}
			b.Fatalf("stream ended before %s", want)
		}
		next(`"kind":"running"`)
		running = append(running, time.Since(t0))
		next(`"phase":"started","generation":1`)
		started = append(started, time.Since(t0))
		t1 := time.Now()
		wr, err := http.Post(r.url+"/v1/sessions/"+id+"/workspace", "application/json",
			strings.NewReader(fmt.Sprintf(`{"write":[{"path":"telo.yaml","content":%q}]}`, man+"# edit\n")))
		if err != nil || wr.StatusCode != 200 {
			b.Fatalf("write: %v %v", err, wr)
		}
		wr.Body.Close()
		next(`"phase":"started","generation":2`)
		edit = append(edit, time.Since(t1))
		req, _ := http.NewRequest("DELETE", r.url+"/v1/sessions/"+id, nil)
		if dr, err := http.DefaultClient.Do(req); err != nil || dr.StatusCode != 204 {
			b.Fatalf("delete: %v %v", err, dr)
		}
		next(`"kind":"stopped"`)
		resp.Body.Close()
	}
	session() // warm-up, not counted
	running, started, edit = nil, nil, nil
	for b.Loop() {
		session()
	}
	latency(b, "create → status running", "running-", running, 0.5)
	latency(b, "create → the app's first run started", "first-run-", started, 0.5)
	latency(b, "edit → run started of the next generation", "edit-run-", edit, 0.5)
}
