package podstatus

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC)

func testPod(init ...string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Generation: 2},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{Name: "a", Image: "busybox"}, {Name: "b", Image: "busybox:1"}},
		},
		Status: v1.PodStatus{QOSClass: v1.PodQOSGuaranteed, Phase: v1.PodPending},
	}
	for _, n := range init {
		p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: n, Image: "busybox"})
	}
	return p
}

func waiting(name, reason string) Container { return Container{Name: name, Reason: reason} }
func running(name string) Container {
	return Container{Name: name, State: Running, StartedAt: t0, ContainerID: "standin://1"}
}
func exited(name string, code int32) Container {
	reason := ReasonCompleted
	if code != 0 {
		reason = ReasonError
	}
	return Container{Name: name, State: Terminated, Terminated: &Termination{
		ExitCode: code, Reason: reason, StartedAt: t0, FinishedAt: t0.Add(time.Second)}}
}

func TestPhase(t *testing.T) {
	started := Snapshot{StartTime: t0, PodIP: "127.3.0.2", HostIP: "127.0.0.1"}
	with := func(s Snapshot, mod func(*Snapshot)) Snapshot { mod(&s); return s }
	tests := []struct {
		name string
		pod  *v1.Pod
		snap Snapshot
		want v1.PodPhase
	}{
		{"not admitted", testPod(), Snapshot{}, v1.PodPending},
		{"creating", testPod(), with(started, func(s *Snapshot) {
			s.Containers = []Container{waiting("a", ReasonContainerCreating), running("b")}
		}), v1.PodPending},
		{"image not mapped", testPod(), with(started, func(s *Snapshot) {
			s.Containers = []Container{waiting("a", ReasonErrImagePull), running("b")}
		}), v1.PodPending},
		{"initializing", testPod("i"), with(started, func(s *Snapshot) {
			s.Init = []Container{running("i")}
			s.Containers = []Container{waiting("a", ReasonPodInitializing), waiting("b", ReasonPodInitializing)}
		}), v1.PodPending},
		{"all running", testPod("i"), with(started, func(s *Snapshot) {
			s.Init = []Container{exited("i", 0)}
			s.Containers = []Container{running("a"), running("b")}
		}), v1.PodRunning},
		{"one exited, one running", testPod(), with(started, func(s *Snapshot) {
			s.Containers = []Container{exited("a", 0), running("b")}
		}), v1.PodRunning},
		{"backing off to restart", testPod(), with(started, func(s *Snapshot) {
			c := waiting("a", ReasonCrashLoopBackOff)
			c.Last = exited("a", 1).Terminated
			s.Containers = []Container{c, running("b")}
		}), v1.PodRunning},
		{"succeeded", testPod(), with(started, func(s *Snapshot) {
			s.Done = true
			s.Containers = []Container{exited("a", 0), exited("b", 0)}
		}), v1.PodSucceeded},
		{"one failed", testPod(), with(started, func(s *Snapshot) {
			s.Done = true
			s.Containers = []Container{exited("a", 0), exited("b", 3)}
		}), v1.PodFailed},
		{"init failed", testPod("i"), with(started, func(s *Snapshot) {
			s.Done = true
			s.Init = []Container{exited("i", 1)}
			s.Containers = []Container{waiting("a", ReasonPodInitializing), waiting("b", ReasonPodInitializing)}
		}), v1.PodFailed},
		{"killed while waiting", testPod(), with(started, func(s *Snapshot) {
			s.Done = true
			s.Containers = []Container{exited("a", 0), waiting("b", ReasonErrImagePull)}
		}), v1.PodFailed},
		{"deadline", testPod(), with(started, func(s *Snapshot) {
			s.Done, s.Failed = true, true
			s.Containers = []Container{exited("a", 0), exited("b", 0)}
		}), v1.PodFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Compute(tt.pod, tt.snap, t0).Phase; got != tt.want {
				t.Errorf("Compute().Phase = %s, want %s", got, tt.want)
			}
		})
	}
}

func condition(st v1.PodStatus, typ v1.PodConditionType) v1.PodCondition {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return v1.PodCondition{}
}

