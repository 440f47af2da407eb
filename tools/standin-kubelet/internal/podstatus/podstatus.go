// Package podstatus computes a Pod's status from what the stand-in kubelet
// knows about its processes. It is pure: no clocks, no I/O.
package podstatus

import (
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// State is where a container is in its life.
type State int

const (
	Waiting State = iota
	Running
	Terminated
)

// Termination is one ended run of a container.
type Termination struct {
	ExitCode    int32
	Signal      int32
	Reason      string // Completed, Error, ContainerStatusUnknown …
	Message     string
	StartedAt   time.Time
	FinishedAt  time.Time
	ContainerID string
}

// Container is the kubelet's record of one container.
type Container struct {
	Name  string
	State State
	// Reason and Message explain a Waiting state.
	Reason, Message string
	// StartedAt and ContainerID describe the current run (Running).
	StartedAt   time.Time
	ContainerID string
	// Terminated describes the current run once it ended (Terminated).
	Terminated *Termination
	// Last is the previous run, when the container was restarted or is
	// waiting to be.
	Last         *Termination
	RestartCount int32
}

// Snapshot is the kubelet's view of a pod at one instant.
type Snapshot struct {
	PodIP, HostIP string
	// StartTime is when the kubelet admitted the pod; zero before.
	StartTime  time.Time
	Init       []Container // in spec order
	Containers []Container // in spec order
	// Done means no container of the pod will run again: the pod is
	// terminal.
	Done bool
	// Reason and Message are the pod-level outcome, e.g. DeadlineExceeded.
	Reason, Message string
	// Failed forces a terminal pod to Failed (a deadline, a lost pod).
	Failed bool
}

// Reasons and messages the API and its clients know.
const (
	ReasonCompleted         = "Completed"
	ReasonError             = "Error"
	ReasonContainerCreating = "ContainerCreating"
	ReasonPodInitializing   = "PodInitializing"
	ReasonErrImagePull      = "ErrImagePull"
	ReasonCrashLoopBackOff  = "CrashLoopBackOff"
	ReasonConfigError       = "CreateContainerConfigError"
	ReasonStartError        = "StartError"
	ReasonDeadlineExceeded  = "DeadlineExceeded"
	ReasonStatusUnknown     = "ContainerStatusUnknown"
	reasonNotInitialized    = "ContainersNotInitialized"
	reasonNotReady          = "ContainersNotReady"
	reasonPodCompleted      = "PodCompleted"
	MessageDeadlineExceeded = "Pod was active on the node longer than the specified deadline"
	messageContainerUnknown = "The container could not be located when the pod was terminated"
)

// Compute returns pod's new status: old status fields the kubelet does not
// own (QoS class, nominated node, …) are kept, the rest comes from snap.
// now stamps conditions whose status changed.
func Compute(pod *v1.Pod, snap Snapshot, now time.Time) v1.PodStatus {
	st := *pod.Status.DeepCopy()
	st.ObservedGeneration = pod.Generation
	st.InitContainerStatuses = containerStatuses(pod.Spec.InitContainers, snap.Init, snap.Done)
	st.ContainerStatuses = containerStatuses(pod.Spec.Containers, snap.Containers, snap.Done)
	st.Phase = phase(pod, snap)
	st.Reason, st.Message = snap.Reason, snap.Message
	if snap.HostIP != "" {
		st.HostIP = snap.HostIP
		st.HostIPs = []v1.HostIP{{IP: snap.HostIP}}
	}
	if snap.PodIP != "" {
		st.PodIP = snap.PodIP
		st.PodIPs = []v1.PodIP{{IP: snap.PodIP}}
	}
	if !snap.StartTime.IsZero() && st.StartTime == nil {
		t := stamp(snap.StartTime)
		st.StartTime = &t
	}
	st.Conditions = conditions(pod, st, now)
	return st
}

func phase(pod *v1.Pod, snap Snapshot) v1.PodPhase {
	if snap.Done {
		if snap.Failed || !initialized(pod, snap) {
			return v1.PodFailed
		}
		for _, c := range snap.Containers {
			if c.State != Terminated || c.Terminated.ExitCode != 0 {
				return v1.PodFailed
			}
		}
		return v1.PodSucceeded
	}
	if snap.StartTime.IsZero() || !initialized(pod, snap) {
		return v1.PodPending
	}
	for _, c := range snap.Containers {
		// A container that never ran keeps the pod pending; one waiting
		// to be restarted counts as started.
		if c.State == Waiting && c.Last == nil {
			return v1.PodPending
		}
	}
	return v1.PodRunning
}

func initialized(pod *v1.Pod, snap Snapshot) bool {
	if len(snap.Init) < len(pod.Spec.InitContainers) {
		return false
	}
	for _, c := range snap.Init {
		if c.State != Terminated || c.Terminated.ExitCode != 0 {
			return false
		}
	}
	return true
}

func containerStatuses(spec []v1.Container, recs []Container, done bool) []v1.ContainerStatus {
	if len(spec) == 0 {
		return nil
	}
	byName := map[string]Container{}
	for _, r := range recs {
		byName[r.Name] = r
	}
	out := make([]v1.ContainerStatus, 0, len(spec))
	for _, c := range spec {
		r, ok := byName[c.Name]
		if !ok {
			r = Container{Name: c.Name, Reason: ReasonContainerCreating}
		}
		s := v1.ContainerStatus{
			Name:         c.Name,
			Image:        c.Image,
			ImageID:      "",
			RestartCount: r.RestartCount,
		}
		running := r.State == Running && !done
		s.Ready = running
		s.Started = &running
		switch r.State {
		case Waiting:
			s.State.Waiting = &v1.ContainerStateWaiting{Reason: r.Reason, Message: r.Message}
		case Running:
			s.ContainerID = r.ContainerID
			s.State.Running = &v1.ContainerStateRunning{StartedAt: stamp(r.StartedAt)}
		case Terminated:
			s.ContainerID = r.Terminated.ContainerID
			s.State.Terminated = terminated(r.Terminated)
		}
		if r.Last != nil {
			s.LastTerminationState.Terminated = terminated(r.Last)
		}
		out = append(out, s)
	}
	return out
}

func terminated(t *Termination) *v1.ContainerStateTerminated {
	return &v1.ContainerStateTerminated{
		ExitCode:    t.ExitCode,
		Signal:      t.Signal,
		Reason:      t.Reason,
		Message:     t.Message,
		StartedAt:   stamp(t.StartedAt),
		FinishedAt:  stamp(t.FinishedAt),
		ContainerID: t.ContainerID,
	}
}

// conditions returns PodScheduled, Initialized, ContainersReady and Ready,
// keeping any other condition and each unchanged condition's transition
// time.
func conditions(pod *v1.Pod, st v1.PodStatus, now time.Time) []v1.PodCondition {
	terminal := st.Phase == v1.PodSucceeded || st.Phase == v1.PodFailed
	want := []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}

	var notInit []string
	for i, c := range pod.Spec.InitContainers {
		if i >= len(st.InitContainerStatuses) || st.InitContainerStatuses[i].State.Terminated == nil ||
			st.InitContainerStatuses[i].State.Terminated.ExitCode != 0 {
			notInit = append(notInit, c.Name)
		}
	}
	init := v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue}
	if len(notInit) > 0 {
		init = v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionFalse, Reason: reasonNotInitialized,
			Message: fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(notInit, " "))}
	}
	want = append(want, init)

	var unready []string
	for _, c := range st.ContainerStatuses {
		if !c.Ready {
			unready = append(unready, c.Name)
		}
	}
	ready := v1.PodCondition{Status: v1.ConditionTrue}
	switch {
	case terminal:
		ready = v1.PodCondition{Status: v1.ConditionFalse, Reason: reasonPodCompleted}
	case len(unready) > 0:
		ready = v1.PodCondition{Status: v1.ConditionFalse, Reason: reasonNotReady,
			Message: fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))}
	}
	cr, r := ready, ready
	cr.Type, r.Type = v1.ContainersReady, v1.PodReady
	want = append(want, cr, r)

	out := slices.Clone(st.Conditions)
	for _, c := range want {
		i := slices.IndexFunc(out, func(o v1.PodCondition) bool { return o.Type == c.Type })
		if i < 0 {
			c.LastTransitionTime = stamp(now)
			out = append(out, c)
			continue
		}
		if out[i].Status == c.Status {
			c.LastTransitionTime = out[i].LastTransitionTime
		} else {
			c.LastTransitionTime = stamp(now)
		}
		c.LastProbeTime = out[i].LastProbeTime
		out[i] = c
	}
	return out
}

