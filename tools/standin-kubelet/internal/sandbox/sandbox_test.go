package sandbox

import (
	"context"
	"fmt"
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
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/imagemap"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/podstatus"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

func TestMain(m *testing.M) {
	mountns.Main()
	restartBackoff = 50 * time.Millisecond
	retryInterval = 50 * time.Millisecond
	goleak.VerifyTestMain(m)
}

// objects is an in-memory Objects.
type objects struct {
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
}

func (o objects) ConfigMap(_ context.Context, _, name string) (*v1.ConfigMap, error) {
	if cm, ok := o.configMaps[name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (o objects) Secret(_ context.Context, _, name string) (*v1.Secret, error) {
	if s, ok := o.secrets[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

type harness struct {
	t   *testing.T
	sb  *Sandbox
	dir string
	wg  sync.WaitGroup
}

func start(t *testing.T, pod *v1.Pod, mode VolumeMode, objs objects) *harness {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	images, err := imagemap.Parse("busybox=/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: t.TempDir()}
	sb, err := New(Config{
		Pod: pod, NodeName: "node-1", IP: "127.9.0.2", HostIP: "127.0.0.1", Dir: h.dir,
		Images: images, Volumes: mode, Helper: self, Objects: objs,
	})
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	h.sb = sb
	ctx, cancel := context.WithCancel(context.Background())
	h.wg.Go(func() { sb.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		h.wg.Wait()
	})
	return h
}

// wait polls the computed status until cond holds.
func (h *harness) wait(what string, cond func(v1.PodStatus) bool) v1.PodStatus {
	h.t.Helper()
	var st v1.PodStatus
	if !testutil.Poll(15*time.Second, 10*time.Millisecond, func() bool {
		st = podstatus.Compute(h.sb.Pod(), h.sb.Snapshot(), time.Now())
		return cond(st)
	}) {
		h.t.Fatalf("timed out waiting for %s; status %+v", what, st)
	}
	return st
}

func (h *harness) waitDone() v1.PodStatus {
	h.t.Helper()
	select {
	case <-h.sb.Done():
	case <-time.After(15 * time.Second):
		h.t.Fatalf("pod did not finish; snapshot %+v", h.sb.Snapshot())
	}
	return podstatus.Compute(h.sb.Pod(), h.sb.Snapshot(), time.Now())
}

func pod(containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "ns1", UID: "uid-1", Labels: map[string]string{"app": "x"}},
		Spec:       v1.PodSpec{RestartPolicy: v1.RestartPolicyNever, Containers: containers},
	}
}

func shell(name, script string) v1.Container {
	return v1.Container{Name: name, Image: "busybox:stable", Command: []string{"sh", "-c"}, Args: []string{script}}
}

func TestInitThenContainersWithVolumesAndEnv(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "workspace") // a mountPath that does not exist on the host
	main := shell("main", `set -e
test "$(cat data/msg)" = hello
test "$(pwd)" = "`+ws+`"
test "$POD_IP" = 127.9.0.2
test "$MY_IP" = 127.9.0.2
test "$NAME" = p1/ns1/uid-1/node-1/x
test "$FROM_CM" = cm-value
test "$FROM_SECRET" = s3cret
test "$PFX_k" = v
test "$EXPANDED" = "ip=127.9.0.2 lit=\$(NOPE)"
test "$1" = "arg-127.9.0.2"
test "$(cat /etc/hostname-does-not-matter 2>/dev/null)" = ""
test "$(cat `+ws+`/cfg/key)" = cm-value
! touch `+ws+`/cfg/new 2>/dev/null`)
	main.Args = append(main.Args, "arg-$(MY_IP)")
	main.WorkingDir = ws
	main.VolumeMounts = []v1.VolumeMount{
		{Name: "work", MountPath: ws, SubPath: "sub"},
		{Name: "cfg", MountPath: ws + "/cfg"},
	}
	main.Env = []v1.EnvVar{
		{Name: "MY_IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "N1", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "N2", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "N3", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
		{Name: "N4", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "N5", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
		{Name: "NAME", Value: "$(N1)/$(N2)/$(N3)/$(N4)/$(N5)"},
		{Name: "FROM_CM", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "key"}}},
		{Name: "FROM_SECRET", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
			LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "pw"}}},
		{Name: "EXPANDED", Value: "ip=$(MY_IP) lit=$$(NOPE)"},
	}
	main.EnvFrom = []v1.EnvFromSource{{Prefix: "PFX_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm2"}}}}
	// $1 of `sh -c script arg` is the first arg after the script: fix argv.
	main.Args = []string{main.Args[0], "sh", main.Args[1]}

	init := shell("init", `mkdir -p /tmp/x && echo hello > `+ws+`/data/msg`)
	init.VolumeMounts = []v1.VolumeMount{{Name: "work", MountPath: ws + "/data", SubPath: "sub/data"}}

	p := pod(main)
	p.Spec.InitContainers = []v1.Container{init}
	p.Spec.Volumes = []v1.Volume{
		{Name: "work", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}},
	}
	objs := objects{
		configMaps: map[string]*v1.ConfigMap{
			"cm":  {Data: map[string]string{"key": "cm-value"}},
			"cm2": {Data: map[string]string{"k": "v"}},
		},
		secrets: map[string]*v1.Secret{"sec": {Data: map[string][]byte{"pw": []byte("s3cret")}}},
	}
	h := start(t, p, VolumesMount, objs)
	st := h.waitDone()
	if st.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s, want Succeeded; init %+v, containers %+v", st.Phase, st.InitContainerStatuses, st.ContainerStatuses)
	}
	// Mount points are created on the host, but what is written lands in
	// the volume only.
	if _, err := os.Stat(filepath.Join(ws, "data", "msg")); !os.IsNotExist(err) {
		t.Errorf("host %s/data/msg: err = %v, want it only inside the volume", ws, err)
	}
	if b, err := os.ReadFile(filepath.Join(h.dir, "volumes", "work", "sub", "data", "msg")); err != nil || string(b) != "hello\n" {
		t.Errorf("volume file = %q, %v, want %q", b, err, "hello\n")
	}
}

