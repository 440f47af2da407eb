package kubelet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/imagemap"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/sandbox"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

func TestMain(m *testing.M) {
	mountns.Main()
	goleak.VerifyTestMain(m)
}

const (
	testNS   = "it"
	nodeName = "standin-it"
	ipBase   = 77
)

// env is a control plane with a stand-in kubelet.
type env struct {
	t       *testing.T
	cp      *controlPlane
	rc      *rest.Config
	client  kubernetes.Interface
	root    string
	images  imagemap.Map
	private string // the program of privateImage
	stop    func() // stops the running kubelet
	kubelet *Kubelet
}

func TestIntegration(t *testing.T) {
	cp := startControlPlane(t)
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 200, 400
	client := kubernetes.NewForConfigOrDie(rc)
	private := privateProgram(t)
	images, err := imagemap.Parse("busybox=/bin/sh," + privateImage + "=" + private)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, cp: cp, rc: rc, client: client, root: t.TempDir(), images: images, private: private}
	ctx := ctxFor(t, 5*time.Minute)

	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller-manager: the default ServiceAccount is made by hand.
	if _, err := client.CoreV1().ServiceAccounts(testNS).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k := e.startKubelet(ctx)
	t.Logf("volume mode %s", k.VolumeMode())
	e.checkNode(ctx, k)

	t.Run("ExitCode", e.testExitCode)
	t.Run("TTYAttach", e.testTTYAttach)
	t.Run("StreamsAttach", e.testStreamsAttach)
	t.Run("VolumesAndEnv", e.testVolumesAndEnv)
	t.Run("GracefulDelete", e.testGracefulDelete)
	t.Run("ForcedDelete", e.testForcedDelete)
	t.Run("BindsUnscheduled", e.testBinding)
	t.Run("Restart", e.testRestart)
	t.Run("Deadline", e.testDeadline)
	t.Run("UnmappedImage", e.testUnmappedImage)
	t.Run("Identity", e.testIdentity)
	t.Run("SharedEmptyDir", e.testSharedEmptyDir)
	t.Run("RunAsNonRoot", e.testRunAsNonRoot)
	t.Run("PrivateProgram", e.testPrivateProgram)
	t.Run("KubeletRestart", e.testKubeletRestart)
	e.stop()
}

func (e *env) startKubelet(ctx context.Context) *Kubelet {
	e.t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	klog.SetSlogLogger(log)
	k, err := New(Config{
		Client: e.client, NodeName: nodeName, PodIPBase: ipBase,
		Images: e.images, Root: e.root, Log: log,
	})
	if err != nil {
		e.t.Fatalf("New() error = %v", err)
	}
	kctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := k.Run(kctx); err != nil {
			e.t.Errorf("Run() = %v", err)
		}
	})
	var once sync.Once
	e.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	e.t.Cleanup(e.stop)
	e.kubelet = k
	begin := time.Now()
	select {
	case <-k.Ready():
		e.t.Logf("kubelet ready in %v", time.Since(begin).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		e.t.Fatal("kubelet not ready after 30s")
	}
	return k
}

// testWriter logs through t while the test runs.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (e *env) checkNode(ctx context.Context, k *Kubelet) {
	t := e.t
	node, err := e.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	if got := node.Status.DaemonEndpoints.KubeletEndpoint.Port; int(got) != k.Port() {
		t.Errorf("kubelet endpoint port = %d, want %d", got, k.Port())
	}
	if len(node.Status.Addresses) != 1 || node.Status.Addresses[0].Address != HostIP || node.Status.Addresses[0].Type != v1.NodeInternalIP {
		t.Errorf("node addresses = %+v, want one InternalIP %s", node.Status.Addresses, HostIP)
	}
	ready := false
	for _, c := range node.Status.Conditions {
		ready = ready || c.Type == v1.NodeReady && c.Status == v1.ConditionTrue
	}
	if !ready {
		t.Errorf("node conditions = %+v, want Ready", node.Status.Conditions)
	}
	if cpu := node.Status.Allocatable.Cpu().String(); cpu != "8" {
		t.Errorf("allocatable cpu = %s, want 8", cpu)
	}
	waitUntil(t, "node lease", 10*time.Second, func() bool {
		_, err := e.client.CoordinationV1().Leases(leaseNamespace).Get(ctx, nodeName, metav1.GetOptions{})
		return err == nil
	})
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, what, timeout, cond)
}