// Lost returns the status of a pod this node ran before the stand-in
// kubelet restarted: its processes are gone, so it failed.
func Lost(pod *v1.Pod, now time.Time) v1.PodStatus {
	snap := Snapshot{
		Done: true, Failed: true, Reason: "NodeRestarted",
		Message: "the stand-in kubelet restarted and lost the pod's processes",
	}
	if pod.Status.StartTime != nil {
		snap.StartTime = pod.Status.StartTime.Time
	}
	lost := func(statuses []v1.ContainerStatus) []Container {
		var out []Container
		for _, s := range statuses {
			c := Container{Name: s.Name, RestartCount: s.RestartCount}
			switch {
			case s.State.Terminated != nil:
				t := s.State.Terminated
				c.State = Terminated
				c.Terminated = &Termination{ExitCode: t.ExitCode, Signal: t.Signal, Reason: t.Reason, Message: t.Message,
					StartedAt: t.StartedAt.Time, FinishedAt: t.FinishedAt.Time, ContainerID: t.ContainerID}
			default:
				c.State = Terminated
				c.Terminated = &Termination{ExitCode: 137, Reason: ReasonStatusUnknown, Message: messageContainerUnknown,
					FinishedAt: now, ContainerID: s.ContainerID}
				if s.State.Running != nil {
					c.Terminated.StartedAt = s.State.Running.StartedAt.Time
				}
			}
			if t := s.LastTerminationState.Terminated; t != nil {
				c.Last = &Termination{ExitCode: t.ExitCode, Signal: t.Signal, Reason: t.Reason, Message: t.Message,
					StartedAt: t.StartedAt.Time, FinishedAt: t.FinishedAt.Time, ContainerID: t.ContainerID}
			}
			out = append(out, c)
		}
		return out
	}
	snap.Init = lost(pod.Status.InitContainerStatuses)
	snap.Containers = lost(pod.Status.ContainerStatuses)
	return Compute(pod, snap, now)
}

// stamp drops what a round trip through the API loses (sub-second
// precision, monotonic clock, zone), so that equal statuses compare equal.
func stamp(t time.Time) metav1.Time {
	if t.IsZero() {
		return metav1.Time{}
	}
	return metav1.NewTime(t.UTC().Truncate(time.Second).Round(0))
}