// TestWatchPodShape runs the contract's watch-app command, a shell that
// waits for its entry file and then execs the image's program by name,
// with the program under a directory that a volume covers (as /tmp does).
func TestWatchPodShape(t *testing.T) {
	root := t.TempDir()
	covered := filepath.Join(root, "tmp")
	bin := filepath.Join(covered, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "out")
	if err := os.WriteFile(filepath.Join(bin, "telo"), []byte("#!/bin/sh\necho \"telo $*\" > "+out+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(root, "workspace")
	c := v1.Container{Name: "app-a", Image: "registry.local/telo:1",
		Command: []string{"sh", "-c", `while [ ! -f "$TELO_ENTRY" ]; do sleep 0.05; done; exec telo run "$TELO_ENTRY" --watch`},
		Env:     []v1.EnvVar{{Name: "TELO_ENTRY", Value: ws + "/main.yaml"}},
		VolumeMounts: []v1.VolumeMount{
			{Name: "workspace", MountPath: ws},
			{Name: "tmp", MountPath: covered, SubPath: "app-a"},
		},
	}
	writer := shell("workspace", "echo kind: App > "+ws+"/main.yaml")
	writer.VolumeMounts = []v1.VolumeMount{{Name: "workspace", MountPath: ws}}
	p := pod(c, writer)
	p.Spec.Volumes = []v1.Volume{
		{Name: "workspace", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "tmp", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	}

	self, _ := os.Executable()
	images, err := imagemap.Parse("busybox=/bin/sh,registry.local/telo=" + filepath.Join(bin, "telo"))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := New(Config{Pod: p, IP: "127.9.0.4", HostIP: "127.0.0.1", Dir: t.TempDir(), Images: images,
		Volumes: VolumesMount, Helper: self, Objects: objects{}})
	if err != nil {
		t.Fatal(err)
	}
	sb.Run(t.Context())
	st := podstatus.Compute(sb.Pod(), sb.Snapshot(), time.Now())
	if st.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s, want Succeeded; %+v", st.Phase, st.ContainerStatuses)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "telo run "+ws+"/main.yaml --watch\n" {
		t.Errorf("program output = %q, %v, want the entry and flags", b, err)
	}
}

func TestEnvVolumeMode(t *testing.T) {
	c := shell("main", `set -e; test -d "$TELO_VOLUME_MY_VOL"; pwd > "$TELO_VOLUME_MY_VOL/pwd"`)
	c.VolumeMounts = []v1.VolumeMount{{Name: "my-vol", MountPath: "/does/not/exist"}}
	c.WorkingDir = "/does/not/exist"
	p := pod(c)
	p.Spec.Volumes = []v1.Volume{{Name: "my-vol", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	h := start(t, p, VolumesEnv, objects{})
	st := h.waitDone()
	if st.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s, want Succeeded; %+v", st.Phase, st.ContainerStatuses)
	}
	// The working directory does not exist on the host: the pod directory.
	if b, err := os.ReadFile(filepath.Join(h.dir, "volumes", "my-vol", "pwd")); err != nil || string(b) != h.dir+"\n" {
		t.Errorf("pwd = %q, %v, want %q", b, err, h.dir)
	}
}

func TestExitCodeAndFailure(t *testing.T) {
	h := start(t, pod(shell("a", "echo hi; exit 3"), shell("b", "exit 0")), VolumesEnv, objects{})
	st := h.waitDone()
	if st.Phase != v1.PodFailed {
		t.Errorf("phase = %s, want Failed", st.Phase)
	}
	term := st.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 3 || term.Reason != "Error" {
		t.Errorf("container a state = %+v, want terminated 3 Error", st.ContainerStatuses[0].State)
	}
	if term := st.ContainerStatuses[1].State.Terminated; term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
		t.Errorf("container b state = %+v, want terminated 0 Completed", st.ContainerStatuses[1].State)
	}
}

func TestInitFailureWithNever(t *testing.T) {
	p := pod(shell("main", "exit 0"))
	p.Spec.InitContainers = []v1.Container{shell("init", "exit 7")}
	h := start(t, p, VolumesEnv, objects{})
	st := h.waitDone()
	if st.Phase != v1.PodFailed {
		t.Errorf("phase = %s, want Failed", st.Phase)
	}
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != podstatus.ReasonPodInitializing {
		t.Errorf("main state = %+v, want waiting PodInitializing", st.ContainerStatuses[0].State)
	}
}

func TestRestartOnFailure(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "once")
	p := pod(shell("a", fmt.Sprintf(`if [ -e %[1]s ]; then exit 0; fi; touch %[1]s; exit 1`, marker)))
	p.Spec.RestartPolicy = v1.RestartPolicyOnFailure
	h := start(t, p, VolumesEnv, objects{})
	st := h.waitDone()
	cs := st.ContainerStatuses[0]
	if st.Phase != v1.PodSucceeded || cs.RestartCount != 1 {
		t.Fatalf("phase, restartCount = %s, %d, want Succeeded, 1", st.Phase, cs.RestartCount)
	}
	if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 1 {
		t.Errorf("lastState = %+v, want terminated 1", cs.LastTerminationState)
	}
}

func TestRestartAlwaysThenStop(t *testing.T) {
	p := pod(shell("a", "exit 0"))
	p.Spec.RestartPolicy = v1.RestartPolicyAlways
	h := start(t, p, VolumesEnv, objects{})
	h.wait("two restarts", func(st v1.PodStatus) bool { return st.ContainerStatuses[0].RestartCount >= 2 })
	h.sb.Stop(time.Second)
	st := h.waitDone()
	if st.Phase != v1.PodFailed && st.Phase != v1.PodSucceeded {
		t.Errorf("phase after stop = %s, want terminal", st.Phase)
	}
}

func TestUnmappedImage(t *testing.T) {
	c := shell("a", "exit 0")
	c.Image = "nginx:1"
	h := start(t, pod(c), VolumesEnv, objects{})
	st := h.wait("ErrImagePull", func(st v1.PodStatus) bool {
		w := st.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == podstatus.ReasonErrImagePull
	})
	if st.Phase != v1.PodPending {
		t.Errorf("phase = %s, want Pending", st.Phase)
	}
	h.sb.Stop(0)
	if st := h.waitDone(); st.Phase != v1.PodFailed {
		t.Errorf("phase after stop = %s, want Failed", st.Phase)
	}
}

func TestMissingConfigMapRetries(t *testing.T) {
	c := shell("a", "exit 0")
	c.Env = []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{
		LocalObjectReference: v1.LocalObjectReference{Name: "missing"}, Key: "k"}}}}
	h := start(t, pod(c), VolumesEnv, objects{})
	h.wait("CreateContainerConfigError", func(st v1.PodStatus) bool {
		w := st.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == podstatus.ReasonConfigError && strings.Contains(w.Message, "missing")
	})
}

