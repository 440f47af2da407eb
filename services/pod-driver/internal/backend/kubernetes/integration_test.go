package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"go.uber.org/goleak"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
	kube "github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
	"github.com/telorunner/telorunner/tools/kubetest"
)

const (
	kernelImage    = "telorun/node:test"
	workspaceImage = "telorunner/workspace-server:test"
	domain         = "sessions.example.test"
	waitLong       = 30 * time.Second
)

var bins struct{ devkernel, workspace, layer string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kube-backend-bins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Named telo: watch app containers run sh -c '… exec telo …' and the
	// stand-in kubelet puts the image program's directory first on PATH.
	bins.devkernel = filepath.Join(dir, "telo")
	bins.workspace = filepath.Join(dir, "workspace-server")
	bins.layer = filepath.Join(dir, "telo-layer")
	root, err := filepath.Abs("../../..") // services/pod-driver
	if err == nil {
		err = build(filepath.Join(root, "..", "..", "tools", "devkernel"), bins.devkernel, "./cmd/devkernel")
	}
	if err == nil {
		err = build(filepath.Join(root, "..", "workspace-proxy"), bins.workspace, "./cmd/workspace-server")
	}
	if err == nil {
		err = build(root, bins.layer, "./cmd/telo-layer")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	// Every workload's goroutines (attach, relays, watchers, monitors) end
	// with it; only client-go's idle keep-alive connections may remain.
	// client-go's WebSocket attach heartbeat notices a closed connection
	// at its next ping (every 5 s), so the check waits that long.
	if code == 0 {
		var err error
		testkit.Poll(context.Background(), 8*time.Second, func() bool {
			err = goleak.Find(
				goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
				goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
				goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
			)
			return err == nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func build(dir, out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

type cluster struct {
	env   *kubetest.Env
	admin k8s.Interface
	b     *kube.Backend
}

func newCluster(t *testing.T, kubelet bool) *cluster {
	t.Helper()
	return newClusterWith(t, kubelet, nil)
}

// newClusterWith is newCluster with the backend's options changed by edit.
func newClusterWith(t *testing.T, kubelet bool, edit func(*kube.Options)) *cluster {
	t.Helper()
	env := kubetest.Start(t, kubetest.Options{})
	if kubelet {
		env.StartKubelet(t, kubetest.KubeletOptions{
			Images: map[string]string{kernelImage: bins.devkernel, workspaceImage: bins.workspace},
			// Until kubetest passes --root itself.
			Args: []string{"--root", t.TempDir(), "--log-level", "debug"},
		})
	}
	admin, err := k8s.NewForConfig(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	opts := kube.Options{
		RestConfig: env.Driver, Namespace: env.Namespace,
		KernelImage: kernelImage, WorkspaceImage: workspaceImage,
		IngressBaseDomain: domain,
		RunLimits:         kube.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
		AppLimits:         kube.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600},
		StartDeadline:     20 * time.Second,
		WorkspaceReady:    20 * time.Second,
		Reach:             kernelwire.ReachTiming{Interval: 100 * time.Millisecond, Deadline: 5 * time.Second, SlowInterval: time.Second},
		RelayRetry:        100 * time.Millisecond,
	}
	if edit != nil {
		edit(&opts)
	}
	b, err := kube.New(opts)
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	return &cluster{env: env, admin: admin, b: b}
}

// recorder is a backend.Sink that keeps everything.
type recorder struct {
	mu        sync.Mutex
	out       map[string]*bytes.Buffer
	debug     map[string][]string
	ended     []string
	reach     map[string]string
	running   []contract.Endpoint
	wsURL     string
	progress  []string
	runningAt int
	diag      []string // "<app> <tag> <line>" of each [runner] line
}

func newRecorder() *recorder {
	return &recorder{out: map[string]*bytes.Buffer{}, debug: map[string][]string{}, reach: map[string]string{}}
}

func (r *recorder) Progress(phase, msg string, done bool, app string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress = append(r.progress, phase+": "+msg)
}
func (r *recorder) Running(eps []contract.Endpoint, _ *contract.Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running = eps
	r.runningAt++
}
func (r *recorder) Output(app string, tag byte, p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out[app] == nil {
		r.out[app] = &bytes.Buffer{}
	}
	r.out[app].Write(p)
	if bytes.Contains(p, []byte("[runner]")) {
		r.diag = append(r.diag, fmt.Sprintf("%s %d %s", app, tag, bytes.TrimSpace(p)))
	}
}
func (r *recorder) Debug(app string, frame json.RawMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var f struct {
		Kind, Event string
	}
	_ = json.Unmarshal(frame, &f)
	if f.Kind == "event" {
		r.debug[app] = append(r.debug[app], f.Event)
	}
}
func (r *recorder) RunEnded(app string, code *int, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = append(r.ended, app+": "+reason)
}
func (r *recorder) Reachability(app string, port int, state string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reach[fmt.Sprintf("%s/%d", app, port)] = state
}
func (r *recorder) WorkspaceReady(url string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wsURL = url
}

func (r *recorder) output(app string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out[app] == nil {
		return ""
	}
	return r.out[app].String()
}

func (r *recorder) events(app string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.debug[app])
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testkit.Poll(context.Background(), waitLong, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func manifest(name string, port int, extra string) string {
	s := "kind: Telo.Application\nmetadata:\n  name: " + name + "\n"
	if port != 0 {
		s += fmt.Sprintf("ports:\n  http:\n    env: PORT_%s\n    default: %d\n", strings.ToUpper(name), port)
	}
	return s + extra
}

func TestRunSessionIOAndExit(t *testing.T) {
	c := newCluster(t, true)
	rec := newRecorder()
	id := contract.NewSessionID()
	spec := backend.Spec{
		SessionID: id, Mode: contract.ModeRun, Inspect: true,
		Env:    map[string]string{"GREETING": "hi", "TELO_CACHE_DIR": "/session-choice"},
		Config: contract.SessionConfig{PullPolicy: "always"},
		Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{
			{RelativePath: "telo.yaml", Contents: manifest("runner", 0, "x-devkernel:\n  startDelayMs: 1500\n")},
		}},
		Apps: []backend.App{{Name: "app", Entry: "telo.yaml", IO: contract.IOTTY}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	w, err := c.b.Start(ctx, spec, rec)
	if err != nil {
		t.Fatalf("Start() error = %v", err)
	}
	poll(t, "tty banner via attach", func() bool { return strings.Contains(rec.output("app"), "devkernel runner generation 1 tty=true") })
	if err := w.Stdin("app", []byte("hello pod\r")); err != nil {
		t.Fatalf("Stdin() = %v", err)
	}
	poll(t, "stdin echo", func() bool { return strings.Contains(rec.output("app"), "echo: hello pod") })
	poll(t, "Kernel.Started relayed", func() bool { return slices.Contains(rec.events("app"), "Kernel.Started") })

	// The pod as the API server holds it: the CLI's flags before the path
	// (A42), the request's pull policy, no TELO_CACHE_DIR on its read-only
	// root (neither the runner's nor the session's).
	pod, err := c.admin.CoreV1().Pods(c.env.Namespace).Get(ctx, podspec.RunPodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get run pod: %v", err)
	}
	sc := pod.Spec.Containers[0]
	if want := []string{"telo", "run", "--no-cache-write", "--inspect", "0.0.0.0:9230", "--no-open", "/app/telo.yaml"}; !slices.Equal(sc.Command, want) {
		t.Errorf("run pod command = %v, want %v", sc.Command, want)
	}
	if sc.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("run pod imagePullPolicy = %v, want Always (pullPolicy always)", sc.ImagePullPolicy)
	}
	for _, e := range sc.Env {
		if e.Name == "TELO_CACHE_DIR" {
			t.Errorf("run pod env has TELO_CACHE_DIR=%q, want none", e.Value)
		}
	}
	if sc.SecurityContext == nil || sc.SecurityContext.ReadOnlyRootFilesystem == nil || !*sc.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("run pod root filesystem not read-only")
	}

	cm, err := c.admin.CoreV1().ConfigMaps(c.env.Namespace).Get(ctx, podspec.BundleConfigMapName(id), metav1.GetOptions{})
	if err != nil || len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].Name != podspec.RunPodName(id) {
		t.Errorf("bundle configmap = %+v, %v; want owned by the pod", cm, err)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if ex := w.Exit(); !ex.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", ex)
	}
	poll(t, "bundle configmap collected", func() bool {
		_, err := c.admin.CoreV1().ConfigMaps(c.env.Namespace).Get(ctx, podspec.BundleConfigMapName(id), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

func TestRunSessionExitCode(t *testing.T) {
	c := newCluster(t, true)
	tests := []struct {
		name    string
		code    int
		wantErr string // "" = Exit.Code == code (pod Succeeded)
	}{
		{"succeeded", 0, ""},
		{"failed", 3, `container "session" failed: `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := backend.Spec{
				SessionID: contract.NewSessionID(), Mode: contract.ModeRun,
				Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{
					{RelativePath: "telo.yaml", Contents: manifest("quick", 0, fmt.Sprintf("x-devkernel:\n  exitAfterMs: 200\n  exitCode: %d\n", tt.code))},
				}},
				Apps: []backend.App{{Name: "app", Entry: "telo.yaml", IO: contract.IOStreams}},
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			w, err := c.b.Start(ctx, spec, newRecorder())
			if err != nil {
				t.Fatalf("Start() error = %v", err)
			}
			select {
			case <-w.Done():
			case <-ctx.Done():
				t.Fatal("workload did not end")
			}
			ex := w.Exit()
			switch {
			case tt.wantErr == "" && (ex.Err != nil || ex.Code == nil || *ex.Code != tt.code):
				t.Errorf("Exit() = %+v (err %v), want code %d", ex, ex.Err, tt.code)
			case tt.wantErr != "" && (ex.Err == nil || !strings.Contains(ex.Err.Error(), tt.wantErr) || !strings.Contains(ex.Err.Error(), fmt.Sprintf("(exit code %d)", tt.code))):
				t.Errorf("Exit() = %+v (err %v), want a failure %q… (exit code %d)", ex, ex.Err, tt.wantErr, tt.code)
			}
		})
	}
}

func TestWatchSession(t *testing.T) {
	c := newCluster(t, true)
	rec := newRecorder()
	id := contract.NewSessionID()
	spec := backend.Spec{
		SessionID: id, Mode: contract.ModeWatch,
		Env: map[string]string{"SESSION_ONLY": "1"},
		Bundle: contract.Bundle{EntryRelativePath: "web/telo.yaml", Files: []contract.BundleFile{
			{RelativePath: "web/telo.yaml", Contents: manifest("web", 18081, "")},
			{RelativePath: "worker/telo.yaml", Contents: manifest("worker", 0, "")},
		}},
		Apps: []backend.App{
			{Name: "web", Entry: "web/telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{{Port: 18081, Protocol: "tcp"}}},
			{Name: "worker", Entry: "worker/telo.yaml", IO: contract.IOStreams},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	bw, err := c.b.Start(ctx, spec, rec)
	if err != nil {
		t.Fatalf("Start() error = %v", err)
	}
	w := bw.(*kube.WatchWorkload)
	if want := []contract.Endpoint{{Host: "18081-" + id + "." + domain, Port: 18081, Protocol: "tcp", URL: "https://18081-" + id + "." + domain}}; !slices.Equal(rec.running, want) {
		t.Errorf("Running() endpoints = %+v, want %+v", rec.running, want)
	}
	// The tree through the workspace server at the pod IP.
	wsc := kernelwire.WorkspaceClient{Base: rec.wsURL}
	if err := wsc.Ping(ctx); err != nil {
		t.Fatalf("workspace at %s: %v", rec.wsURL, err)
	}
	for _, app := range []string{"web", "worker"} {
		poll(t, app+" Kernel.Started", func() bool { return slices.Contains(rec.events(app), "Kernel.Started") })
	}
	poll(t, "web port reachable", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.reach["web/18081"] == contract.ReachReachable
	})
	// Edit → generation 2 through the relay.
	if err := wsc.Apply(ctx, kernelwire.ChangeSet{Write: []kernelwire.Write{{Path: "worker/telo.yaml", Content: manifest("worker", 0, "# edit\n"), Encoding: "utf8"}}}); err != nil {
		t.Fatalf("edit: %v", err)
	}
	poll(t, "worker Kernel.Starting gen 2", func() bool {
		n := 0
		for _, e := range rec.events("worker") {
			if e == "Kernel.Starting" {
				n++
			}
		}
		return n >= 2
	})

	svcs, ings := c.admin.CoreV1().Services(c.env.Namespace), c.admin.NetworkingV1().Ingresses(c.env.Namespace)
	checkRouting(t, ctx, c, id, w, []string{"tcp-18081"})
	// Live port change: add udp and tcp ports to worker.
	workerPorts := []contract.PortMapping{{Port: 18090, Protocol: "tcp"}, {Port: 18081, Protocol: "udp"}}
	if err := w.SetPorts(ctx, "worker", workerPorts); err != nil {
		t.Fatalf("SetPorts() error = %v", err)
	}
	eps := w.Endpoints(workerPorts)
	if len(eps) != 2 || eps[0].Host != "18090-"+id+"."+domain || eps[1].Host != "" {
		t.Errorf("SetPorts() endpoints = %+v", eps)
	}
	checkRouting(t, ctx, c, id, w, []string{"tcp-18081", "tcp-18090", "udp-18081"})

	// A routing failure on the real API server rolls back (19 item 19):
	// with Ingress writes refused to the driver, SetPorts replaces the
	// Service, is refused the Ingress, publishes the Service again with
	// the previous set and fails; the previous set stays the app's set.
	allowIngressWrites(t, ctx, c, false)
	if err := w.SetPorts(ctx, "worker", []contract.PortMapping{{Port: 18099, Protocol: "tcp"}}); err == nil || !strings.Contains(err.Error(), "publish ingress") {
		t.Fatalf("SetPorts() with Ingress writes refused = %v, want the ingress publish error", err)
	}
	checkRouting(t, ctx, c, id, w, []string{"tcp-18081", "tcp-18090", "udp-18081"})
	allowIngressWrites(t, ctx, c, true)
	// Publishing another app's set routes worker's previous ports, not the
	// refused 18099.
	if err := w.SetPorts(ctx, "web", []contract.PortMapping{{Port: 18081, Protocol: "tcp"}}); err != nil {
		t.Fatalf("SetPorts(web) after the rollback = %v", err)
	}
	checkRouting(t, ctx, c, id, w, []string{"tcp-18081", "tcp-18090", "udp-18081"})

	pod, err := c.admin.CoreV1().Pods(c.env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: podspec.LabelSession + "=" + id})
	if err != nil || len(pod.Items) != 1 {
		t.Fatalf("session pods = %v, %v", pod, err)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if ex := w.Exit(); !ex.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", ex)
	}
	poll(t, "service and ingress collected with the pod", func() bool {
		_, e1 := svcs.Get(ctx, podspec.RunPodName(id), metav1.GetOptions{})
		_, e2 := ings.Get(ctx, podspec.RunPodName(id), metav1.GetOptions{})
		l, e3 := c.admin.CoreV1().Pods(c.env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: podspec.LabelSession + "=" + id})
		return apierrors.IsNotFound(e1) && apierrors.IsNotFound(e2) && e3 == nil && len(l.Items) == 0
	})
}

// allowIngressWrites grants (allow) or withdraws the driver's create and
// update of Ingresses in its Role, and waits until the API server's
// authorizer answers accordingly.
func allowIngressWrites(t *testing.T, ctx context.Context, c *cluster, allow bool) {
	t.Helper()
	rbac := c.admin.RbacV1().Roles(c.env.Namespace)
	roles, err := rbac.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list roles: %v", err)
	}
	changed := 0
	for i := range roles.Items {
		r := &roles.Items[i]
		touched := false
		for j := range r.Rules {
			if !slices.Contains(r.Rules[j].Resources, "ingresses") {
				continue
			}
			verbs := slices.DeleteFunc(slices.Clone(r.Rules[j].Verbs), func(v string) bool { return v == "create" || v == "update" })
			if allow {
				verbs = append(verbs, "create", "update")
			}
			r.Rules[j].Verbs, touched = verbs, true
		}
		if touched {
			if _, err := rbac.Update(ctx, r, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("update role %s: %v", r.Name, err)
			}
			changed++
		}
	}
	if changed == 0 {
		t.Fatal("no Role of the driver grants ingresses")
	}
	driver, err := k8s.NewForConfig(c.env.Driver)
	if err != nil {
		t.Fatal(err)
	}
	poll(t, fmt.Sprintf("the driver's Ingress update allowed = %t", allow), func() bool {
		rev, err := driver.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: c.env.Namespace, Verb: "update", Group: "networking.k8s.io", Resource: "ingresses"},
		}}, metav1.CreateOptions{})
		return err == nil && rev.Status.Allowed == allow
	})
}

func checkRouting(t *testing.T, ctx context.Context, c *cluster, id string, w *kube.WatchWorkload, wantPorts []string) {
	t.Helper()
	svc, err := c.admin.CoreV1().Services(c.env.Namespace).Get(ctx, podspec.RunPodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service: %v", err)
	}
	var names []string
	for _, p := range svc.Spec.Ports {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, wantPorts) {
		t.Errorf("service ports = %v, want %v", names, wantPorts)
	}
	ing, err := c.admin.NetworkingV1().Ingresses(c.env.Namespace).Get(ctx, podspec.RunPodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get ingress: %v", err)
	}
	for _, obj := range []metav1.Object{svc, ing} {
		refs := obj.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "Pod" || !strings.HasPrefix(refs[0].Name, "telo-watch-"+id+"-") || refs[0].Controller == nil || !*refs[0].Controller {
			t.Errorf("%s owner references = %+v, want the watch pod as controller", obj.GetName(), refs)
		}
	}
	for _, r := range ing.Spec.Rules {
		if !strings.HasSuffix(r.Host, "-"+id+"."+domain) {
			t.Errorf("ingress host %q", r.Host)
		}
	}
}

// TestStartDeadlineAndReap needs no kubelet: the pod stays Pending.
func TestStartDeadlineAndReap(t *testing.T) {
	c := newCluster(t, false)
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()

	// Orphans: two managed pods, one of a live session.
	live, dead := contract.NewSessionID(), contract.NewSessionID()
	for _, id := range []string{live, dead} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podspec.RunPodName(id), Labels: map[string]string{
			podspec.LabelManagedBy: kube.DefaultManagedBy, podspec.LabelSession: id}}}
		p.Spec.Containers = []corev1.Container{{Name: "x", Image: kernelImage, SecurityContext: podspec.Hardened()}}
		p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(1000)), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
		if _, err := c.admin.CoreV1().Pods(c.env.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod: %v", err)
		}
	}
	reaped, err := c.b.ReapOrphans(ctx, func(id string) bool { return id == live })
	if err != nil || !slices.Equal(reaped, []string{podspec.RunPodName(dead)}) {
		t.Errorf("ReapOrphans() = %v, %v; want [%s]", reaped, err, podspec.RunPodName(dead))
	}

	b, err := kube.New(kube.Options{
		RestConfig: c.env.Driver, Namespace: c.env.Namespace, KernelImage: kernelImage, WorkspaceImage: workspaceImage,
		RunLimits:     kube.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
		AppLimits:     kube.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600},
		StartDeadline: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every pod shape passes restricted Pod Security admission (the create
	// succeeds) and, with no kubelet, fails at the start deadline, leaving
	// no pod.
	bundle := contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{{RelativePath: "telo.yaml", Contents: "x"}}}
	specs := map[string]backend.Spec{
		"run": {Mode: contract.ModeRun, Bundle: bundle, Inspect: true},
		"app": {Mode: contract.ModeRun, SelfContained: true, Config: contract.SessionConfig{Image: "op/app:1", PullPolicy: "always"}},
		"watch": {Mode: contract.ModeWatch, Bundle: bundle, Env: map[string]string{"A": "1"},
			Agent: &backend.Agent{Name: "agent", Image: "op/agent:1", Port: 7000, Env: map[string]string{"KEY": "k"}}},
	}
	for name, spec := range specs {
		spec.SessionID = contract.NewSessionID()
		_, err = b.Start(ctx, spec, rec)
		se, ok := err.(*backend.StartError)
		if !ok || se.Stage != "start" {
			t.Errorf("%s: Start() error = %v, want a start-stage StartError (admitted, never running)", name, err)
			continue
		}
		l, err := c.admin.CoreV1().Pods(c.env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: podspec.LabelSession + "=" + spec.SessionID})
		if err != nil || len(l.Items) != 0 {
			t.Errorf("%s: pods after failed start = %d, %v; want none", name, len(l.Items), err)
		}
	}
}

