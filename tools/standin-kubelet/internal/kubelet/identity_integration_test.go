package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

// privateImage maps to privateProgram, which sits where the tests build
// their programs: a 0700 root-owned temporary directory.
const privateImage = "registry.local/private"

// privateProgram writes a program named telo into a fresh 0700 temporary
// directory: it exits 0 when it runs as uid 1000, 7 otherwise.
func privateProgram(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "standin-private-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p := filepath.Join(dir, "telo")
	if err := os.WriteFile(p, []byte("#!/bin/sh\ntest \"$(id -u)\" = 1000 || exit 7\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// credentials returns the Uid, Gid and Groups lines of a process's
// /proc/<pid>/status, fields separated by single spaces.
func credentials(t *testing.T, pid int) (uid, gid, groups string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read status of pid %d: %v", pid, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.Join(strings.Fields(v), " ")
		switch k {
		case "Uid":
			uid = v
		case "Gid":
			gid = v
		case "Groups":
			groups = v
		}
	}
	return uid, gid, groups
}

func allRunning(p *v1.Pod) bool {
	if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil {
			return false
		}
	}
	return true
}

// testIdentity checks the credentials of running containers, as the
// kernel holds them: the pod's runAsUser/runAsGroup, a container's own
// overriding them, fsGroup then supplementalGroups as supplementary
// groups.
func (e *env) testIdentity(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod := shellPod("identity", "exec sleep 60")
	pod.Spec.SecurityContext = &v1.PodSecurityContext{
		RunAsUser: testutil.Ptr[int64](1000), RunAsGroup: testutil.Ptr[int64](1000),
		FSGroup: testutil.Ptr[int64](2000), SupplementalGroups: []int64{3000},
	}
	override := pod.Spec.Containers[0]
	override.Name = "override"
	override.SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1001), RunAsGroup: testutil.Ptr[int64](1002)}
	pod.Spec.Containers = append(pod.Spec.Containers, override)
	e.create(ctx, pod)
	got, _ := e.watchPod(ctx, t, "identity", 30*time.Second, allRunning)
	want := map[string][3]string{
		"main":     {"1000 1000 1000 1000", "1000 1000 1000 1000", "2000 3000"},
		"override": {"1001 1001 1001 1001", "1002 1002 1002 1002", "2000 3000"},
	}
	for _, cs := range got.Status.ContainerStatuses {
		pid, err := strconv.Atoi(strings.TrimPrefix(cs.ContainerID, "standin://"))
		if err != nil {
			t.Fatalf("container %s: id %q", cs.Name, cs.ContainerID)
		}
		uid, gid, groups := credentials(t, pid)
		if w := want[cs.Name]; uid != w[0] || gid != w[1] || groups != w[2] {
			t.Errorf("container %s (pid %d): Uid %q Gid %q Groups %q, want %q %q %q", cs.Name, pid, uid, gid, groups, w[0], w[1], w[2])
		}
	}
	e.deleteNow(ctx, t, "identity")
}

