//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/tools/kubetest"
)

// The Kubernetes backend end to end: the all-in-one with
// RUNNER_BACKEND=kubernetes against a real kube-apiserver (RBAC on, the
// driver holding only deploy/kubernetes/role.yaml) and the stand-in
// kubelet, which runs the kernel image as devkernel and the workspace
// image as workspace-server, each pod on its own loopback address.
// The scenarios are the local backend's, adjusted only where Kubernetes
// differs observably: endpoints carry ingress hosts, ports answer on the
// pod IP, and output written before the runner attached is not replayed
// (contract 11.14), so io assertions follow a reload or a start delay.

const (
	kubeKernelImage    = "telorun/node:latest-slim" // the runner's default image; the kubelet maps its repository to devkernel
	kubeWorkspaceImage = "telorunner/workspace-server:e2e"
	kubeDomain         = "sessions.e2e.test"
	kubeManagedBy      = "telo-k8s-runner"
	labelSession       = "telo.run/session-id"
)

type kubeCluster struct {
	env       *kubetest.Env
	admin     kubernetes.Interface
	vars      map[string]string
	agentPort int
}

func startKube(t *testing.T) *kubeCluster {
	t.Helper()
	env := kubetest.Start(t, kubetest.Options{})
	// The catalog agent is a workspace-server on the catalog's port: a
	// program that serves the shared workspace, as an agent works on it.
	env.StartKubelet(t, kubetest.KubeletOptions{Images: map[string]string{
		"telorun/node": devkernel, "telorunner/workspace-server": workspaceServer, "telorunner/agent": workspaceServer}})
	admin, err := kubernetes.NewForConfig(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	agentPort := freePort(t)
	return &kubeCluster{env: env, admin: admin, agentPort: agentPort, vars: map[string]string{
		"RUNNER_APPS":                 fmt.Sprintf(`{"helper":{"image":"telorunner/agent:e2e","env":{"OPERATOR_KEY":"op-k3y","PORT":"%d"},"port":%d}}`, agentPort, agentPort),
		"RUNNER_BACKEND":              "kubernetes",
		"KUBECONFIG":                  env.KubeconfigPath(env.Driver),
		"RUNNER_SESSION_NAMESPACE":    env.Namespace,
		"RUNNER_WORKSPACE_IMAGE":      kubeWorkspaceImage,
		"SESSION_INGRESS_BASE_DOMAIN": kubeDomain,
		"RUNNER_WATCH_SESSIONS":       "true",
		// Hermetic: the base-image menu would ask Docker Hub at boot
		// (its tests run against a fake tag API in services/api-edge/edge).
		"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "false",
	}}
}

func (k *kubeCluster) runner(t *testing.T, dataDir string, extra ...map[string]string) *runner {
	t.Helper()
	vars := merge(append([]map[string]string{k.vars}, extra...)...)
	if dataDir != "" {
		vars["RUNNER_DATA_DIR"] = dataDir
	}
	return startRunner(t, vars)
}

// pod is the session's one pod as the API server stores it.
func (k *kubeCluster) pod(t *testing.T, id string) *corev1.Pod {
	t.Helper()
	l, err := k.admin.CoreV1().Pods(k.env.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: labelSession + "=" + id})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("pods of session %s = %v, %v; want one", id, l, err)
	}
	return &l.Items[0]
}

// routing returns the session's Service ports ("tcp-8080") and Ingress
// hosts as stored, both sorted, and checks their shape.
func (k *kubeCluster) routing(t *testing.T, id string) (ports, hosts []string) {
	t.Helper()
	ports, hosts, ok := k.routingOK(t, id)
	if !ok {
		t.Fatalf("session %s has no Service and Ingress", id)
	}
	return ports, hosts
}