func shellPod(name, script string) *v1.Pod {
	no := false
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: v1.PodSpec{
			NodeName:                     nodeName,
			RestartPolicy:                v1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			Containers: []v1.Container{{
				Name: "main", Image: "busybox:stable", Command: []string{"sh", "-c"}, Args: []string{script},
			}},
		},
	}
}

func (e *env) create(ctx context.Context, pod *v1.Pod) *v1.Pod {
	e.t.Helper()
	got, err := e.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return got
}

// watchPod follows one pod until cond holds for it (it returns that
// version) or the pod is gone (it returns nil), and returns every version
// it saw.
func (e *env) watchPod(ctx context.Context, t *testing.T, name string, timeout time.Duration, cond func(*v1.Pod) bool) (pod *v1.Pod, history []*v1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pods := e.client.CoreV1().Pods(testNS)
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		return nil, history // gone (every watched pod was created first)
	}
	for i := range list.Items {
		p := &list.Items[i]
		history = append(history, p)
		if cond(p) {
			return p, history
		}
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: list.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch of pod %s ended", name)
			}
			p, isPod := ev.Object.(*v1.Pod)
			if !isPod {
				t.Fatalf("watch of pod %s: %+v", name, ev.Object)
			}
			if ev.Type == watch.Deleted {
				return nil, history
			}
			history = append(history, p)
			if cond(p) {
				return p, history
			}
		case <-ctx.Done():
			last := "none"
			if n := len(history); n > 0 {
				last = fmt.Sprintf("%s %+v", history[n-1].Status.Phase, history[n-1].Status.ContainerStatuses)
			}
			t.Fatalf("pod %s: condition not met within %v; last seen %s", name, timeout, last)
		}
	}
}

func phaseIs(phases ...v1.PodPhase) func(*v1.Pod) bool {
	return func(p *v1.Pod) bool {
		for _, ph := range phases {
			if p.Status.Phase == ph {
				return true
			}
		}
		return false
	}
}

func (e *env) testExitCode(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	begin := time.Now()
	e.create(ctx, shellPod("exit-code", "echo hi; exit 3"))
	pod, history := e.watchPod(ctx, t, "exit-code", 30*time.Second, phaseIs(v1.PodFailed, v1.PodSucceeded))
	t.Logf("create → Failed in %v", time.Since(begin).Round(time.Millisecond))
	if pod.Status.Phase != v1.PodFailed {
		t.Fatalf("phase = %s, want Failed", pod.Status.Phase)
	}
	cs := pod.Status.ContainerStatuses
	if len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.ExitCode != 3 || cs[0].State.Terminated.Reason != "Error" {
		t.Fatalf("container statuses = %+v, want terminated with exit code 3, reason Error", cs)
	}
	if !strings.HasPrefix(pod.Status.PodIP, fmt.Sprintf("127.%d.", ipBase)) || pod.Status.HostIP != HostIP || pod.Status.StartTime == nil {
		t.Errorf("podIP, hostIP, startTime = %q, %q, %v, want 127.%d.x.y, %s, set", pod.Status.PodIP, pod.Status.HostIP, pod.Status.StartTime, ipBase, HostIP)
	}
	for _, p := range history {
		if p.Status.Phase == v1.PodRunning {
			t.Logf("saw Running on the way (fine, not required for a quick exit)")
			break
		}
	}
	e.deleteNow(ctx, t, "exit-code")
}

// deleteNow deletes a pod with grace 0 and waits until it is gone.
func (e *env) deleteNow(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	zero := int64(0)
	if err := e.client.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	e.watchPod(ctx, t, name, 30*time.Second, func(*v1.Pod) bool { return false })
}