// TestAdoptRunSession: a second backend (a new driver) takes over a
// running pod: attach and stdin work through it, and its Stop ends the pod.
func TestAdoptRunSession(t *testing.T) {
	c := newCluster(t, true)
	id := contract.NewSessionID()
	spec := backend.Spec{
		SessionID: id, Mode: contract.ModeRun, Inspect: true,
		Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{
			{RelativePath: "telo.yaml", Contents: manifest("adoptee", 0, "")},
		}},
		Apps: []backend.App{{Name: "app", Entry: "telo.yaml", IO: contract.IOStreams}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	first := newRecorder()
	w1, err := c.b.Start(ctx, spec, first)
	if err != nil {
		t.Fatalf("Start() error = %v", err)
	}
	poll(t, "first owner relays Kernel.Started", func() bool { return slices.Contains(first.events("app"), "Kernel.Started") })

	b2, err := kube.New(kube.Options{
		RestConfig: c.env.Driver, Namespace: c.env.Namespace, KernelImage: kernelImage, WorkspaceImage: workspaceImage,
		RunLimits: kube.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
		AppLimits: kube.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600},
	})
	if err != nil {
		t.Fatal(err)
	}
	second := newRecorder()
	w2, err := b2.Adopt(ctx, spec, second)
	if err != nil {
		t.Fatalf("Adopt() error = %v", err)
	}
	poll(t, "adopted stdin echo", func() bool {
		_ = w2.Stdin("app", []byte("again\n")) // resent each poll until the attach is up
		return strings.Contains(second.output("app"), "echo: again")
	})
	if got := second.events("app"); len(got) != 0 {
		t.Errorf("adopted relay re-delivered history: %v", got)
	}
	stopAdopted(ctx, t, b2, w1, w2)
}

