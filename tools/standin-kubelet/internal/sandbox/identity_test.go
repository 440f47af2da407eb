package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/imagemap"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/podstatus"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

// startAs runs pod like start, with identities applied and dir as the pod
// directory.
func startAs(t *testing.T, pod *v1.Pod, mode VolumeMode, objs objects, dir string) *harness {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	images, err := imagemap.Parse("busybox=/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir}
	sb, err := New(Config{
		Pod: pod, NodeName: "node-1", IP: "127.9.0.5", HostIP: "127.0.0.1", Dir: dir,
		Images: images, Volumes: mode, Helper: self, Objects: objs, ApplyIdentity: true,
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

// ids is what /proc/<pid>/status says about a process's credentials.
type ids struct {
	uid, gid string // "real effective saved fs"
	groups   string // space-separated
}

func procIDs(t *testing.T, pid int) ids {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read status of pid %d: %v", pid, err)
	}
	var out ids
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.Join(strings.Fields(v), " ")
		switch k {
		case "Uid":
			out.uid = v
		case "Gid":
			out.gid = v
		case "Groups":
			out.groups = v
		}
	}
	return out
}

func pidOf(t *testing.T, cs v1.ContainerStatus) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimPrefix(cs.ContainerID, "standin://"))
	if err != nil {
		t.Fatalf("container %s: id %q has no pid", cs.Name, cs.ContainerID)
	}
	return pid
}

// TestIdentityFromSecurityContext checks the credentials of running
// container processes: pod-level runAsUser/runAsGroup, container-level
// overrides, fsGroup and supplementalGroups as supplementary groups, and
// HOME, in both volume modes (the mount helper, SysProcAttr.Credential).
func TestIdentityFromSecurityContext(t *testing.T) {
	for _, mode := range []VolumeMode{VolumesMount, VolumesEnv} {
		t.Run(string(mode), func(t *testing.T) {
			ws := filepath.Join(testutil.ReachableDir(t), "workspace")
			podLevel := shell("pod-level", `test "$HOME" = / || exit 9; exec sleep 30`)
			override := shell("override", `test "$HOME" = / || exit 9; exec sleep 30`)
			override.SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1001), RunAsGroup: testutil.Ptr[int64](1002)}
			override.VolumeMounts = []v1.VolumeMount{{Name: "scratch", MountPath: ws}}
			root := shell("root", `test "$HOME" = /root || exit 9; exec sleep 30`)
			root.SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](0)}
			p := pod(podLevel, override, root)
			p.Spec.SecurityContext = &v1.PodSecurityContext{
				RunAsUser: testutil.Ptr[int64](1000), RunAsGroup: testutil.Ptr[int64](1000),
				FSGroup: testutil.Ptr[int64](2000), SupplementalGroups: []int64{3000},
			}
			p.Spec.Volumes = []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
			h := startAs(t, p, mode, objects{}, testutil.ReachableDir(t))
			st := h.wait("every container running", func(st v1.PodStatus) bool {
				for _, cs := range st.ContainerStatuses {
					if cs.State.Running == nil {
						return false
					}
				}
				return true
			})
			want := map[string]ids{
				"pod-level": {uid: "1000 1000 1000 1000", gid: "1000 1000 1000 1000", groups: "2000 3000"},
				"override":  {uid: "1001 1001 1001 1001", gid: "1002 1002 1002 1002", groups: "2000 3000"},
				"root":      {uid: "0 0 0 0", gid: "1000 1000 1000 1000", groups: "2000 3000"},
			}
			for _, cs := range st.ContainerStatuses {
				if got := procIDs(t, pidOf(t, cs)); got != want[cs.Name] {
					t.Errorf("container %s runs as %+v, want %+v", cs.Name, got, want[cs.Name])
				}
			}
		})
	}
}