// routingOK is routing that reports missing objects (ok false) instead of
// failing.
func (k *kubeCluster) routingOK(t *testing.T, id string) (ports, hosts []string, ok bool) {
	t.Helper()
	ctx := context.Background()
	svc, err := k.admin.CoreV1().Services(k.env.Namespace).Get(ctx, "telo-run-"+id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, false
	}
	if err != nil {
		t.Fatalf("get service: %v", err)
	}
	ing, err := k.admin.NetworkingV1().Ingresses(k.env.Namespace).Get(ctx, "telo-run-"+id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, false
	}
	if err != nil {
		t.Fatalf("get ingress: %v", err)
	}
	for _, p := range svc.Spec.Ports {
		if p.Port != p.TargetPort.IntVal || p.Name != strings.ToLower(string(p.Protocol))+"-"+fmt.Sprint(p.Port) {
			t.Errorf("service port %+v: want name <proto>-<port> and targetPort = port", p)
		}
		ports = append(ports, p.Name)
	}
	if svc.Spec.Selector[labelSession] != id {
		t.Errorf("service selector = %v", svc.Spec.Selector)
	}
	for _, r := range ing.Spec.Rules {
		b := r.HTTP.Paths[0].Backend.Service
		if b.Name != "telo-run-"+id || r.Host != fmt.Sprintf("%d-%s.%s", b.Port.Number, id, kubeDomain) {
			t.Errorf("ingress rule %s → %s:%d", r.Host, b.Name, b.Port.Number)
		}
		hosts = append(hosts, r.Host)
	}
	pod := k.pod(t, id)
	for _, obj := range []metav1.Object{svc, ing} {
		refs := obj.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "Pod" || refs[0].UID != pod.UID || refs[0].Controller == nil || !*refs[0].Controller {
			t.Errorf("%T owner references = %+v, want the session pod %s as controller", obj, refs, pod.Name)
		}
	}
	slices.Sort(ports)
	slices.Sort(hosts)
	return ports, hosts, true
}

// gone waits until no pod, Service or Ingress of session id is left.
func (k *kubeCluster) gone(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	var left string
	if !testkit.Poll(ctx, 60*time.Second, func() bool {
		pods, err := k.admin.CoreV1().Pods(k.env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labelSession + "=" + id})
		_, serr := k.admin.CoreV1().Services(k.env.Namespace).Get(ctx, "telo-run-"+id, metav1.GetOptions{})
		_, ierr := k.admin.NetworkingV1().Ingresses(k.env.Namespace).Get(ctx, "telo-run-"+id, metav1.GetOptions{})
		if err == nil && len(pods.Items) == 0 && apierrors.IsNotFound(serr) && apierrors.IsNotFound(ierr) {
			return true
		}
		left = fmt.Sprintf("pods %d (%v), service: %v, ingress: %v", len(pods.Items), err, serr, ierr)
		return false
	}) {
		t.Fatalf("session %s left behind after 60s: %s", id, left)
	}
}

func kubeHost(port int, id string) string { return fmt.Sprintf("%d-%s.%s", port, id, kubeDomain) }

func TestKubernetesBackend(t *testing.T) {
	k := startKube(t)
	dataDir := t.TempDir()
	r := k.runner(t, dataDir)
	t.Run("RunSession", func(t *testing.T) { kubeRunSession(t, k, r) })
	t.Run("WatchTwoApps", func(t *testing.T) { kubeWatchTwoApps(t, k, r) })
	t.Run("WatchIOModes", func(t *testing.T) { kubeWatchIOModes(t, k, r) })
	t.Run("AgentCredentialBoundary", func(t *testing.T) { kubeAgent(t, k, r) })
	t.Run("SuspendRestartResume", func(t *testing.T) {
		r.stop()
		kubeSuspendRestartResume(t, k, dataDir)
	})
}

// Idle suspend deletes the pod after a checkpoint; after every service
// restarted (reaping a pod no session owns on the way) the session resumes
// in a new pod from the checkpoint under the same id.
func kubeSuspendRestartResume(t *testing.T, k *kubeCluster, dataDir string) {
	r := k.runner(t, dataDir, fastSupervisor)
	c, before := seedWatch(t, r)
	first := k.pod(t, c.SessionID)
	waitStatus(t, r, c.SessionID, "suspended", 30*time.Second)
	k.gone(t, c.SessionID)
	r.stop()

	kubeOrphans(t, k)
	r = k.runner(t, dataDir, fastSupervisor)
	k.gone(t, "orphan000001")
	if _, err := k.admin.CoreV1().Pods(k.env.Namespace).Get(context.Background(), "not-ours", metav1.GetOptions{}); err != nil {
		t.Fatalf("a pod without the runner's label was touched: %v", err)
	}
	waitStatus(t, r, c.SessionID, "suspended", 10*time.Second)
	hold := openSSE(t, r.URL+c.StreamURL, nil) // presence: no idle suspend while we look
	assertResumed(t, r, c.SessionID, before)
	if again := k.pod(t, c.SessionID); again.UID == first.UID || again.Status.PodIP == "" {
		t.Fatalf("resumed pod = %s (%s), want a new running pod", again.UID, again.Status.PodIP)
	}
	hold.Close()
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE = %d", resp.Status)
	}
	k.gone(t, c.SessionID)
}