func (e *env) testVolumesAndEnv(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	if _, err := e.client.CoreV1().ConfigMaps(testNS).Create(ctx, &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "app"}, Data: map[string]string{"telo.yaml": "kind: App\n", "greeting": "hello"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(t.TempDir(), "workspace") // stands for /workspace without touching the host's /
	pod := shellPod("volumes", `set -e
test "$(cat `+ws+`/msg)" = hello
test "$(pwd)" = "`+ws+`"
test "$(cat `+ws+`/app/telo.yaml)" = "kind: App"
test "$POD_IP" = "$MY_IP"
test "$ARG" = "ip=$POD_IP"
test "$GREETING" = hello
echo done`)
	pod.Spec.Containers[0].Args[0] = strings.Replace(pod.Spec.Containers[0].Args[0], `"$ARG"`, `"$1"`, 1)
	pod.Spec.Containers[0].Args = append(pod.Spec.Containers[0].Args, "sh", "ip=$(MY_IP)")
	pod.Spec.Volumes = []v1.Volume{
		{Name: "workspace", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "app", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "app"}}}},
	}
	init := v1.Container{Name: "init", Image: "busybox:stable", Command: []string{"sh", "-c", "echo $(GREETING) > " + ws + "/msg"},
		Env:          []v1.EnvVar{{Name: "GREETING", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "app"}, Key: "greeting"}}}},
		VolumeMounts: []v1.VolumeMount{{Name: "workspace", MountPath: ws}}}
	pod.Spec.InitContainers = []v1.Container{init}
	c := &pod.Spec.Containers[0]
	c.WorkingDir = ws
	c.Env = []v1.EnvVar{
		{Name: "MY_IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "GREETING", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "app"}, Key: "greeting"}}},
	}
	c.VolumeMounts = []v1.VolumeMount{{Name: "workspace", MountPath: ws}, {Name: "app", MountPath: ws + "/app", ReadOnly: true}}
	if e.kubelet.VolumeMode() != sandbox.VolumesMount {
		t.Fatalf("volume mode = %s, want mount (the tests run as root)", e.kubelet.VolumeMode())
	}
	begin := time.Now()
	e.create(ctx, pod)
	done, _ := e.watchPod(ctx, t, "volumes", 30*time.Second, phaseIs(v1.PodSucceeded, v1.PodFailed))
	t.Logf("create → Succeeded (init + container, both in mount namespaces) in %v", time.Since(begin).Round(time.Millisecond))
	if done.Status.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s (init %+v, containers %+v), want Succeeded", done.Status.Phase,
			done.Status.InitContainerStatuses, done.Status.ContainerStatuses)
	}
	e.deleteNow(ctx, t, "volumes")
}

// markerPod runs script after installing a TERM trap, touching a host file
// once the trap is in place.
func markerPod(t *testing.T, name, trap string) (*v1.Pod, string) {
	marker := filepath.Join(t.TempDir(), "ready")
	return shellPod(name, fmt.Sprintf(`trap '%s' TERM; touch %s; while :; do sleep 0.05; done`, trap, marker)), marker
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	testutil.WaitFile(t, path, 20*time.Second)
}

func (e *env) testGracefulDelete(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	t.Run("polite", func(t *testing.T) {
		pod, marker := markerPod(t, "polite", "exit 0")
		e.create(ctx, pod)
		waitFile(t, marker)
		begin := time.Now()
		grace := int64(30)
		if err := e.client.CoreV1().Pods(testNS).Delete(ctx, "polite", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatal(err)
		}
		_, history := e.watchPod(ctx, t, "polite", 20*time.Second, func(*v1.Pod) bool { return false })
		d := time.Since(begin)
		t.Logf("graceful delete (program exits on SIGTERM) took %v", d.Round(time.Millisecond))
		if d > 5*time.Second {
			t.Errorf("delete took %v, want the pod gone as soon as its program exited", d)
		}
		last := history[len(history)-1]
		if last.Status.Phase != v1.PodSucceeded || last.Status.ContainerStatuses[0].State.Terminated == nil {
			t.Errorf("final status = %s %+v, want Succeeded with the container terminated", last.Status.Phase, last.Status.ContainerStatuses)
		}
	})
	t.Run("stubborn", func(t *testing.T) {
		pod, marker := markerPod(t, "stubborn", "")
		e.create(ctx, pod)
		waitFile(t, marker)
		begin := time.Now()
		grace := int64(1)
		if err := e.client.CoreV1().Pods(testNS).Delete(ctx, "stubborn", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatal(err)
		}
		_, history := e.watchPod(ctx, t, "stubborn", 20*time.Second, func(*v1.Pod) bool { return false })
		d := time.Since(begin)
		t.Logf("delete of a program ignoring SIGTERM (grace 1s) took %v", d.Round(time.Millisecond))
		if d < time.Second || d > 6*time.Second {
			t.Errorf("delete took %v, want SIGKILL after the 1s grace period", d)
		}
		term := history[len(history)-1].Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 137 {
			t.Errorf("final container state = %+v, want terminated 137", history[len(history)-1].Status.ContainerStatuses[0].State)
		}
	})
}