// TestRunAsNonRoot: a container that would run as root despite
// runAsNonRoot does not start, like the kubelet's
// CreateContainerConfigError, and is not retried; the others run.
func TestRunAsNonRoot(t *testing.T) {
	implicit := shell("implicit-root", "exit 0")
	explicit := shell("explicit-root", "exit 0")
	explicit.SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](0)}
	lifted := shell("lifted", "exit 0")
	lifted.SecurityContext = &v1.SecurityContext{RunAsNonRoot: testutil.Ptr(false)}
	nonRoot := shell("non-root", `test "$(id -u)" = 1000`)
	nonRoot.SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1000)}
	p := pod(implicit, explicit, lifted, nonRoot)
	p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true)}
	h := startAs(t, p, VolumesMount, objects{}, t.TempDir())
	refused := func(cs v1.ContainerStatus) bool {
		return cs.State.Waiting != nil && cs.State.Waiting.Reason == podstatus.ReasonConfigError
	}
	exited0 := func(cs v1.ContainerStatus) bool {
		return cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0
	}
	h.wait("two refused, two exited 0", func(st v1.PodStatus) bool {
		cs := st.ContainerStatuses
		return refused(cs[0]) && refused(cs[1]) && exited0(cs[2]) && exited0(cs[3])
	})
	// A retry would show as a restart or a start: watch for one over
	// several retry intervals.
	var st v1.PodStatus
	changed := func() bool {
		st = podstatus.Compute(h.sb.Pod(), h.sb.Snapshot(), time.Now())
		cs := st.ContainerStatuses
		return !refused(cs[0]) || !refused(cs[1]) || cs[0].RestartCount != 0 || cs[1].RestartCount != 0
	}
	if testutil.Poll(5*retryInterval, 10*time.Millisecond, changed) {
		t.Fatalf("refused containers changed: %+v", st.ContainerStatuses[:2])
	}
	cs := st.ContainerStatuses
	if st.Phase != v1.PodPending {
		t.Errorf("phase = %s, want Pending", st.Phase)
	}
	for i, want := range []string{
		`container has runAsNonRoot and image will run as root (pod: "p1_ns1(uid-1)", container: implicit-root)`,
		`container's runAsUser breaks non-root policy (pod: "p1_ns1(uid-1)", container: explicit-root)`,
	} {
		if got := cs[i].State.Waiting.Message; got != want {
			t.Errorf("container %s message = %q, want %q", cs[i].Name, got, want)
		}
	}
}

// TestRunAsNonRootNeedsIdentities: without ApplyIdentity (a kubelet that
// is not root) nothing is checked and everything runs as the caller.
func TestRunAsNonRootNeedsIdentities(t *testing.T) {
	c := shell("a", `test "$(id -u)" = 0`)
	p := pod(c)
	p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true), RunAsUser: testutil.Ptr[int64](1000)}
	p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](0)}
	h := start(t, p, VolumesMount, objects{})
	if st := h.waitDone(); st.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s (%+v), want Succeeded as the caller", st.Phase, st.ContainerStatuses)
	}
}

// fileInfo is a file's mode and owner on the host.
func fileInfo(t *testing.T, path string) (fs.FileMode, uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fi.Mode() & (fs.ModePerm | fs.ModeSetgid | fs.ModeDir), st.Uid, st.Gid
}