// A run session: running with ingress endpoints, reachable on the pod IP,
// banner and stdin echo through pods/attach, exit code, and nothing left
// in the cluster once it is deleted.
func kubeRunSession(t *testing.T, k *kubeCluster, r *runner) {
	port := freePort(t)
	man := manifest("hello", []int{port}, map[string]any{"startDelayMs": 1500, "exitAfterMs": 12000, "exitCode": 3})
	c := r.create(t, runBody(man, []int{port}, false))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	seen := sse.until(t, 60*time.Second, isStatus("running"))
	eps := decode(t, seen[len(seen)-1].Data)["status"].(map[string]any)["endpoints"].([]any)
	host := kubeHost(port, c.SessionID)
	if len(eps) != 1 || eps[0].(map[string]any)["host"] != host || eps[0].(map[string]any)["url"] != "https://"+host {
		t.Fatalf("running endpoints = %v, want %s", eps, host)
	}
	var progress []string
	for _, e := range seen {
		if e.Event == "progress" {
			progress = append(progress, decode(t, e.Data)["phase"].(string))
		}
	}
	if !slices.Contains(progress, "provision") {
		t.Errorf("progress phases before running = %v, want provision", progress)
	}
	// Run sessions publish routing once the pod runs (11.8), just after
	// the running status.
	testkit.Eventually(t, 30*time.Second, func() bool {
		ports, hosts, ok := k.routingOK(t, c.SessionID)
		return ok && slices.Equal(ports, []string{fmt.Sprintf("tcp-%d", port)}) && slices.Equal(hosts, []string{host})
	}, "the run session's Service and Ingress for port %d", port)
	io := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io", nil)
	io.next(t, 10*time.Second, "the seq control frame")
	io.readUntil(t, 30*time.Second, "devkernel hello generation 1 tty=true")
	if err := io.WriteMessage(2, []byte("ping\r")); err != nil {
		t.Fatal(err)
	}
	io.readUntil(t, 20*time.Second, "echo: ping")
	sse.until(t, 30*time.Second, func(e sseEvent) bool {
		return e.Event == "reachability" && strings.Contains(e.Data, fmt.Sprintf(`"port":%d,"state":"reachable"`, port))
	})
	pod := k.pod(t, c.SessionID)
	if resp := do(t, "GET", fmt.Sprintf("http://%s:%d/", pod.Status.PodIP, port), nil, nil); !strings.Contains(string(resp.Body), "devkernel hello generation 1") {
		t.Errorf("port on the pod IP answered %q", resp.Body)
	}
	// A non-zero exit fails the pod, and a Failed pod is a failed session
	// with the container's story (11.13); only Succeeded maps to exited.
	rest := sse.drain(t, 60*time.Second)
	if last := rest[len(rest)-1]; last.Event != "status" || last.Data != `{"type":"status","status":{"kind":"failed","message":"container \"session\" failed: Error (exit code 3)"}}` {
		t.Fatalf("last event = %+v, want status failed with the container's exit code 3", last)
	}
	if code, reason, _ := io.closeCode(t, 10*time.Second); code != 1000 || reason != "session terminal" {
		t.Fatalf("io close = %d %q", code, reason)
	}
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE = %d %s", resp.Status, resp.Body)
	}
	k.gone(t, c.SessionID)

	// Exit code 0: the pod Succeeded, the session exited{code: 0}.
	c = r.create(t, runBody(manifest("bye", nil, map[string]any{"exitAfterMs": 200}), nil, false))
	rest = openSSE(t, r.URL+c.StreamURL, nil).drain(t, 60*time.Second)
	if last := rest[len(rest)-1]; last.Data != `{"type":"status","status":{"kind":"exited","code":0}}` {
		t.Fatalf("last event = %+v, want status exited code 0", last)
	}
	do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil)
	k.gone(t, c.SessionID)
}