func (e *env) testForcedDelete(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod, marker := markerPod(t, "forced", "")
	e.create(ctx, pod)
	waitFile(t, marker)
	got, _ := e.watchPod(ctx, t, "forced", 10*time.Second, phaseIs(v1.PodRunning))
	uid := got.UID
	e.deleteNow(ctx, t, "forced")
	// The sandbox is forgotten once its processes are gone.
	waitUntil(t, "the pod's directory to go", 10*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(e.root, "pods", string(uid)))
		return os.IsNotExist(err)
	})
}

func (e *env) testBinding(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod := shellPod("unscheduled", "exit 0")
	pod.Spec.NodeName = ""
	e.create(ctx, pod)
	done, _ := e.watchPod(ctx, t, "unscheduled", 30*time.Second, phaseIs(v1.PodSucceeded, v1.PodFailed))
	if done.Spec.NodeName != nodeName || done.Status.Phase != v1.PodSucceeded {
		t.Errorf("nodeName, phase = %q, %s, want %q, Succeeded", done.Spec.NodeName, done.Status.Phase, nodeName)
	}
	e.deleteNow(ctx, t, "unscheduled")
}

func (e *env) testRestart(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	marker := filepath.Join(t.TempDir(), "once")
	pod := shellPod("restart", fmt.Sprintf(`if [ -e %[1]s ]; then exit 0; fi; touch %[1]s; exit 1`, marker))
	pod.Spec.RestartPolicy = v1.RestartPolicyOnFailure
	e.create(ctx, pod)
	done, _ := e.watchPod(ctx, t, "restart", 30*time.Second, phaseIs(v1.PodSucceeded, v1.PodFailed))
	cs := done.Status.ContainerStatuses[0]
	if done.Status.Phase != v1.PodSucceeded || cs.RestartCount != 1 || cs.LastTerminationState.Terminated == nil {
		t.Errorf("phase, restartCount, lastState = %s, %d, %+v, want Succeeded, 1, terminated", done.Status.Phase, cs.RestartCount, cs.LastTerminationState)
	}
	e.deleteNow(ctx, t, "restart")
}

func (e *env) testDeadline(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod := shellPod("deadline", "sleep 60")
	ads := int64(1)
	pod.Spec.ActiveDeadlineSeconds = &ads
	e.create(ctx, pod)
	done, _ := e.watchPod(ctx, t, "deadline", 30*time.Second, phaseIs(v1.PodSucceeded, v1.PodFailed))
	if done.Status.Phase != v1.PodFailed || done.Status.Reason != "DeadlineExceeded" {
		t.Errorf("phase, reason = %s, %q, want Failed, DeadlineExceeded", done.Status.Phase, done.Status.Reason)
	}
	e.deleteNow(ctx, t, "deadline")
}

func (e *env) testUnmappedImage(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod := shellPod("unmapped", "exit 0")
	pod.Spec.Containers[0].Image = "registry.example/unknown:1"
	e.create(ctx, pod)
	got, _ := e.watchPod(ctx, t, "unmapped", 30*time.Second, func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ErrImagePull"
	})
	if got.Status.Phase != v1.PodPending {
		t.Errorf("phase = %s, want Pending", got.Status.Phase)
	}
	e.deleteNow(ctx, t, "unmapped")
}

// testKubeletRestart stops the kubelet, deletes one pod and leaves another,
// then starts a new kubelet: it finishes the deletion and fails the pod
// whose processes it lost.
func (e *env) testKubeletRestart(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	for _, name := range []string{"orphan-deleted", "orphan-kept"} {
		pod, marker := markerPod(t, name, "exit 0")
		e.create(ctx, pod)
		waitFile(t, marker)
		e.watchPod(ctx, t, name, 10*time.Second, phaseIs(v1.PodRunning))
	}
	e.stop()
	grace := int64(30)
	if err := e.client.CoreV1().Pods(testNS).Delete(ctx, "orphan-deleted", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	e.startKubelet(ctx)
	e.watchPod(ctx, t, "orphan-deleted", 20*time.Second, func(*v1.Pod) bool { return false })
	t.Logf("kubelet restart finished a pending deletion in %v", time.Since(begin).Round(time.Millisecond))
	kept, _ := e.watchPod(ctx, t, "orphan-kept", 20*time.Second, phaseIs(v1.PodFailed, v1.PodSucceeded))
	if kept.Status.Phase != v1.PodFailed || kept.Status.Reason != "NodeRestarted" {
		t.Errorf("orphan phase, reason = %s, %q, want Failed, NodeRestarted", kept.Status.Phase, kept.Status.Reason)
	}
	e.deleteNow(ctx, t, "orphan-kept")
}