// testSharedEmptyDir runs two containers with different users and groups
// that share only the pod's fsGroup: one writes a file into an emptyDir,
// the other reads it and appends to it, and writes into a subPath
// directory of the same volume.
func (e *env) testSharedEmptyDir(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	base := testutil.ReachableDir(t)
	shared, own := filepath.Join(base, "shared"), filepath.Join(base, "own")
	pod := shellPod("shared", "")
	writer := &pod.Spec.Containers[0]
	writer.Name = "writer"
	writer.Args = []string{`umask 0002; echo one > ` + shared + `/f.tmp && mv ` + shared + `/f.tmp ` + shared + `/f`}
	writer.SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1001), RunAsGroup: testutil.Ptr[int64](1001)}
	writer.VolumeMounts = []v1.VolumeMount{{Name: "data", MountPath: shared}}
	reader := v1.Container{
		Name: "reader", Image: "busybox:stable", Command: []string{"sh", "-c"},
		Args: []string{`set -e
while [ ! -f ` + shared + `/f ]; do sleep 0.05; done
test "$(cat ` + shared + `/f)" = one
echo two >> ` + shared + `/f
echo mine > ` + own + `/g`},
		SecurityContext: &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1002), RunAsGroup: testutil.Ptr[int64](1002)},
		VolumeMounts: []v1.VolumeMount{
			{Name: "data", MountPath: shared},
			{Name: "data", MountPath: own, SubPath: "reader"},
		},
	}
	pod.Spec.Containers = append(pod.Spec.Containers, reader)
	pod.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: testutil.Ptr[int64](2000)}
	pod.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	created := e.create(ctx, pod)
	done, _ := e.watchPod(ctx, t, "shared", 30*time.Second, phaseIs(v1.PodSucceeded, v1.PodFailed))
	if done.Status.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s (%+v), want Succeeded", done.Status.Phase, done.Status.ContainerStatuses)
	}
	vol := filepath.Join(e.root, "pods", string(created.UID), "volumes", "data")
	if b, err := os.ReadFile(filepath.Join(vol, "f")); err != nil || string(b) != "one\ntwo\n" {
		t.Errorf("shared file = %q, %v, want both containers' lines", b, err)
	}
	for path, want := range map[string]struct {
		mode     os.FileMode
		uid, gid uint32
	}{
		"":         {os.ModeDir | os.ModeSetgid | 0o777, 0, 2000},
		"f":        {0o664, 1001, 2000},
		"reader":   {os.ModeDir | os.ModeSetgid | 0o777, 0, 2000},
		"reader/g": {0o644, 1002, 2000},
	} {
		fi, err := os.Stat(filepath.Join(vol, path))
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != want.mode || st.Uid != want.uid || st.Gid != want.gid {
			t.Errorf("volume %q: %v %d:%d, want %v %d:%d", path, fi.Mode(), st.Uid, st.Gid, want.mode, want.uid, want.gid)
		}
	}
	e.deleteNow(ctx, t, "shared")
}

// testRunAsNonRoot: a runAsNonRoot pod without runAsUser would run as
// root, so its container does not start: Waiting,
// CreateContainerConfigError, the kubelet's message, pod Pending.
func (e *env) testRunAsNonRoot(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod := shellPod("non-root", "exit 0")
	pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true)}
	created := e.create(ctx, pod)
	got, _ := e.watchPod(ctx, t, "non-root", 30*time.Second, func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
	want := fmt.Sprintf(`container has runAsNonRoot and image will run as root (pod: "non-root_%s(%s)", container: main)`, testNS, created.UID)
	if msg := got.Status.ContainerStatuses[0].State.Waiting.Message; msg != want {
		t.Errorf("message = %q, want %q", msg, want)
	}
	if got.Status.Phase != v1.PodPending {
		t.Errorf("phase = %s, want Pending", got.Status.Phase)
	}
	e.deleteNow(ctx, t, "non-root")
}

// testPrivateProgram runs, as uid 1000, the program of an image that the
// tests keep in a 0700 root-owned directory: as the entrypoint, by name
// from a shell through PATH (a watch app's `sh -c '… exec telo …'`), and
// so with a volume mounted. The program exits 7 unless it runs as 1000.
func (e *env) testPrivateProgram(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	ws := filepath.Join(testutil.ReachableDir(t), "work")
	pod := shellPod("private-program", "")
	pod.Spec.Containers = []v1.Container{
		{Name: "entrypoint", Image: privateImage + ":1"},
		{Name: "by-name", Image: privateImage + ":1", Command: []string{"sh", "-c", "exec telo run"}},
		{
			Name: "by-name-with-volume", Image: privateImage + ":1", Command: []string{"sh", "-c", "exec telo run"},
			WorkingDir: ws, VolumeMounts: []v1.VolumeMount{{Name: "work", MountPath: ws}},
		},
	}
	pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true), RunAsUser: testutil.Ptr[int64](1000), RunAsGroup: testutil.Ptr[int64](1000), FSGroup: testutil.Ptr[int64](1000)}
	pod.Spec.Volumes = []v1.Volume{{Name: "work", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	e.create(ctx, pod)
	done, _ := e.watchPod(ctx, t, "private-program", 30*time.Second, phaseIs(v1.PodSucceeded, v1.PodFailed))
	if done.Status.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s (%+v), want Succeeded", done.Status.Phase, done.Status.ContainerStatuses)
	}
	// The program was staged, not opened up.
	if fi, err := os.Stat(filepath.Dir(e.private)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("program directory: %v, %v, want it still 0700", fi.Mode(), err)
	}
	e.deleteNow(ctx, t, "private-program")
}