// Two apps in one watch pod: the pod as stored, edits reload only their
// app, a broken manifest fails a run but not the session, ports come,
// are rejected and go with the Service and Ingress patched live, reload,
// and deletion leaves nothing.
func kubeWatchTwoApps(t *testing.T, k *kubeCluster, r *runner) {
	webPort, newPort, workerPort := freePort(t), freePort(t), freePort(t)
	files := map[string]string{
		"web/telo.yaml":    manifest("web", []int{webPort}, nil),
		"worker/telo.yaml": manifest("worker", []int{workerPort}, nil),
		"README.md":        "hello\n",
	}
	c := r.create(t, watchBody(files, []app{{Name: "web", Entry: "web/telo.yaml", Ports: []int{webPort}}, {Name: "worker", Entry: "worker/telo.yaml", Ports: []int{workerPort}, IO: "streams"}}, ""))
	id := c.SessionID
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	// 90 s for the first run as for running: on a loaded 2-core machine
	// the kernel's first run took longer than 30 s (count=3 run of this
	// suite). The kernel may report it before the status turns running.
	seen := sse.untilAll(t, 90*time.Second, isStatus("running"), isRun("web", "started", 1))
	st := decode(t, lastMatch(t, seen, isStatus("running")).Data)["status"].(map[string]any)
	var hosts []string
	for _, e := range st["endpoints"].([]any) {
		hosts = append(hosts, e.(map[string]any)["host"].(string))
	}
	if !slices.Equal(hosts, []string{kubeHost(webPort, id), kubeHost(workerPort, id)}) {
		t.Fatalf("running endpoint hosts = %v", hosts)
	}

	checkWatchPod(t, k.pod(t, id))
	checkRunsAsPodUser(t, k.pod(t, id))
	ports, ingHosts := k.routing(t, id)
	want := []string{fmt.Sprintf("tcp-%d", webPort), fmt.Sprintf("tcp-%d", workerPort)}
	slices.Sort(want)
	if !slices.Equal(ports, want) || len(ingHosts) != 2 {
		t.Fatalf("routing before the change = %v %v, want %v", ports, ingHosts, want)
	}

	// The tree through the workspace server in the pod.
	var tree struct {
		Files []struct{ Path string } `json:"files"`
	}
	do(t, "GET", r.URL+"/v1/sessions/"+id+"/workspace", nil, nil).json(t, &tree)
	var paths []string
	for _, f := range tree.Files {
		paths = append(paths, f.Path)
	}
	if got := strings.Join(paths, ","); got != "README.md,telo-workspace.yaml,web/telo.yaml,worker/telo.yaml" {
		t.Fatalf("tree paths = %s", got)
	}

	// Edit web: generation 2 by watch; worker untouched.
	if resp := writeFiles(t, r, id, map[string]string{"web/telo.yaml": manifest("web", []int{webPort}, map[string]any{"startDelayMs": 1})}); resp.Status != 200 {
		t.Fatalf("POST workspace = %d %s", resp.Status, resp.Body)
	}
	evs := sse.until(t, 30*time.Second, isRun("web", "started", 2))
	if last := decode(t, evs[len(evs)-1].Data); last["trigger"] != "watch" {
		t.Fatalf("web generation 2 = %v, want trigger watch", last)
	}
	for _, e := range evs {
		if e.Event == "run" && strings.Contains(e.Data, `"app":"worker"`) && !isRun("worker", "started", 1)(e) {
			t.Fatalf("worker got a run event from web's edit: %s", e.Data)
		}
	}

	// Broken manifest: a failed run, the session keeps running.
	writeFiles(t, r, id, map[string]string{"web/telo.yaml": "kind: Nope\n"})
	evs = sse.until(t, 30*time.Second, isRun("web", "failed", 0))
	failed := decode(t, evs[len(evs)-1].Data)
	if failed["reason"] != "ERR_MANIFEST_VALIDATION_FAILED" {
		t.Fatalf("failed run = %v", failed)
	}
	failedGen := int(failed["generation"].(float64))
	var doc map[string]any
	do(t, "GET", r.URL+"/v1/sessions/"+id, nil, nil).json(t, &doc)
	if doc["status"].(map[string]any)["kind"] != "running" {
		t.Fatalf("session after a failed run = %v", doc["status"])
	}

	// A port added: endpoints with its ingress host, then reachable on the
	// pod IP; Service and Ingress patched in place (same pod, no restart).
	isEndpoints := func(e sseEvent) bool { return e.Event == "endpoints" && strings.Contains(e.Data, `"app":"web"`) }
	writeFiles(t, r, id, map[string]string{"web/telo.yaml": manifest("web", []int{webPort, newPort}, nil)})
	sse.until(t, 30*time.Second, isRun("web", "started", failedGen+1))
	evs = sse.until(t, 30*time.Second, isEndpoints)
	ep := decode(t, evs[len(evs)-1].Data)
	added, _ := ep["added"].([]any)
	if len(added) != 1 || added[0].(map[string]any)["host"] != kubeHost(newPort, id) || added[0].(map[string]any)["url"] != "https://"+kubeHost(newPort, id) || ep["rejected"] != nil || ep["removed"] != nil {
		t.Fatalf("endpoints = %v, want exactly %s added", ep, kubeHost(newPort, id))
	}
	sse.until(t, 30*time.Second, func(e sseEvent) bool {
		return e.Event == "reachability" && strings.Contains(e.Data, fmt.Sprintf(`"port":%d,"state":"reachable"`, newPort))
	})
	pod := k.pod(t, id)
	if resp := do(t, "GET", fmt.Sprintf("http://%s:%d/", pod.Status.PodIP, newPort), nil, nil); !strings.Contains(string(resp.Body), "devkernel web") {
		t.Fatalf("new port on the pod IP answered %q", resp.Body)
	}
	ports, ingHosts = k.routing(t, id)
	want = append(want, fmt.Sprintf("tcp-%d", newPort))
	slices.Sort(want)
	if !slices.Equal(ports, want) || !slices.Contains(ingHosts, kubeHost(newPort, id)) || len(ingHosts) != 3 {
		t.Fatalf("routing after the change = %v %v, want %v", ports, ingHosts, want)
	}

	// The other app's port is rejected for web; routing is unchanged.
	writeFiles(t, r, id, map[string]string{"web/telo.yaml": manifest("web", []int{webPort, newPort, workerPort}, nil)})
	evs = sse.until(t, 30*time.Second, isEndpoints)
	ep = decode(t, evs[len(evs)-1].Data)
	rejected, _ := ep["rejected"].([]any)
	if len(rejected) != 1 || rejected[0].(map[string]any)["port"].(float64) != float64(workerPort) || !strings.Contains(rejected[0].(map[string]any)["reason"].(string), "another app") || ep["added"] != nil {
		t.Fatalf("endpoints = %v, want worker's port %d rejected", ep, workerPort)
	}
	if ports, _ := k.routing(t, id); !slices.Equal(ports, want) {
		t.Fatalf("routing after a rejection = %v, want %v", ports, want)
	}

	// A port removed: the Service and Ingress lose it.
	writeFiles(t, r, id, map[string]string{"web/telo.yaml": manifest("web", []int{webPort}, nil)})
	evs = sse.until(t, 30*time.Second, func(e sseEvent) bool { return isEndpoints(e) && strings.Contains(e.Data, `"removed"`) })
	ep = decode(t, evs[len(evs)-1].Data)
	if removed := ep["removed"].([]any); len(removed) != 1 || removed[0].(map[string]any)["host"] != kubeHost(newPort, id) {
		t.Fatalf("endpoints = %v, want %s removed", ep, kubeHost(newPort, id))
	}
	ports, ingHosts = k.routing(t, id)
	if slices.Contains(ports, fmt.Sprintf("tcp-%d", newPort)) || slices.Contains(ingHosts, kubeHost(newPort, id)) || len(ports) != 2 {
		t.Fatalf("routing after the removal = %v %v", ports, ingHosts)
	}
	do(t, "GET", r.URL+"/v1/sessions/"+id, nil, nil).json(t, &doc)
	for _, a := range doc["apps"].([]any) {
		if am := a.(map[string]any); am["name"] == "web" && len(am["ports"].([]any)) != 1 {
			t.Fatalf("web ports in the session document = %v, want 1", am["ports"])
		}
	}
	if again := k.pod(t, id); again.UID != pod.UID {
		t.Fatalf("port changes re-created the pod (%s → %s)", pod.UID, again.UID)
	}

	// Manual reload of one app.
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/reload?app=worker", nil, nil); resp.Status != 202 || string(resp.Body) != `{"reloaded":["worker"]}` {
		t.Fatalf("reload = %d %s", resp.Status, resp.Body)
	}
	evs = sse.until(t, 30*time.Second, isRun("worker", "started", 2))
	if !strings.Contains(evs[len(evs)-1].Data, `"trigger":"manual"`) {
		t.Fatalf("reload run = %s, want manual", evs[len(evs)-1].Data)
	}

	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+id, nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE = %d", resp.Status)
	}
	sse.until(t, 30*time.Second, isStatus("stopped"))
	k.gone(t, id)
}