// A second driver adopts a running watch pod by session id: it re-attaches
// every app, relays only new debug frames, restarts nothing, and can patch
// routing and stop the pod.
func TestAdoptWatchSession(t *testing.T) {
	c := newCluster(t, true)
	id := contract.NewSessionID()
	spec := backend.Spec{
		SessionID: id, Mode: contract.ModeWatch,
		Bundle: contract.Bundle{EntryRelativePath: "web/telo.yaml", Files: []contract.BundleFile{
			{RelativePath: "web/telo.yaml", Contents: manifest("web", 18181, "")},
			{RelativePath: "worker/telo.yaml", Contents: manifest("worker", 0, "")},
		}},
		Apps: []backend.App{
			{Name: "web", Entry: "web/telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{{Port: 18181, Protocol: "tcp"}}},
			{Name: "worker", Entry: "worker/telo.yaml", IO: contract.IOStreams},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLong)
	defer cancel()
	first := newRecorder()
	w1, err := c.b.Start(ctx, spec, first)
	if err != nil {
		t.Fatalf("Start() error = %v", err)
	}
	for _, app := range []string{"web", "worker"} {
		poll(t, app+" Kernel.Started (first owner)", func() bool { return slices.Contains(first.events(app), "Kernel.Started") })
	}
	pods := c.admin.CoreV1().Pods(c.env.Namespace)
	before, err := pods.List(ctx, metav1.ListOptions{LabelSelector: podspec.LabelSession + "=" + id})
	if err != nil || len(before.Items) != 1 {
		t.Fatalf("session pods = %v, %v", before, err)
	}

	b2, err := kube.New(kube.Options{
		RestConfig: c.env.Driver, Namespace: c.env.Namespace, KernelImage: kernelImage, WorkspaceImage: workspaceImage,
		IngressBaseDomain: domain,
		RunLimits:         kube.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
		AppLimits:         kube.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600},
		RelayRetry:        100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	second := newRecorder()
	bw2, err := b2.Adopt(ctx, spec, second)
	if err != nil {
		t.Fatalf("Adopt() error = %v", err)
	}
	w2, ok := bw2.(*kube.WatchWorkload)
	if !ok {
		t.Fatalf("Adopt() = %T, want a watch workload", bw2)
	}
	// Attach: tty stdin echo through the adopter.
	poll(t, "adopted web stdin echo", func() bool {
		_ = w2.Stdin("web", []byte("adopted\r")) // resent each poll until the attach is up
		return strings.Contains(second.output("web"), "echo: adopted")
	})
	// Relay: an edit reaches the adopter as new frames only (no replay of
	// generation 1's history).
	if got := second.events("worker"); slices.Contains(got, "Kernel.Started") {
		t.Fatalf("adopted relay re-delivered history: %v", got)
	}
	wsc := kernelwire.WorkspaceClient{Base: first.wsURL}
	if err := wsc.Apply(ctx, kernelwire.ChangeSet{Write: []kernelwire.Write{{Path: "worker/telo.yaml", Content: manifest("worker", 0, "# adopted edit\n"), Encoding: "utf8"}}}); err != nil {
		t.Fatalf("edit: %v", err)
	}
	poll(t, "worker generation 2 through the adopted relay", func() bool { return slices.Contains(second.events("worker"), "Kernel.Started") })
	if second.running != nil {
		t.Errorf("Adopt() announced running %v; the session already runs", second.running)
	}
	// Routing from the adopter: a live port change on the same pod.
	if err := w2.SetPorts(ctx, "worker", []contract.PortMapping{{Port: 18190, Protocol: "tcp"}}); err != nil {
		t.Fatalf("adopted SetPorts() = %v", err)
	}
	checkRouting(t, ctx, c, id, w2, []string{"tcp-18181", "tcp-18190"})
	after, err := pods.List(ctx, metav1.ListOptions{LabelSelector: podspec.LabelSession + "=" + id})
	if err != nil || len(after.Items) != 1 || after.Items[0].UID != before.Items[0].UID {
		t.Fatalf("adoption changed the pod: %v, %v", after, err)
	}
	for _, cs := range after.Items[0].Status.ContainerStatuses {
		if cs.RestartCount != 0 {
			t.Errorf("container %s restarted %d times during adoption", cs.Name, cs.RestartCount)
		}
	}

	stopAdopted(ctx, t, b2, w1, w2)
}

// stopAdopted stops the adopter's workload: it ends Stopped, the first
// owner sees the pod disappear, and the adopter's backend closes.
func stopAdopted(ctx context.Context, t *testing.T, b2 *kube.Backend, w1, w2 backend.Workload) {
	t.Helper()
	if err := w2.Stop(ctx); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if ex := w2.Exit(); !ex.Stopped {
		t.Errorf("adopted Exit() = %+v, want Stopped", ex)
	}
	<-w1.Done()
	if ex := w1.Exit(); ex.Err == nil || ex.Err.Error() != "pod disappeared" {
		t.Errorf("first owner Exit() = %+v, want pod disappeared", ex)
	}
	if err := b2.Close(ctx); err != nil {
		t.Errorf("Close() = %v", err)
	}
}

// A watch pod whose apps have 60–63 character names (valid per 3.9) is
// accepted by the real API server, which refuses app-<name> past 63.
func TestLongAppNamePodAccepted(t *testing.T) {
	c := newCluster(t, false)
	var apps []backend.App
	for _, n := range []int{60, 63} {
		apps = append(apps, backend.App{Name: strings.Repeat("a", n-1) + "z", Entry: fmt.Sprintf("a%d/telo.yaml", n), IO: contract.IOTTY})
	}
	spec := backend.Spec{SessionID: contract.NewSessionID(), Mode: contract.ModeWatch, Apps: apps,
		Bundle: contract.Bundle{EntryRelativePath: "telo.yaml"}}
	pod, err := podspec.Watch(podspec.Params{
		Namespace: c.env.Namespace, ManagedBy: "telo-k8s-runner", KernelImage: kernelImage, WorkspaceImage: workspaceImage,
		RunLimits: podspec.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
		AppLimits: podspec.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600}, WatchTTLSeconds: 21600,
	}, spec, "telo-watch-"+spec.SessionID+"-long")
	if err != nil {
		t.Fatalf("podspec.Watch() = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if _, err := c.admin.CoreV1().Pods(c.env.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("API server refused the watch pod of 60- and 63-character app names: %v", err)
	}
}

// A routing failure's diagnostic line is tagged stderr on a streams app and
// tty on a tty app (7.4); the session runs on (the API server refuses the
// Ingress: its base domain is not a DNS name).
func TestIngressFailureLineTag(t *testing.T) {
	c := newClusterWith(t, true, func(o *kube.Options) { o.IngressBaseDomain = "bad_domain.example" })
	for _, tt := range []struct {
		io  string
		tag byte
	}{{contract.IOStreams, contract.TagStderr}, {contract.IOTTY, contract.TagTTY}} {
		t.Run(tt.io, func(t *testing.T) {
			rec := newRecorder()
			port := contract.PortMapping{Port: 18090, Protocol: "tcp"}
			spec := backend.Spec{
				SessionID: contract.NewSessionID(), Mode: contract.ModeRun,
				Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{
					{RelativePath: "telo.yaml", Contents: manifest("ingress", 18090, "")},
				}},
				Apps: []backend.App{{Name: "app", Entry: "telo.yaml", IO: tt.io, Ports: []contract.PortMapping{port}}},
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			w, err := c.b.Start(ctx, spec, rec)
			if err != nil {
				t.Fatalf("Start() error = %v", err)
			}
			defer func() { _ = w.Stop(context.Background()) }()
			want := fmt.Sprintf("app %d [runner] failed to create ingress: ", tt.tag)
			poll(t, "the ingress failure line", func() bool {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				for _, d := range rec.diag {
					if strings.HasPrefix(d, want) {
						return true
					}
				}
				return false
			})
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, d := range rec.diag {
				if !strings.HasPrefix(d, fmt.Sprintf("app %d ", tt.tag)) {
					t.Errorf("diagnostic %q, want tag %d", d, tt.tag)
				}
			}
		})
	}
}