func TestComputeFields(t *testing.T) {
	pod := testPod("i")
	c := Container{Name: "b", State: Waiting, Reason: ReasonCrashLoopBackOff, RestartCount: 2, Last: exited("b", 137).Terminated}
	c.Last.Signal = 9
	snap := Snapshot{
		StartTime: t0, PodIP: "127.3.0.2", HostIP: "127.0.0.1",
		Init:       []Container{exited("i", 0)},
		Containers: []Container{running("a"), c},
	}
	st := Compute(pod, snap, t0)

	if st.QOSClass != v1.PodQOSGuaranteed {
		t.Errorf("QOSClass = %q, want it kept", st.QOSClass)
	}
	if st.ObservedGeneration != 2 {
		t.Errorf("ObservedGeneration = %d, want 2", st.ObservedGeneration)
	}
	if st.PodIP != "127.3.0.2" || len(st.PodIPs) != 1 || st.PodIPs[0].IP != "127.3.0.2" {
		t.Errorf("PodIP, PodIPs = %q, %v, want 127.3.0.2", st.PodIP, st.PodIPs)
	}
	if st.HostIP != "127.0.0.1" || len(st.HostIPs) != 1 {
		t.Errorf("HostIP, HostIPs = %q, %v, want 127.0.0.1", st.HostIP, st.HostIPs)
	}
	if st.StartTime == nil || !st.StartTime.Time.Equal(t0.Truncate(time.Second)) {
		t.Errorf("StartTime = %v, want %v to the second", st.StartTime, t0)
	}
	a, b := st.ContainerStatuses[0], st.ContainerStatuses[1]
	if a.State.Running == nil || !a.Ready || a.Started == nil || !*a.Started || a.Image != "busybox" {
		t.Errorf("container a = %+v, want running, ready, started", a)
	}
	if b.State.Waiting == nil || b.State.Waiting.Reason != ReasonCrashLoopBackOff || b.Ready || b.RestartCount != 2 {
		t.Errorf("container b = %+v, want waiting CrashLoopBackOff, restartCount 2", b)
	}
	if lt := b.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 137 || lt.Signal != 9 {
		t.Errorf("container b lastState = %+v, want terminated 137 by signal 9", b.LastTerminationState)
	}
	if got := st.InitContainerStatuses[0].State.Terminated; got == nil || got.Reason != ReasonCompleted {
		t.Errorf("init status = %+v, want terminated Completed", st.InitContainerStatuses[0].State)
	}
	if c := condition(st, v1.PodInitialized); c.Status != v1.ConditionTrue {
		t.Errorf("Initialized = %+v, want True", c)
	}
	if c := condition(st, v1.PodReady); c.Status != v1.ConditionFalse || c.Message != "containers with unready status: [b]" {
		t.Errorf("Ready = %+v, want False naming b", c)
	}
	if c := condition(st, v1.PodScheduled); c.Status != v1.ConditionTrue {
		t.Errorf("PodScheduled = %+v, want True", c)
	}
}

func TestConditionTransitionTimes(t *testing.T) {
	pod := testPod()
	snap := Snapshot{StartTime: t0, Containers: []Container{running("a"), running("b")}}
	first := Compute(pod, snap, t0)
	pod.Status = first

	later := t0.Add(time.Minute)
	same := Compute(pod, snap, later)
	if !equality.Semantic.DeepEqual(first, same) {
		t.Errorf("Compute() again with nothing changed = %+v, want %+v", same, first)
	}
	snap.Containers[1] = exited("b", 1)
	changed := Compute(pod, snap, later)
	if got := condition(changed, v1.PodReady).LastTransitionTime.Time; !got.Equal(later.Truncate(time.Second)) {
		t.Errorf("Ready transition time = %v, want %v", got, later)
	}
	if got := condition(changed, v1.PodScheduled).LastTransitionTime.Time; !got.Equal(t0.Truncate(time.Second)) {
		t.Errorf("PodScheduled transition time = %v, want unchanged %v", got, t0)
	}
	snap.Done = true
	done := Compute(pod, snap, later)
	if c := condition(done, v1.PodReady); c.Status != v1.ConditionFalse || c.Reason != "PodCompleted" {
		t.Errorf("Ready of a terminal pod = %+v, want False PodCompleted", c)
	}
	if done.ContainerStatuses[0].Ready {
		t.Error("container of a terminal pod reported ready")
	}
}

func TestLost(t *testing.T) {
	pod := testPod()
	start := metav1.NewTime(t0)
	pod.Status.Phase = v1.PodRunning
	pod.Status.StartTime = &start
	pod.Status.ContainerStatuses = []v1.ContainerStatus{
		{Name: "a", State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: start}}},
		{Name: "b", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: ReasonCompleted}}},
	}
	st := Lost(pod, t0.Add(time.Hour))
	if st.Phase != v1.PodFailed {
		t.Errorf("Lost().Phase = %s, want Failed", st.Phase)
	}
	a := st.ContainerStatuses[0].State.Terminated
	if a == nil || a.ExitCode != 137 || a.Reason != ReasonStatusUnknown {
		t.Errorf("lost running container = %+v, want terminated 137 %s", st.ContainerStatuses[0].State, ReasonStatusUnknown)
	}
	if b := st.ContainerStatuses[1].State.Terminated; b == nil || b.Reason != ReasonCompleted {
		t.Errorf("finished container = %+v, want its termination kept", st.ContainerStatuses[1].State)
	}
}