// checkWatchPod asserts the watch pod as the API server stored it:
// security context, the env split, the shared volumes.
func checkWatchPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	s := p.Spec
	if p.Labels["app.kubernetes.io/managed-by"] != kubeManagedBy || p.Labels["telo.run/mode"] != "watch" {
		t.Errorf("pod labels = %v", p.Labels)
	}
	if sc := s.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.FSGroup == nil || *sc.FSGroup != 1000 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v", s.SecurityContext)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken || s.RestartPolicy != corev1.RestartPolicyNever && s.RestartPolicy != corev1.RestartPolicyAlways || s.ActiveDeadlineSeconds == nil {
		t.Errorf("pod spec: automount %v restart %v deadline %v", s.AutomountServiceAccountToken, s.RestartPolicy, s.ActiveDeadlineSeconds)
	}
	vols := map[string]bool{}
	for _, v := range s.Volumes {
		vols[v.Name] = v.EmptyDir != nil
	}
	if !vols["workspace"] {
		t.Errorf("volumes = %+v, want a workspace emptyDir", s.Volumes)
	}
	var names []string
	for _, c := range s.Containers {
		names = append(names, c.Name)
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		mounts := map[string]string{}
		for _, m := range c.VolumeMounts {
			mounts[m.MountPath] = m.Name
		}
		if mounts["/workspace"] != "workspace" {
			t.Errorf("container %s mounts = %v, want the shared /workspace", c.Name, mounts)
		}
		if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s security context = %+v", c.Name, c.SecurityContext)
		}
		switch {
		case c.Name == "workspace":
			if _, ok := env["SESSION_SECRET"]; ok || env["WORKSPACE_DIR"] != "/workspace" {
				t.Errorf("workspace env = %v: no session env, WORKSPACE_DIR=/workspace", env)
			}
		case strings.HasPrefix(c.Name, "app-"):
			if env["SESSION_SECRET"] != "s3cr3t" || env["TELO_CACHE_DIR"] != "" || !c.Stdin {
				t.Errorf("%s env = %v stdin %v: want the session env, no TELO_CACHE_DIR", c.Name, env, c.Stdin)
			}
			if tty := c.Name == "app-web"; c.TTY != tty {
				t.Errorf("%s tty = %v, want %v", c.Name, c.TTY, tty)
			}
		}
	}
	if !slices.Equal(names, []string{"workspace", "app-web", "app-worker"}) {
		t.Errorf("containers = %v", names)
	}
}