// TestFSGroupVolumes checks the volumes of a pod with an fsGroup as the
// container's user sees them and as the host holds them: an emptyDir is
// root:<fsGroup> 2777, a subPath directory inside it gets the same mode
// and group, configMap and secret files are the fsGroup's and group
// readable (a 0400 secret becomes 0440), and what the user creates in a
// volume belongs to the fsGroup.
func TestFSGroupVolumes(t *testing.T) {
	base := testutil.ReachableDir(t)
	ws, sub, cfg, sec := filepath.Join(base, "ws"), filepath.Join(base, "sub"), filepath.Join(base, "cfg"), filepath.Join(base, "sec")
	c := shell("main", `set -e
test "$(cat `+cfg+`/key)" = v
test "$(cat `+cfg+`/dir/nested)" = n
test "$(cat `+sec+`/pw)" = s3cret
echo hi > `+sub+`/file
mkdir `+ws+`/made
echo x > `+ws+`/made/f`)
	c.SecurityContext = &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1001)}
	c.VolumeMounts = []v1.VolumeMount{
		{Name: "shared", MountPath: ws},
		{Name: "shared", MountPath: sub, SubPath: "a/b"},
		{Name: "cfg", MountPath: cfg},
		{Name: "sec", MountPath: sec},
	}
	p := pod(c)
	p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: testutil.Ptr[int64](1000), RunAsGroup: testutil.Ptr[int64](1000), FSGroup: testutil.Ptr[int64](2000)}
	p.Spec.Volumes = []v1.Volume{
		{Name: "shared", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm"},
			Items:                []v1.KeyToPath{{Key: "key", Path: "key"}, {Key: "nested", Path: "dir/nested"}},
		}}},
		{Name: "sec", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec", DefaultMode: testutil.Ptr[int32](0o400)}}},
	}
	objs := objects{
		configMaps: map[string]*v1.ConfigMap{"cm": {Data: map[string]string{"key": "v", "nested": "n"}}},
		secrets:    map[string]*v1.Secret{"sec": {Data: map[string][]byte{"pw": []byte("s3cret")}}},
	}
	h := startAs(t, p, VolumesMount, objs, t.TempDir())
	if st := h.waitDone(); st.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s (%+v), want Succeeded", st.Phase, st.ContainerStatuses)
	}
	vols := filepath.Join(h.dir, "volumes")
	setgidDir := fs.ModeDir | fs.ModeSetgid
	for _, tc := range []struct {
		path     string
		mode     fs.FileMode
		uid, gid uint32
	}{
		{"shared", setgidDir | 0o777, 0, 2000},
		{"shared/a", setgidDir | 0o777, 0, 2000},
		{"shared/a/b", setgidDir | 0o777, 0, 2000},
		{"shared/a/b/file", 0o644, 1001, 2000},
		{"shared/made", setgidDir | 0o755, 1001, 2000},
		{"shared/made/f", 0o644, 1001, 2000},
		{"cfg", setgidDir | 0o755, 0, 2000},
		{"cfg/key", 0o644, 0, 2000},
		{"cfg/dir", setgidDir | 0o755, 0, 2000},
		{"cfg/dir/nested", 0o644, 0, 2000},
		{"sec/pw", 0o440, 0, 2000},
	} {
		mode, uid, gid := fileInfo(t, filepath.Join(vols, tc.path))
		if mode != tc.mode || uid != tc.uid || gid != tc.gid {
			t.Errorf("%s: mode %v owner %d:%d, want %v %d:%d", tc.path, mode, uid, gid, tc.mode, tc.uid, tc.gid)
		}
	}
}

// TestNoFSGroupVolumes is the control: without an fsGroup an emptyDir and
// its subPath directories are root's, 0777, whatever the umask, and a
// non-root user still writes in them.
func TestNoFSGroupVolumes(t *testing.T) {
	base := testutil.ReachableDir(t)
	sub := filepath.Join(base, "sub")
	c := shell("main", `echo hi > `+sub+`/file`)
	c.VolumeMounts = []v1.VolumeMount{{Name: "shared", MountPath: sub, SubPath: "a"}}
	p := pod(c)
	p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: testutil.Ptr[int64](1000), RunAsGroup: testutil.Ptr[int64](1000)}
	p.Spec.Volumes = []v1.Volume{{Name: "shared", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	h := startAs(t, p, VolumesMount, objects{}, t.TempDir())
	if st := h.waitDone(); st.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s (%+v), want Succeeded", st.Phase, st.ContainerStatuses)
	}
	for path, want := range map[string]fs.FileMode{"shared": fs.ModeDir | 0o777, "shared/a": fs.ModeDir | 0o777} {
		if mode, uid, gid := fileInfo(t, filepath.Join(h.dir, "volumes", path)); mode != want || uid != 0 || gid != 0 {
			t.Errorf("%s: mode %v owner %d:%d, want %v 0:0", path, mode, uid, gid, want)
		}
	}
	if _, uid, gid := fileInfo(t, filepath.Join(h.dir, "volumes", "shared", "a", "file")); uid != 1000 || gid != 1000 {
		t.Errorf("file owner %d:%d, want 1000:1000", uid, gid)
	}
}