// trapping returns a container that handles SIGTERM with action and
// touches a marker file once the handler is installed.
func trapping(t *testing.T, name, action string) (v1.Container, string) {
	marker := filepath.Join(t.TempDir(), "ready")
	return shell(name, fmt.Sprintf(`trap '%s' TERM; touch %s; while :; do sleep 0.05; done`, action, marker)), marker
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	testutil.WaitFile(t, path, 10*time.Second)
}

func TestGracefulStop(t *testing.T) {
	polite, m1 := trapping(t, "polite", "exit 0")
	stubborn, m2 := trapping(t, "stubborn", "")
	h := start(t, pod(polite, stubborn), VolumesEnv, objects{})
	waitFile(t, m1)
	waitFile(t, m2)
	begin := time.Now()
	h.sb.Stop(300 * time.Millisecond)
	st := h.waitDone()
	if d := time.Since(begin); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("stop took %v, want about the 300ms grace period", d)
	}
	if term := st.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 0 {
		t.Errorf("polite container = %+v, want exit 0", st.ContainerStatuses[0].State)
	}
	if term := st.ContainerStatuses[1].State.Terminated; term == nil || term.ExitCode != 137 || term.Signal != 9 {
		t.Errorf("stubborn container = %+v, want 137 by SIGKILL", st.ContainerStatuses[1].State)
	}
	if st.Phase != v1.PodFailed {
		t.Errorf("phase = %s, want Failed", st.Phase)
	}
}