// io through pods/attach: streams apps get stdout (1) and stderr (2) and
// refuse resize; tty apps get tag 0 with colour. Output written before
// the attach is not replayed (11.14), so each app is reloaded while its
// client listens.
func kubeWatchIOModes(t *testing.T, k *kubeCluster, r *runner) {
	files := map[string]string{"a/telo.yaml": manifest("tty-app", nil, nil), "b/telo.yaml": manifest("streams-app", nil, nil)}
	c := r.create(t, watchBody(files, []app{{Name: "tty", Entry: "a/telo.yaml"}, {Name: "pipes", Entry: "b/telo.yaml", IO: "streams"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	sse.untilAll(t, 90*time.Second, isStatus("running"), isRun("pipes", "started", 1), isRun("tty", "started", 1))

	p := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?app=pipes", nil)
	if f := p.next(t, 10*time.Second, "the streams app's seq control frame"); !strings.Contains(f.Text, `"io":"streams"`) {
		t.Fatalf("seq frame = %+v", f)
	}
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/reload?app=pipes", nil, nil); resp.Status != 202 {
		t.Fatalf("reload pipes = %d %s", resp.Status, resp.Body)
	}
	if out, _ := p.readStreams(t, 30*time.Second, "generation 2 tty=false", "ready"); strings.Contains(out, "\x1b[") {
		t.Errorf("streams stdout coloured: %q", out)
	}
	if err := p.WriteMessage(1, []byte(`{"type":"resize","cols":80,"rows":24}`)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		f := p.next(t, time.Until(deadline), "the resize_unsupported reply")
		if f.Text == "" {
			continue // more output of the reloaded generation
		}
		if f.Text != `{"type":"error","error":"resize_unsupported","io":"streams"}` {
			t.Fatalf("resize reply = %+v", f)
		}
		break
	}

	tty := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?app=tty", nil)
	if f := tty.next(t, 10*time.Second, "the tty app's seq control frame"); !strings.Contains(f.Text, `"io":"tty"`) {
		t.Fatalf("tty seq frame = %+v", f)
	}
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/reload?app=tty", nil, nil); resp.Status != 202 {
		t.Fatalf("reload tty = %d %s", resp.Status, resp.Body)
	}
	frames, text := tty.readUntil(t, 30*time.Second, "generation 2 tty=true")
	for _, f := range frames {
		if f.Text == "" && f.Tag != 0 {
			t.Fatalf("tty frame tag %d", f.Tag)
		}
	}
	if !strings.Contains(text, "\x1b[") {
		t.Errorf("tty banner not coloured (CLICOLOR_FORCE): %q", text)
	}
	if err := tty.WriteMessage(2, []byte("hi\r")); err != nil {
		t.Fatal(err)
	}
	tty.readUntil(t, 20*time.Second, "echo: hi")
	do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil)
	sse.until(t, 30*time.Second, isStatus("stopped"))
	k.gone(t, c.SessionID)
}

// kubeOrphans creates a pod with the runner's label that no session owns
// (a driver died holding it) and one without the label.
func kubeOrphans(t *testing.T, k *kubeCluster) {
	ctx := context.Background()
	orphan := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "telo-run-orphan000001", Labels: map[string]string{
			"app.kubernetes.io/managed-by": kubeManagedBy, labelSession: "orphan000001"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: new(false),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(1000)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "session", Image: kubeKernelImage, Command: []string{"telo", "run", "--watch", "/nowhere/telo.yaml"},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: new(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		},
	}
	bystander := orphan.DeepCopy()
	bystander.Name, bystander.Labels = "not-ours", map[string]string{"app": "other"}
	for _, p := range []*corev1.Pod{orphan, bystander} {
		if _, err := k.admin.CoreV1().Pods(k.env.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
	}
}

// checkRunsAsPodUser reads each running container's process (the stand-in
// kubelet's container ids are standin://<pid>) and checks it runs as the
// pod's non-root user with the shared fsGroup: the runner's binaries work
// unprivileged on the pod's volumes.
func checkRunsAsPodUser(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) || len(p.Spec.Containers) == 0 {
		t.Fatalf("container statuses %d for %d containers", len(p.Status.ContainerStatuses), len(p.Spec.Containers))
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil {
			t.Errorf("container %s not running: %+v", cs.Name, cs.State)
			continue
		}
		pid := strings.TrimPrefix(cs.ContainerID, "standin://")
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			t.Errorf("container %s (%s): %v", cs.Name, cs.ContainerID, err)
			continue
		}
		fields := map[string][]string{}
		for _, line := range strings.Split(string(status), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.Fields(v)
			}
		}
		if uid := fields["Uid"]; len(uid) < 2 || uid[0] != "1000" || uid[1] != "1000" {
			t.Errorf("container %s runs as uid %v, want 1000 (runAsUser)", cs.Name, uid)
		}
		if gid := fields["Gid"]; len(gid) < 1 || gid[0] != "1000" || !slices.Contains(fields["Groups"], "1000") {
			t.Errorf("container %s gid %v groups %v, want 1000 and the fsGroup 1000", cs.Name, gid, fields["Groups"])
		}
	}
}

// The co-resident agent in its own container: its endpoint is routed with
// a host, it works on the shared workspace, an app may not take its port,
// and the credential boundary holds in the processes' real environments
// (operator env on the agent only, session env on the apps only, neither
// on the workspace server).
func kubeAgent(t *testing.T, k *kubeCluster, r *runner) {
	files := map[string]string{"telo.yaml": manifest("creds", nil, nil)}
	c := r.create(t, watchBody(files, []app{{Name: "app", Entry: "telo.yaml"}}, "helper"))
	id := c.SessionID
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	evs := sse.until(t, 90*time.Second, isStatus("running"))
	st := decode(t, evs[len(evs)-1].Data)["status"].(map[string]any)
	host := kubeHost(k.agentPort, id)
	if ag, _ := st["agent"].(map[string]any); ag == nil || ag["port"].(float64) != float64(k.agentPort) || ag["host"] != host || ag["url"] != "https://"+host {
		t.Fatalf("running.agent = %v, want %s", st["agent"], host)
	}
	if ports, hosts := k.routing(t, id); !slices.Equal(ports, []string{fmt.Sprintf("tcp-%d", k.agentPort)}) || !slices.Equal(hosts, []string{host}) {
		t.Fatalf("routing = %v %v, want the agent's port", ports, hosts)
	}
	pod := k.pod(t, id)
	var tree struct{ Files []struct{ Path string } }
	testkit.Eventually(t, 30*time.Second, func() bool {
		// The agent may not listen yet when the session reports running:
		// a refused connection is "not yet", not a failure.
		resp, err := http.Get(fmt.Sprintf("http://%s:%d/workspace", pod.Status.PodIP, k.agentPort))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && json.Unmarshal(body, &tree) == nil && len(tree.Files) > 0
	}, "the agent serving the shared workspace on its port")
	if !slices.ContainsFunc(tree.Files, func(f struct{ Path string }) bool { return f.Path == "telo.yaml" }) {
		t.Errorf("the agent's view of the workspace = %+v, want telo.yaml", tree.Files)
	}

	// The processes' environments.
	names := map[string]bool{}
	for _, cs := range pod.Status.ContainerStatuses {
		names[cs.Name] = true
		env := procEnv(t, cs)
		has := func(kv string) bool { return slices.Contains(env, kv) }
		hasKey := func(key string) bool {
			return slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, key+"=") })
		}
		switch cs.Name {
		case "agent":
			if !has("OPERATOR_KEY=op-k3y") || !has("WORKSPACE_DIR=/workspace") || hasKey("SESSION_SECRET") {
				t.Errorf("agent env = %v: want the operator env and WORKSPACE_DIR, no session env", env)
			}
		case "app-app":
			if !has("SESSION_SECRET=s3cr3t") || hasKey("OPERATOR_KEY") || hasKey("TELO_CACHE_DIR") {
				t.Errorf("app env = %v: want the session env only", env)
			}
		case "workspace":
			if hasKey("SESSION_SECRET") || hasKey("OPERATOR_KEY") {
				t.Errorf("workspace env = %v: want no credentials", env)
			}
		}
	}
	if !names["agent"] || !names["app-app"] || !names["workspace"] {
		t.Fatalf("containers = %v", names)
	}

	// An app declaring the agent's port is refused it.
	writeFiles(t, r, id, map[string]string{"telo.yaml": manifest("creds", []int{k.agentPort}, nil)})
	evs = sse.until(t, 30*time.Second, func(e sseEvent) bool { return e.Event == "endpoints" })
	ep := decode(t, evs[len(evs)-1].Data)
	if rej, _ := ep["rejected"].([]any); len(rej) != 1 || !strings.Contains(rej[0].(map[string]any)["reason"].(string), "agent") || ep["added"] != nil {
		t.Fatalf("endpoints = %v, want the agent's port rejected", ep)
	}
	do(t, "DELETE", r.URL+"/v1/sessions/"+id, nil, nil)
	sse.until(t, 30*time.Second, isStatus("stopped"))
	k.gone(t, id)
}

// procEnv is a running container's process environment (the stand-in
// kubelet's container ids are standin://<pid>).
func procEnv(t *testing.T, cs corev1.ContainerStatus) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strings.TrimPrefix(cs.ContainerID, "standin://") + "/environ")
	if err != nil {
		t.Fatalf("container %s (%s): %v", cs.Name, cs.ContainerID, err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}