func TestShorterGraceWins(t *testing.T) {
	stubborn, marker := trapping(t, "stubborn", "")
	h := start(t, pod(stubborn), VolumesEnv, objects{})
	waitFile(t, marker)
	begin := time.Now()
	h.sb.Stop(20 * time.Second)
	h.sb.Stop(0)
	h.waitDone()
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("stop took %v, want the second, shorter grace to win", d)
	}
}

func TestActiveDeadline(t *testing.T) {
	p := pod(shell("a", "sleep 30"))
	ads := int64(1)
	p.Spec.ActiveDeadlineSeconds = &ads
	h := start(t, p, VolumesEnv, objects{})
	st := h.waitDone()
	if st.Phase != v1.PodFailed || st.Reason != podstatus.ReasonDeadlineExceeded {
		t.Errorf("phase, reason = %s, %q, want Failed, DeadlineExceeded", st.Phase, st.Reason)
	}
	if term := st.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 143 {
		t.Errorf("container = %+v, want 143 (SIGTERM)", st.ContainerStatuses[0].State)
	}
}

func TestChangesAreReported(t *testing.T) {
	var mu sync.Mutex
	n := 0
	images, _ := imagemap.Parse("busybox=/bin/sh")
	sb, err := New(Config{Pod: pod(shell("a", "exit 0")), IP: "127.9.0.3", HostIP: "127.0.0.1", Dir: t.TempDir(),
		Images: images, Volumes: VolumesEnv, Objects: objects{}, OnChange: func() { mu.Lock(); n++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	sb.Run(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if n < 3 { // started, running, terminated, done
		t.Errorf("OnChange called %d times, want one per change", n)
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{Pod: pod(), IP: "127.1.0.2", HostIP: "127.0.0.1", Dir: "/x", Objects: objects{}, Volumes: VolumesEnv}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"no pod":         func(c *Config) { c.Pod = nil },
		"no ip":          func(c *Config) { c.IP = "" },
		"no dir":         func(c *Config) { c.Dir = "" },
		"no objects":     func(c *Config) { c.Objects = nil },
		"bad mode":       func(c *Config) { c.Volumes = "tmpfs" },
		"mount, no help": func(c *Config) { c.Volumes = VolumesMount },
	} {
		c := good
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("Validate() with %s = nil, want an error", name)
		}
	}
}
